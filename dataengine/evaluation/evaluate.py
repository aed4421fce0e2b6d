"""Evaluation of a policy on held-out tasks, written to the store's `evals` table.

Metrics (one `evals` row each, 95% intervals):
- greedy_success: share of tasks solved by the greedy episode (Wilson interval).
- axis/when, axis/which, axis/how, axis/final: per-axis pass rates of the greedy episodes over
  the tasks where the axis applies (verifiers.axes; Wilson).
- level/<n>: greedy success on the tasks of difficulty level n (task metadata `level`; Wilson).
- pass@k: unbiased estimator over n >= k sampled episodes per task (bootstrap over tasks);
  sample_success: mean success of single samples (pass@1 from the same samples).
- search_deployable_success: the episode a search without the gold returns (its tree is guided
  by format, execution and efficiency only; dataengine.evaluation.search), judged with the gold;
- search_success: the episode search returns at inference when its tree is guided by the
  verifier reward (oracle-guided); search_found: some episode in that tree succeeded (an upper bound: the tree's terminal
  rewards come from the verifiers, which know the gold answer).
- bfcl/<category>: BFCL's accuracy on the tasks of that category, from the greedy episodes
  (dataengine.evaluation.benchmarks; Wilson); details hold every prediction line and verdict.
- pass^1: tau2 tasks: share whose greedy episode gets tau2's reward 1 (Wilson).
Details of every row: settings, tokens and tool calls per solved task, per-task outcomes.
Episodes are played `config.batch_size` tasks at a time (memory grows with the batch).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dataengine.config import EvalConfig
from dataengine.env import ToolEnv
from dataengine.evaluation.rollout import Rollout, rollouts, run_summary
from dataengine.evaluation.stats import bootstrap_interval, pass_at_k, wilson_interval
from dataengine.policy.base import Policy
from dataengine.types import Task
from dataengine.verifiers import CompositeReward, axes

AXES = ("when", "which", "how", "final")


@dataclass
class Metric:
    """One evals row: metric name, value, 95% interval, number of tasks, details."""

    metric: str
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """One verified episode: its rollout, reward, success, verdict axes and counts."""

    rollout: Rollout
    reward: float
    success: bool
    axes: dict[str, bool | None]
    verdicts: list[Any]
    counts: dict[str, int]
    source: str


@dataclass
class EvalReport:
    """What `evaluate` measured: the metrics and every verified episode."""

    model_id: str
    suite: str
    split: str
    metrics: list[Metric]
    outcomes: list[Outcome]
    seconds: float

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.metric == name:
                return m
        raise KeyError(f"no metric {name!r}; measured: {', '.join(m.metric for m in self.metrics)}")

    def table(self) -> list[dict[str, Any]]:
        """Rows {metric, value, ci_low, ci_high, n} for printing."""
        return [{k: v for k, v in asdict(m).items() if k != "details"} for m in self.metrics]


def verify(rollouts_: Sequence[Rollout], reward: CompositeReward, source: str) -> list[Outcome]:
    """Score each episode with the composite reward; keep verdict axes and counts."""
    out = []
    for r in rollouts_:
        result = reward.score(r.state.episode())
        out.append(Outcome(r, float(result.reward), bool(result.success), axes(result.verdicts),
                           list(result.verdicts), run_summary(r), source))
    return out


def proportion(name: str, flags: Sequence[bool], details: dict[str, Any] | None = None) -> Metric:
    """A proportion metric with its Wilson interval."""
    n, s = len(flags), int(sum(bool(f) for f in flags))
    low, high = wilson_interval(s, n)
    return Metric(name, s / n if n else None, low, high, n, {"successes": s, **(details or {})})


def level_metrics(greedy: Sequence[Outcome]) -> list[Metric]:
    """Greedy success per difficulty level (task metadata `level`: the number of tool calls
    the task needs), `level/<n>`: which levels a round moved, and which none solves."""
    levels: dict[int, list[bool]] = {}
    for o in greedy:
        level = o.rollout.task.metadata.get("level")
        if level is not None:
            levels.setdefault(int(level), []).append(o.success)
    return [proportion(f"level/{lv}", flags, {"source": "greedy"}) for lv, flags in sorted(levels.items())]


def cost_details(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Generated tokens and tool calls, in total and per solved task."""
    solved = sum(o.success for o in outcomes)
    tokens = sum(o.counts["num_generated_tokens"] for o in outcomes)
    calls = sum(o.counts["num_tool_calls"] for o in outcomes)
    return {
        "generated_tokens": tokens,
        "tool_calls": calls,
        "tokens_per_solved": tokens / solved if solved else None,
        "tool_calls_per_solved": calls / solved if solved else None,
        "mean_steps": sum(o.counts["num_steps"] for o in outcomes) / max(1, len(outcomes)),
    }


def benchmark_metrics(greedy: Sequence[Outcome]) -> list[Metric]:
    """BFCL accuracy per category and tau2's pass^1 of the greedy episodes of external tasks."""
    from dataengine.evaluation.benchmarks import bfcl_score, tau2_pass1

    metrics = []
    by_category: dict[str, list[Outcome]] = {}
    for o in greedy:
        category = o.rollout.task.metadata.get("bfcl_category")
        if category is not None:
            by_category.setdefault(category, []).append(o)
    for category, outcomes in by_category.items():
        score = bfcl_score(category, [o.rollout.state.episode() for o in outcomes])
        low, high = wilson_interval(score["valid"], score["tasks"])
        metrics.append(Metric(f"bfcl/{category}", score["accuracy"], low, high, score["tasks"],
                              {k: v for k, v in score.items() if k != "accuracy"}))
    tau2 = [o for o in greedy if o.rollout.task.suite.startswith("tau2:")]
    if tau2:
        passed, n = tau2_pass1([o.verdicts for o in tau2])
        low, high = wilson_interval(passed, n)
        metrics.append(Metric("pass^1", passed / n, low, high, n,
                              {"passed": passed, "per_task": {o.rollout.task.id: any(v.name == "tau2" and v.passed for v in o.verdicts) for o in tau2}}))
    return metrics


Progress = Callable[[str, int, int, int], None]
"""(label, episodes done, episodes in all, generated tokens so far) after each batch."""


def play(policy: Policy, env: ToolEnv, tasks: Sequence[Task], *, n: int, temperature: float, top_p: float = 1.0,
         max_new_tokens: int, seed: int, batch_size: int, label: str = "greedy",
         progress: Progress | None = None) -> list[list[Rollout]]:
    """`rollouts` over `tasks` in batches of `batch_size` tasks (`[len(tasks)][n]`, the same
    episodes as one batch: a sample's seed does not depend on the other tasks)."""
    out: list[list[Rollout]] = []
    tokens = 0
    for start in range(0, len(tasks), batch_size):
        part = rollouts(policy, env, tasks[start : start + batch_size], n=n, temperature=temperature, top_p=top_p,
                        max_new_tokens=max_new_tokens, seed=seed)
        out += part
        tokens += sum(r.generated_tokens for per_task in part for r in per_task)
        if progress is not None:
            progress(label, len(out) * n, len(tasks) * n, tokens)
    return out


SearchFn = Callable[[list[Task]], list[tuple[Rollout | None, bool]]]
"""Search at inference: for each task, (the episode search returns or None, whether any episode
of its tree succeeded). See dataengine.evaluation.search."""


def evaluate(
    policy: Policy,
    env: ToolEnv,
    tasks: Sequence[Task],
    config: EvalConfig | None = None,
    *,
    reward: CompositeReward | None = None,
    search: SearchFn | None = None,
    deployable_search: SearchFn | None = None,
    suite: str | None = None,
    progress: Progress | None = None,
) -> EvalReport:
    """Greedy, pass@k and search-at-inference metrics of `policy` on `tasks`: `search` (oracle
    guided: search_success, search_found) and `deployable_search` (no gold in the search:
    search_deployable_success), each when given; `progress` is told after each batch."""
    config = config or EvalConfig()
    tasks = list(tasks)
    if not tasks:
        raise ValueError("evaluate needs at least one task")
    reward = reward or CompositeReward(replay=env.replay)
    suite = suite or ",".join(sorted({t.suite for t in tasks}))
    split = ",".join(sorted({t.split for t in tasks}))
    settings = config.model_dump(mode="json")
    start = time.perf_counter()
    metrics: list[Metric] = []
    outcomes: list[Outcome] = []
    if config.greedy:
        played = play(policy, env, tasks, n=1, temperature=0.0, max_new_tokens=config.max_new_tokens,
                      seed=config.seed, batch_size=config.batch_size, label="greedy", progress=progress)
        greedy = verify([r[0] for r in played], reward, "eval-greedy")
        outcomes += greedy
        per_task = {o.rollout.task.id: o.success for o in greedy}
        metrics.append(proportion("greedy_success", [o.success for o in greedy],
                                  {**cost_details(greedy), "settings": settings, "per_task": per_task}))
        for axis in AXES:
            flags = [o.axes[axis] for o in greedy if o.axes.get(axis) is not None]
            metrics.append(proportion(f"axis/{axis}", flags, {"source": "greedy"}))
        metrics += level_metrics(greedy)
        metrics += benchmark_metrics(greedy)
    if config.k:
        n = config.samples or config.k
        played = play(policy, env, tasks, n=n, temperature=config.temperature, top_p=config.top_p,
                      max_new_tokens=config.max_new_tokens, seed=config.seed, batch_size=config.batch_size,
                      label=f"{n} samples", progress=progress)
        sampled = [verify(per_task, reward, "eval-sample") for per_task in played]
        outcomes += [o for per_task in sampled for o in per_task]
        correct = [sum(o.success for o in per_task) for per_task in sampled]
        values = pass_at_k([n] * len(tasks), correct, config.k)
        low, high = bootstrap_interval(values, seed=config.seed)
        flat = [o for per_task in sampled for o in per_task]
        details = {**cost_details(flat), "samples": n, "settings": settings,
                   "per_task": {t.id: c for t, c in zip(tasks, correct)}, "ci": "bootstrap over tasks"}
        metrics.append(Metric(f"pass@{config.k}", sum(values) / len(values), low, high, len(tasks), details))
        singles = [c / n for c in correct]
        low, high = bootstrap_interval(singles, seed=config.seed)
        metrics.append(Metric("sample_success", sum(singles) / len(singles), low, high, len(tasks),
                              {"samples": n, "ci": "bootstrap over tasks"}))
    if search is not None:
        found = search(tasks)
        if len(found) != len(tasks):
            raise ValueError(f"search returned {len(found)} results for {len(tasks)} tasks")
        chosen = verify([r for r, _ in found if r is not None], reward, "eval-search")
        outcomes += chosen
        by_task = {o.rollout.task.id: o.success for o in chosen}
        flags = [by_task.get(t.id, False) for t in tasks]
        metrics.append(proportion("search_success", flags, {**cost_details(chosen), "per_task": by_task}))
        metrics.append(proportion("search_found", [f for _, f in found], {"oracle": "terminal rewards use the gold"}))
    if deployable_search is not None:
        found = deployable_search(tasks)
        chosen = verify([r for r, _ in found if r is not None], reward, "eval-search-deployable")
        outcomes += chosen
        by_task = {o.rollout.task.id: o.success for o in chosen}
        metrics.append(proportion("search_deployable_success", [by_task.get(t.id, False) for t in tasks],
                                  {**cost_details(chosen), "per_task": by_task, "selection": "no gold in the search"}))
    return EvalReport(getattr(policy, "model_id", "model"), suite, split, metrics, outcomes,
                      time.perf_counter() - start)


def trajectory_rows(report: EvalReport) -> list[dict[str, Any]]:
    """`trajectories` table rows of every evaluated episode (source eval-greedy/-sample/-search)."""
    from storage.dedup import trajectory_hash
    from storage.rows import verdict_structs

    rows = []
    for o in report.outcomes:
        r = o.rollout
        messages = [m.to_chat() for m in r.state.messages]
        rows.append({
            "task_id": r.task.id,
            "suite": r.task.suite,
            "split": r.task.split,
            "traj_id": f"{o.source}/{r.task.id}/{r.sample_index}",
            "source": o.source,
            "messages_json": json.dumps(messages, sort_keys=True, ensure_ascii=False),
            "final_answer": r.state.episode().final_answer,
            "reward": o.reward,
            "success": o.success,
            "num_steps": o.counts["num_steps"],
            "num_tool_calls": o.counts["num_tool_calls"],
            "num_generated_tokens": o.counts["num_generated_tokens"],
            "verdicts": verdict_structs(o.verdicts),
            "model_id": report.model_id,
            "traj_hash": trajectory_hash(messages),
            "turn": r.state.turn,
        })
    return rows


def write_report(store: Any, report: EvalReport, *, run_id: str, config: dict[str, Any] | None = None,
                 trajectories: bool = True) -> int:
    """Append the report's metrics to `evals` (and its episodes to `trajectories`) as shard
    "<model_id>/<suite>/<split>" of `run_id`, plus a `runs` row (kind "evaluate"); return the
    evals table version."""
    shard = f"{report.model_id}/{report.suite}/{report.split}"
    if trajectories and report.outcomes:
        # Hidden until the evals rows commit: a killed evaluation leaves no half shard behind.
        store.append("trajectories", trajectory_rows(report), run_id=run_id, shard_id=shard, marker="evals")
    rows = [{
        "model_id": report.model_id,
        "suite": report.suite,
        "split": report.split,
        "metric": m.metric,
        "value": m.value,
        "ci_low": m.ci_low,
        "ci_high": m.ci_high,
        "n": m.n,
        "details_json": json.dumps(m.details, sort_keys=True, default=str),
    } for m in report.metrics]
    version = store.append("evals", rows, run_id=run_id, shard_id=shard)
    store.record_run(run_id, kind="evaluate", config=config or {}, model_id=report.model_id, shard_id=shard)
    return version
