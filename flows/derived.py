"""The derive, export and rescore flows: datasets from stored trees, TRL files from the
derived tables, and verifiers re-run over a stored run. Thin: the work is in
dataengine.derive, storage.export and dataengine.verifiers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from dataengine.config import DeriveConfig, EngineConfig
from flows.runtime import RuntimeConfig, artifact_key, env_for, shard_options

DERIVED = ("step-pairs", "trajectory-pairs", "sft", "recovery", "replay")
EXPORTS = ("pairs", "sft", "replay")


# ---------------------------------------------------------------------------- derive


def derive_work(store: str, run_ids: list[str], out_run_id: str | None, kinds: list[str], derive: DeriveConfig) -> list[dict[str, Any]]:
    """dataengine.derive.derive over `run_ids`; one dict per derived dataset (kind, table,
    run_id, shard_id, rows, version, source_versions, seconds)."""
    from dataengine.derive import DeriveOptions
    from dataengine.derive import derive as derive_datasets
    from storage import Store

    results = derive_datasets(Store(store, create=False), kinds, run_ids=run_ids, out_run_id=out_run_id,
                              options=DeriveOptions.from_config(derive))
    return [dataclasses.asdict(r) for r in results]


@task(name="derive", task_run_name="derive {run_ids}", tags=["dataengine"])
def derive_task(store: str, run_ids: list[str], out_run_id: str | None, kinds: list[str], derive: DeriveConfig) -> list[dict[str, Any]]:
    return derive_work(store, run_ids, out_run_id, kinds, derive)


def rows_markdown(title: str, rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = [f"# {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


@flow(name="derive", log_prints=False)
def derive_flow(
    store: str = "runs/store",
    run_ids: list[str] | None = None,
    out_run_id: str | None = None,
    kinds: list[Literal["step-pairs", "trajectory-pairs", "sft", "recovery", "replay"]] | None = None,
    derive: DeriveConfig | None = None,
) -> list[dict[str, Any]]:
    """Derive step pairs, trajectory pairs, SFT, recovery splices and GRPO replay prompts from
    the trees of `run_ids` (None: every run, then give out_run_id), written to the store with
    lineage (source table versions). kinds None: all; derive None: DeriveConfig defaults."""
    run_ids = list(run_ids or [])
    kinds = list(kinds or DERIVED)
    derive = derive or DeriveConfig()
    results = derive_task(store, run_ids, out_run_id, kinds, derive)
    create_markdown_artifact(
        key=artifact_key("derive", *(run_ids or ["all"])),
        markdown=rows_markdown(f"derive {', '.join(run_ids) or 'all runs'}", results,
                               ["kind", "table", "run_id", "rows", "version", "seconds"]),
    )
    return results


# ---------------------------------------------------------------------------- export


def export_work(store: str, kind: str, out: str, fmt: str, run_ids: list[str] | None, include_logprobs: bool = False) -> dict[str, Any]:
    """storage.export.export of `kind` restricted to `run_ids`; {kind, path, rows, ...} (path
    None and rows 0 when the table has no rows for those runs: nothing is written)."""
    from storage import Store
    from storage.export import ExportFilters, export

    s = Store(store, create=False)
    if not s.has_table(kind):
        return {"kind": kind, "path": None, "rows": 0}
    filters = ExportFilters(run_ids=list(run_ids) if run_ids else None)
    # An empty selection is not written: an empty file would fail the trainer later, less clearly.
    if _selected_rows(s, kind, run_ids) == 0:
        return {"kind": kind, "path": None, "rows": 0}
    result = export(s, kind, out, format=fmt, filters=filters, include_logprobs=include_logprobs)
    if result.rows == 0:
        return {"kind": kind, "path": None, "rows": 0}
    return {"kind": kind, "path": result.path, "rows": result.rows, "dedup": result.dedup,
            "source_versions": result.source_versions}


def _selected_rows(store: Any, kind: str, run_ids: list[str] | None) -> int:
    import polars as pl

    frame = store.scan(kind)
    if run_ids:
        frame = frame.filter(pl.col("run_id").is_in(list(run_ids)))
    return frame.select(pl.len()).collect().item()


@task(name="export", task_run_name="export {kind}", tags=["dataengine"])
def export_task(store: str, kind: str, out: str, fmt: str, run_ids: list[str] | None, include_logprobs: bool = False) -> dict[str, Any]:
    return export_work(store, kind, out, fmt, run_ids, include_logprobs)


@flow(name="export", log_prints=False)
def export_flow(
    store: str = "runs/store",
    out_dir: str = "runs/datasets",
    kinds: list[Literal["pairs", "sft", "replay"]] | None = None,
    run_ids: list[str] | None = None,
    format: Literal["parquet", "jsonl", "hf"] = "parquet",
    include_logprobs: bool = True,
) -> dict[str, dict[str, Any]]:
    """Export the derived tables in TRL formats (pairs: preference, sft: messages, replay:
    prompt-only) to `out_dir/<kind>.<format>`, each with its lineage file; kinds None: all
    three; run_ids None: every run."""
    kinds = list(kinds or EXPORTS)
    run_ids = list(run_ids or [])
    suffix = {"parquet": ".parquet", "jsonl": ".jsonl", "hf": ""}[format]
    futures = {k: export_task.submit(store, k, str(Path(out_dir) / f"{k}{suffix}"), format, list(run_ids) or None,
                                     include_logprobs and k == "pairs")
               for k in kinds}
    results = {k: f.result() for k, f in futures.items()}
    create_markdown_artifact(
        key=artifact_key("export", *(run_ids or ["all"])),
        markdown=rows_markdown(f"export to {out_dir}", list(results.values()), ["kind", "rows", "path"]),
    )
    return results


# ---------------------------------------------------------------------------- rescore


def rescore_shard_work(config: EngineConfig, run_id: str, shard_id: str, out_run_id: str) -> dict[str, Any]:
    """Replay every stored trajectory of one shard through a fresh ToolEnv and score it with
    the current verifiers; write the rows (new reward, success, verdicts) as the same shard of
    `out_run_id`. Returns {shard_id, trajectories, changed, successes_before, successes_after}."""
    import dataclasses as dc

    import polars as pl

    from dataengine.gold_demo import run_turns
    from dataengine.search import make_reward
    from dataengine.types import Task
    from storage import Store
    from storage.rows import verdict_structs

    store = Store(config.store, create=False)
    trajs = (store.trajectories().filter((pl.col("run_id") == run_id) & (pl.col("shard_id") == shard_id))
             .sort("traj_id").collect())
    if trajs.is_empty():
        return {"shard_id": shard_id, "trajectories": 0, "changed": 0, "successes_before": 0, "successes_after": 0}
    task_json = dict(store.tasks().filter(pl.col("run_id") == run_id).select("task_id", "task_json").unique("task_id")
                     .collect().iter_rows())
    missing = sorted(set(trajs["task_id"]) - set(task_json))
    if missing:
        raise ValueError(f"run {run_id!r} has trajectories of task(s) {', '.join(missing[:5])} but no tasks rows for them")
    tasks = [Task.model_validate_json(task_json[t]) for t in trajs["task_id"]]
    turns = [[m["content"] for m in json.loads(text) if m["role"] == "assistant"] for text in trajs["messages_json"]]
    env = env_for(config, sorted({t.toolbox for t in tasks}))
    reward = make_reward(config, env)
    finals = run_turns(env, tasks, turns)
    rows = trajs.drop("run_id", "shard_id", "verdicts", "reward", "success").to_dicts()
    changed = 0
    for row, state, before in zip(rows, finals, trajs.iter_rows(named=True)):
        if not state.terminal:
            # The search cut this episode (max depth or budget): score it as truncated, as it did.
            state = dc.replace(state, truncated=True)
        result = reward.score(state.episode())
        row.update(reward=result.reward, success=result.success, verdicts=verdict_structs(result.verdicts))
        changed += int(result.success != before["success"] or abs(result.reward - (before["reward"] or 0.0)) > 1e-9)
    store.append("trajectories", rows, run_id=out_run_id, shard_id=shard_id)
    return {"shard_id": shard_id, "trajectories": len(rows), "changed": changed,
            "successes_before": int(trajs["success"].fill_null(False).sum()),
            "successes_after": sum(bool(r["success"]) for r in rows), "verifier_versions": reward.versions()}


@task(name="rescore-shard", task_run_name="rescore {run_id} {shard_id}", tags=["dataengine"])
def rescore_shard(config: EngineConfig, run_id: str, shard_id: str, out_run_id: str) -> dict[str, Any]:
    return rescore_shard_work(config, run_id, shard_id, out_run_id)


@flow(name="rescore", log_prints=False)
def rescore_flow(
    config: EngineConfig | None = None,
    run_id: str = "",
    out_run_id: str | None = None,
    runtime: RuntimeConfig | None = None,
) -> dict[str, Any]:
    """Re-run the verifiers (config.reward) over every trajectory of `run_id`, one task per
    shard, writing run `out_run_id` (default `<run_id>/rescore`); committed shards are skipped."""
    import polars as pl

    from storage import Store

    if not run_id:
        raise ValueError("rescore needs the run_id of a stored run")
    config, runtime = config or EngineConfig(), runtime or RuntimeConfig()
    out_run_id = out_run_id or f"{run_id}/rescore"
    store = Store(config.store, create=False)
    shard_ids = sorted(store.trajectories().filter(pl.col("run_id") == run_id).select("shard_id").unique()
                       .collect()["shard_id"].to_list())
    if not shard_ids:
        raise ValueError(f"run {run_id!r} has no trajectories in {store.root}")
    done = store.committed_shards("trajectories", out_run_id)
    shard_task = rescore_shard.with_options(**shard_options(runtime))
    results = [f.result() for f in [shard_task.submit(config, run_id, s, out_run_id) for s in shard_ids if s not in done]]
    versions = next((r["verifier_versions"] for r in results if "verifier_versions" in r), {})
    store.record_run(out_run_id, kind="rescore", config={"engine": config.model_dump(mode="json"), "source_run": run_id},
                     verifier_versions=versions, seed=config.seed,
                     source_versions=store.table_versions())
    create_markdown_artifact(
        key=artifact_key("rescore", run_id),
        markdown=rows_markdown(f"rescore {run_id} -> {out_run_id} (skipped {len(shard_ids) - len(results)} committed)", results,
                               ["shard_id", "trajectories", "changed", "successes_before", "successes_after"]),
    )
    return {"run_id": out_run_id, "shards": results, "skipped": len(shard_ids) - len(results)}
