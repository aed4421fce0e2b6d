"""The derive, export and rescore flows: datasets from stored trees, TRL files from the derived
tables, and verifiers re-run over a stored run. Thin: each task runs a stage of
dataengine.stages (datasets.derive_datasets, datasets.export_dataset, rescore.rescore_shard)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from dataengine.config import DeriveConfig, EngineConfig
from flows.runtime import RuntimeConfig, artifact_key, shard_options

DERIVED = ("step-pairs", "trajectory-pairs", "sft", "recovery", "replay")
EXPORTS = ("pairs", "sft", "replay")


def rows_markdown(title: str, rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = [f"# {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- derive


@task(name="derive", task_run_name="derive {run_ids}", tags=["dataengine"])
def derive_task(store: str, run_ids: list[str], out_run_id: str | None, kinds: list[str], derive: DeriveConfig) -> list[dict[str, Any]]:
    from dataengine.stages.datasets import derive_datasets

    results = derive_datasets(store, kinds, run_ids=run_ids, out_run_id=out_run_id, derive=derive)
    return [dataclasses.asdict(r) for r in results]


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
    results = derive_task(store, run_ids, out_run_id, list(kinds or DERIVED), derive or DeriveConfig())
    create_markdown_artifact(
        key=artifact_key("derive", *(run_ids or ["all"])),
        markdown=rows_markdown(f"derive {', '.join(run_ids) or 'all runs'}", results,
                               ["kind", "table", "run_id", "rows", "version", "seconds"]),
    )
    return results


# ---------------------------------------------------------------------------- export


@task(name="export", task_run_name="export {kind}", tags=["dataengine"])
def export_task(store: str, kind: str, out: str, fmt: str, run_ids: list[str] | None, include_logprobs: bool = False,
                balance_by: str | None = None) -> dict[str, Any]:
    """{kind, path, rows, dedup, source_versions}; path None and rows 0 when nothing was selected."""
    from dataengine.stages.datasets import export_dataset
    from storage.export import ExportFilters

    result = export_dataset(store, kind, out, fmt=fmt, filters=ExportFilters(run_ids=list(run_ids) if run_ids else None),
                            include_logprobs=include_logprobs, balance_by=balance_by)
    if result is None:
        return {"kind": kind, "path": None, "rows": 0}
    return {"kind": kind, "path": result.path, "rows": result.rows, "dedup": result.dedup,
            "source_versions": result.source_versions, "balance": result.balance}


@flow(name="export", log_prints=False)
def export_flow(
    store: str = "runs/store",
    out_dir: str = "runs/datasets",
    kinds: list[Literal["pairs", "sft", "replay"]] | None = None,
    run_ids: list[str] | None = None,
    format: Literal["parquet", "jsonl", "hf"] = "parquet",
    include_logprobs: bool = True,
    balance_by: str | None = None,
    balance_kinds: list[Literal["pairs", "sft", "replay"]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Export the derived tables in TRL formats (pairs: preference, sft: messages, replay:
    prompt-only) to `out_dir/<kind>.parquet` (a file) or `out_dir/<kind>` (jsonl, hf: a dataset
    folder), each with its lineage; kinds None: all three; run_ids None: every run; balance_by: a
    task metadata field whose values get equal row counts by oversampling (storage.export), in the
    kinds of balance_kinds (None: every kind exported)."""
    kinds = list(kinds or EXPORTS)
    run_ids = list(run_ids or [])
    suffix = ".parquet" if format == "parquet" else ""
    futures = {k: export_task.submit(store, k, str(Path(out_dir) / f"{k}{suffix}"), format, list(run_ids) or None,
                                     include_logprobs and k == "pairs",
                                     balance_by if balance_kinds is None or k in balance_kinds else None)
               for k in kinds}
    results = {k: f.result() for k, f in futures.items()}
    create_markdown_artifact(
        key=artifact_key("export", *(run_ids or ["all"])),
        markdown=rows_markdown(f"export to {out_dir}", list(results.values()), ["kind", "rows", "path"]),
    )
    return results


# ---------------------------------------------------------------------------- rescore


@task(name="rescore-shard", task_run_name="rescore {run_id} {shard_id}", tags=["dataengine"])
def rescore_shard(config: EngineConfig, run_id: str, shard_id: str, out_run_id: str, toolboxes: list[str]) -> dict[str, Any]:
    from dataengine.stages.rescore import rescore_shard as run_stage
    from dataengine.stages.resources import shared_resources

    res = shared_resources(config, toolboxes, policy=False)
    return {**dataclasses.asdict(run_stage(res, run_id, shard_id, out_run_id)),
            "verifier_versions": res.reward.versions()}


@flow(name="rescore", log_prints=False)
def rescore_flow(
    config: EngineConfig | None = None,
    run_id: str = "",
    out_run_id: str | None = None,
    runtime: RuntimeConfig | None = None,
) -> dict[str, Any]:
    """Re-run the verifiers (config.reward) over every trajectory of `run_id`, one task per
    shard, writing run `out_run_id` (default `<run_id>/rescore`); committed shards are skipped."""
    from dataengine.stages.rescore import default_out_run, record_rescore_run, rescore_plan, run_toolboxes
    from dataengine.stages.resources import open_store

    config, runtime = config or EngineConfig(), runtime or RuntimeConfig()
    out_run_id = out_run_id or default_out_run(run_id)
    store = open_store(config.store, create=False)
    shard_ids, todo = rescore_plan(store, run_id, out_run_id)
    toolboxes = run_toolboxes(store, run_id)
    shard_task = rescore_shard.with_options(**shard_options(runtime))
    results = [f.result() for f in [shard_task.submit(config, run_id, s, out_run_id, toolboxes) for s in todo]]
    versions = next((r["verifier_versions"] for r in results), {})
    record_rescore_run(store, config, run_id, out_run_id, versions)
    create_markdown_artifact(
        key=artifact_key("rescore", run_id),
        markdown=rows_markdown(f"rescore {run_id} -> {out_run_id} (skipped {len(shard_ids) - len(results)} committed)",
                               results, ["shard_id", "trajectories", "changed", "successes_before", "successes_after"]),
    )
    return {"run_id": out_run_id, "shards": results, "skipped": len(shard_ids) - len(results)}
