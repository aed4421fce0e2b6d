"""The evaluate stage: one suite's held-out tasks, the policy's greedy success, pass@k and
(optionally) search at inference, with config.reward's verifiers, written to the `evals` table
as shard "<model_id>/<suite>/heldout" of a run (skipped when that shard is committed).
`evaluate` is the one driver over config.suites (`dataengine eval` and the evaluate flow differ
only in the executor)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from dataengine.config import EngineConfig
from dataengine.stages.resources import Resources


def heldout_tasks(config: EngineConfig, suite: str) -> list[Any]:
    """config.eval.num_tasks held-out tasks of `suite`, drawn with config.eval.seed (an eval-only
    set: its first num_tasks tasks; tau2 opens with the agent's greeting, for the user simulator)."""
    from dataengine.suites.catalog import suite_tasks

    return suite_tasks(suite, config.eval.num_tasks, split="heldout", seed=config.eval.seed, user="simulated")


def eval_suites(config: EngineConfig) -> list[str]:
    """The suites evaluated: config.eval.suites, else config.suites."""
    return list(config.eval.suites or config.suites)


def simulated_user_env(resources: Resources, tasks: list[Any]) -> tuple[Any, list[Any]]:
    """(env, tasks) for tasks that open with the agent's greeting (tau2, user "simulated"): a
    ToolEnv whose next user turns come from a UserSimulator played by the evaluated policy (tau2's
    guidelines and the task's user scenario; config.eval.max_new_tokens per message), the tasks
    with the user's first message added.
    Other tasks: resources.env and the tasks as they are."""
    from dataengine.env import ToolEnv
    from dataengine.policy.user import UserSimulator

    if not any(t.metadata.get("user_instructions") and t.messages and t.messages[-1].role == "assistant" for t in tasks):
        return resources.env, tasks
    e = resources.config.eval
    sim = UserSimulator(resources.policy, max_new_tokens=e.max_new_tokens, seed=e.seed)
    env = ToolEnv(resources.env.sandbox, max_steps=resources.env.max_steps, next_user_turn=sim)
    return env, [sim.start(t) for t in tasks]


def batch_progress(suite: str) -> Callable[[str, int, int, int], None]:
    """A progress line on stderr after each batch of episodes: done/total, tokens, rate and ETA."""
    import sys
    import time

    started = time.perf_counter()

    def report(label: str, done: int, total: int, tokens: int) -> None:
        elapsed = time.perf_counter() - started
        eta = f"{elapsed / done * (total - done):.0f} s" if done else "?"
        print(f"eval {suite} {label}: {done}/{total} episodes, {tokens} tokens "
              f"({tokens / elapsed if elapsed > 0 else 0.0:.1f} tok/s), {elapsed:.0f} s elapsed, ETA {eta}",
              file=sys.stderr, flush=True)

    return report


def check_not_trained_on(model: str, tasks: list[Any]) -> None:
    """Refuse held-out tasks whose question is in the training data of `model`'s lineage (a
    checkpoint folder records the questions it and its parents were trained on)."""
    from dataengine.train.checkpoint import question_key, trained_questions

    seen = trained_questions(model)
    if not seen:
        return
    questions = {t.id: next((m.content for m in t.messages if m.role == "user"), "") for t in tasks}
    leaked = [t for t in tasks if question_key(questions[t.id]) in seen]
    if leaked:
        raise ValueError(
            f"{len(leaked)} of {len(tasks)} held-out {leaked[0].suite} task(s) appear in the training data of "
            f"checkpoint {model} or its parents (e.g. {leaked[0].id}: {questions[leaked[0].id][:60]!r}); "
            "evaluate on other tasks (another eval.seed) or a model that never saw them")


def search_config(config: EngineConfig) -> EngineConfig:
    """The engine config search at inference runs with: config.eval's simulations and actions."""
    e = config.eval
    return config.model_copy(update={"search": config.search.model_copy(
        update={"num_simulations": e.search_simulations, "num_actions": e.search_actions})})


def evaluate_suite(resources: Resources, suite: str, run_id: str, *, tasks: list[Any] | None = None) -> dict[str, Any]:
    """Evaluate resources.policy on `suite` (tasks: default `heldout_tasks`); returns {suite,
    model_id, metrics: {name: (value, ci_low, ci_high)}, n, seconds, skipped, version, bfcl:
    {category: {tasks, valid, predictions, verdicts}} (BFCL suites; else empty)}."""
    import json

    import polars as pl

    from dataengine.evaluation import evaluate, write_report
    from dataengine.evaluation.search import search_at_inference

    config, store = resources.config, resources.store
    tasks = tasks if tasks is not None else heldout_tasks(config, suite)
    check_not_trained_on(config.policy.model, tasks)
    policy = resources.policy
    shard = f"{policy.model_id}/{suite}/heldout"
    if shard in store.committed_shards("evals", run_id):
        rows = store.evals().filter((pl.col("run_id") == run_id) & (pl.col("shard_id") == shard)).collect()
        return {"suite": suite, "model_id": policy.model_id, "skipped": True, "seconds": 0.0, "version": None,
                "metrics": {r["metric"]: (r["value"], r["ci_low"], r["ci_high"]) for r in rows.iter_rows(named=True)},
                "n": {r["metric"]: r["n"] for r in rows.iter_rows(named=True)},
                "bfcl": {r["metric"].split("/", 1)[1]: json.loads(r["details_json"])
                         for r in rows.iter_rows(named=True) if r["metric"].startswith("bfcl/")}}
    env, tasks = simulated_user_env(resources, tasks)
    finders = {}
    if config.eval.search:
        finders = {name: search_at_inference(policy, env, search_config(config), reward=resources.reward,
                                             seed=config.eval.seed, selection=selection)
                   for name, selection in (("search", "oracle"), ("deployable_search", "deployable"))}
    report = evaluate(policy, env, tasks, config.eval, reward=resources.reward, suite=suite,
                      progress=batch_progress(suite), **finders)
    version = write_report(store, report, run_id=run_id, config={"engine": config.model_dump(mode="json")})
    return {"suite": suite, "model_id": report.model_id, "skipped": False, "seconds": report.seconds,
            "version": version, "metrics": {m.metric: (m.value, m.ci_low, m.ci_high) for m in report.metrics},
            "n": {m.metric: m.n for m in report.metrics},
            "bfcl": {m.metric.split("/", 1)[1]: m.details for m in report.metrics if m.metric.startswith("bfcl/")}}


def evaluate_suite_at(config: EngineConfig, suite: str, run_id: str, *,
                      slot: Callable[[], AbstractContextManager[Any]] = nullcontext) -> dict[str, Any]:
    """`evaluate_suite` with the policy and sandbox this process keeps (`shared_resources`),
    inside `slot()` (the flows' accelerator slot): what one flow task runs."""
    from dataengine.stages.resources import shared_resources

    tasks = heldout_tasks(config, suite)
    with slot():
        return evaluate_suite(shared_resources(config, sorted({t.toolbox for t in tasks})), suite, run_id, tasks=tasks)


def default_eval_run(config: EngineConfig, suite: str) -> str:
    """The run id of `dataengine eval` without --run-id: eval-<suite>-<eval.seed>."""
    return f"eval-{suite}-{config.eval.seed}"


# A suite executor: (config, [(suite, run id, held-out tasks)]) -> one result per suite, in order;
# `in_process` for the CLI, Prefect tasks in flows/.
EvaluateExecutor = Callable[[EngineConfig, list[tuple[str, str, list[Any]]]], list[dict[str, Any]]]


def in_process(config: EngineConfig, suites: list[tuple[str, str, list[Any]]]) -> list[dict[str, Any]]:
    """The serial executor: every suite in this process with one policy and one sandbox."""
    toolboxes = sorted({t.toolbox for _, _, tasks in suites for t in tasks})
    with Resources.open(config, toolboxes) as res:
        return [evaluate_suite(res, suite, run_id, tasks=tasks) for suite, run_id, tasks in suites]


def evaluate(config: EngineConfig, run_id: str | None = None, *,
             execute: EvaluateExecutor = in_process) -> list[dict[str, Any]]:
    """Every suite of `eval_suites(config)` on its held-out tasks (`heldout_tasks`, drawn and
    checked before any model loads), through `execute` (`dataengine eval`: in this process; the
    evaluate flow: one Prefect task per suite). run_id None: `default_eval_run` per suite.
    Returns one `evaluate_suite` result per suite, in that order."""
    suites = [(s, run_id or default_eval_run(config, s), heldout_tasks(config, s)) for s in eval_suites(config)]
    return execute(config, suites)
