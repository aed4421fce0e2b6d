"""The rescore stage: replay a stored run's trajectories through a fresh ToolEnv and score them
with the current verifiers (config.reward), written as a new run, shard by shard.

Use it after a verifier changes (a new version in every Verdict) to re-label a store written
under the old rule; derive then builds pairs and SFT rows from the rescored run. `rescore` is
the one driver (`dataengine rescore` and the rescore flow differ only in the executor).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dataengine.config import EngineConfig
from dataengine.stages.resources import Resources


@dataclass
class RescoreResult:
    """One rescored shard: trajectories, how many changed verdict or reward, successes before
    and after."""

    shard_id: str
    trajectories: int = 0
    changed: int = 0
    successes_before: int = 0
    successes_after: int = 0
    skipped: bool = False


def default_out_run(run_id: str) -> str:
    return f"{run_id}/rescore"


def rescore_plan(store: Any, run_id: str, out_run_id: str) -> tuple[list[str], list[str]]:
    """(every shard id of `run_id`'s trajectories, those not yet rescored into `out_run_id`)."""
    import polars as pl

    if not run_id:
        raise ValueError("rescore needs the run id of a stored run (--run)")
    shard_ids = sorted(store.trajectories().filter(pl.col("run_id") == run_id).select("shard_id").unique()
                       .collect()["shard_id"].to_list())
    if not shard_ids:
        raise ValueError(f"run {run_id!r} has no trajectories in {store.root}")
    done = store.committed_shards("trajectories", out_run_id)
    return shard_ids, [s for s in shard_ids if s not in done]


def run_toolboxes(store: Any, run_id: str) -> list[str]:
    """The toolboxes of a stored run's tasks (what the sandbox must preload)."""
    import polars as pl

    from dataengine.types import Task

    texts = store.tasks().filter(pl.col("run_id") == run_id).select("task_json").collect()["task_json"]
    return sorted({Task.model_validate_json(t).toolbox for t in texts})


def rescore_shard(resources: Resources, run_id: str, shard_id: str, out_run_id: str) -> RescoreResult:
    """Replay and re-score every trajectory of one shard of `run_id`; write them (new reward,
    success, verdicts) as the same shard of `out_run_id`."""
    import polars as pl

    from dataengine.gold_demo import run_turns
    from dataengine.types import Task
    from storage.rows import verdict_structs

    store = resources.store
    if shard_id in store.committed_shards("trajectories", out_run_id):
        return RescoreResult(shard_id, skipped=True)
    trajs = (store.trajectories().filter((pl.col("run_id") == run_id) & (pl.col("shard_id") == shard_id))
             .sort("traj_id").collect())
    if trajs.is_empty():
        return RescoreResult(shard_id)
    task_json = dict(store.tasks().filter(pl.col("run_id") == run_id).select("task_id", "task_json").unique("task_id")
                     .collect().iter_rows())
    missing = sorted(set(trajs["task_id"]) - set(task_json))
    if missing:
        raise ValueError(f"run {run_id!r} has trajectories of task(s) {', '.join(missing[:5])} but no tasks rows for them")
    tasks = [Task.model_validate_json(task_json[t]) for t in trajs["task_id"]]
    turns = [[m["content"] for m in json.loads(text) if m["role"] == "assistant"] for text in trajs["messages_json"]]
    finals = run_turns(resources.env, tasks, turns)
    rows = trajs.drop("run_id", "shard_id", "verdicts", "reward", "success").to_dicts()
    changed = 0
    # run_turns marks an episode the search cut (max depth or budget) truncated, as it was scored.
    for row, state, before in zip(rows, finals, trajs.iter_rows(named=True)):
        result = resources.reward.score(state.episode())
        row.update(reward=result.reward, success=result.success, verdicts=verdict_structs(result.verdicts))
        changed += int(result.success != before["success"] or abs(result.reward - (before["reward"] or 0.0)) > 1e-9)
    store.append("trajectories", rows, run_id=out_run_id, shard_id=shard_id)
    return RescoreResult(shard_id, trajectories=len(rows), changed=changed,
                         successes_before=int(trajs["success"].fill_null(False).sum()),
                         successes_after=sum(bool(r["success"]) for r in rows))


def rescore_shard_at(config: EngineConfig, run_id: str, shard_id: str, out_run_id: str,
                     toolboxes: list[str]) -> RescoreResult:
    """`rescore_shard` with the sandbox this process keeps (`shared_resources`, no model):
    what one flow task runs."""
    from dataengine.stages.resources import shared_resources

    return rescore_shard(shared_resources(config, toolboxes, policy=False), run_id, shard_id, out_run_id)


def record_rescore_run(store: Any, config: EngineConfig, run_id: str, out_run_id: str,
                       verifier_versions: dict[str, str]) -> None:
    """The rescored run's lineage row (source run, config, verifier versions)."""
    store.record_run(out_run_id, kind="rescore", config={"engine": config.model_dump(mode="json"), "source_run": run_id},
                     verifier_versions=verifier_versions, seed=config.seed, source_versions=store.table_versions())


@dataclass
class RescoreRun:
    """One call of the rescore stage: the rescored run, the shards rescored in this call (in
    order), and how many were committed by an earlier call."""

    run_id: str
    shards: list[RescoreResult] = field(default_factory=list)
    skipped: int = 0


# A shard executor: (config, store, source run, rescored run, shard ids, toolboxes) -> results
# in order; `in_process` for the CLI, Prefect tasks in flows/.
RescoreExecutor = Callable[[EngineConfig, Any, str, str, list[str], list[str]], list[RescoreResult]]


def in_process(config: EngineConfig, store: Any, run_id: str, out_run_id: str, shard_ids: list[str],
               toolboxes: list[str]) -> list[RescoreResult]:
    """The serial executor: the shards one after another in this process, one sandbox."""
    with Resources.open(config, toolboxes, store=store) as res:
        return [rescore_shard(res, run_id, shard_id, out_run_id) for shard_id in shard_ids]


def rescore(config: EngineConfig, run_id: str, out_run_id: str | None = None, *,
            execute: RescoreExecutor = in_process) -> RescoreRun:
    """Every shard of `run_id` not yet rescored into `out_run_id` (default `<run_id>/rescore`),
    through `execute` (`dataengine rescore`: in this process; the rescore flow: Prefect tasks).
    The one driver of the stage: the run's lineage row, with config.reward's verifier versions,
    is recorded before the first shard is written, and only when there is a shard to write, so
    a rerun with nothing left leaves the row as it was."""
    from dataengine.stages.resources import open_store, verifier_versions

    out_run_id = out_run_id or default_out_run(run_id)
    store = open_store(config.store, create=False)
    shard_ids, todo = rescore_plan(store, run_id, out_run_id)
    if not todo:
        return RescoreRun(out_run_id, skipped=len(shard_ids))
    record_rescore_run(store, config, run_id, out_run_id, verifier_versions(config))
    results = execute(config, store, run_id, out_run_id, todo, run_toolboxes(store, run_id))
    return RescoreRun(out_run_id, results, skipped=len(shard_ids) - sum(not r.skipped for r in results))
