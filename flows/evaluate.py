"""The evaluate flow: greedy success (and pass@k) of a model on held-out tasks of each suite,
one Prefect task per suite, written to the store's evals table. Thin: the work is
dataengine.evaluation."""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from dataengine.config import EngineConfig
from flows.runtime import (
    RuntimeConfig,
    accelerator_slot,
    artifact_key,
    ensure_accelerator_limit,
    env_for,
    make_task_runner,
    policy_for,
    shard_options,
)


def evaluate_work(config: EngineConfig, suite: str, num_tasks: int, run_id: str, k: int = 0) -> dict[str, Any]:
    """Evaluate config.policy on `num_tasks` held-out tasks of `suite` (seed config.seed) and
    write the metrics (and episodes) as one shard of `run_id`. Skipped when that shard is
    already in the store. Returns {suite, model_id, metrics: {name: (value, ci_low, ci_high)}, skipped}."""
    import json

    import polars as pl

    from dataengine.evaluation import EvalConfig, evaluate, write_report
    from dataengine.search import make_reward
    from dataengine.suites import generate_suite
    from storage import Store

    store = Store(config.store)
    tasks = generate_suite(suite, n_train=0, n_heldout=num_tasks, seed=config.seed)
    with accelerator_slot():
        policy = policy_for(config)
        shard = f"{policy.model_id}/{suite}/heldout"
        if shard in store.committed_shards("evals", run_id):
            rows = store.evals().filter((pl.col("run_id") == run_id) & (pl.col("shard_id") == shard)).collect()
            return {"suite": suite, "model_id": policy.model_id, "skipped": True,
                    "metrics": {r["metric"]: (r["value"], r["ci_low"], r["ci_high"]) for r in rows.iter_rows(named=True)}}
        env = env_for(config, sorted({t.toolbox for t in tasks}))
        settings = EvalConfig(k=k, max_new_tokens=config.policy.max_new_tokens, seed=config.seed)
        report = evaluate(policy, env, tasks, settings, reward=make_reward(config, env), suite=suite)
    write_report(store, report, run_id=run_id, config={"engine": json.loads(config.model_dump_json()), "k": k})
    return {"suite": suite, "model_id": report.model_id, "skipped": False, "seconds": report.seconds,
            "metrics": {m.metric: (m.value, m.ci_low, m.ci_high) for m in report.metrics}}


@task(name="evaluate-suite", task_run_name="evaluate {suite} ({run_id})", tags=["dataengine", "accelerator"])
def evaluate_suite(config: EngineConfig, suite: str, num_tasks: int, run_id: str, k: int = 0) -> dict[str, Any]:
    return evaluate_work(config, suite, num_tasks, run_id, k)


def evaluation_markdown(run_id: str, results: list[dict[str, Any]]) -> str:
    lines = [f"# evaluate `{run_id}`", "", "| suite | model | metric | value | 95% CI |", "|---|---|---|---|---|"]
    for r in results:
        for name, (value, low, high) in sorted(r["metrics"].items()):
            ci = f"[{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
            shown = f"{value:.3f}" if value is not None else "n/a"
            lines.append(f"| {r['suite']} | `{r['model_id']}` | {name} | {shown} | {ci} |")
    return "\n".join(lines)


@flow(name="evaluate", log_prints=False)
def evaluate_flow(
    config: EngineConfig | None = None,
    num_tasks: int = 8,
    run_id: str = "evaluate",
    k: int = 0,
    runtime: RuntimeConfig | None = None,
) -> list[dict[str, Any]]:
    """Evaluate config.policy.model on `num_tasks` held-out tasks of every suite in config.suites."""
    config, runtime = config or EngineConfig(), runtime or RuntimeConfig()
    ensure_accelerator_limit(runtime.accelerator_slots)
    suite_task = evaluate_suite.with_options(**shard_options(runtime))
    results = [f.result() for f in [suite_task.submit(config, s, num_tasks, run_id, k) for s in config.suites]]
    create_markdown_artifact(key=artifact_key("evaluate", run_id), markdown=evaluation_markdown(run_id, results))
    return results


def run_evaluate(config: EngineConfig, num_tasks: int, run_id: str, k: int = 0, runtime: RuntimeConfig | None = None) -> list[dict[str, Any]]:
    runtime = runtime or RuntimeConfig()
    return evaluate_flow.with_options(task_runner=make_task_runner(runtime))(
        config=config, num_tasks=num_tasks, run_id=run_id, k=k, runtime=runtime)
