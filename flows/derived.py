"""The derive, export and rescore flows: datasets from stored trees, TRL files from the derived
tables, and verifiers re-run over a stored run. Thin: each task runs a stage function of
dataengine.stages (datasets.derive_datasets, datasets.export_dataset, rescore.rescore_shard_at);
the rescore flow is the stage's driver (rescore.rescore) handed Prefect tasks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from dataengine.config import DERIVED_KINDS, DeriveConfig, EngineConfig, EvalConfig, RuntimeConfig
from dataengine.stages.rescore import RescoreExecutor, RescoreResult, rescore, rescore_shard_at
from flows.runtime import artifact_key, submit_shards

DERIVED = DERIVED_KINDS
EXPORTS = ("pairs", "sft", "replay")


def rows_markdown(title: str, rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = [f"# {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- derive


@task(name="derive", task_run_name="derive {run_ids}", tags=["dataengine"])
def derive_task(store: str, run_ids: list[str], out_run_id: str | None, kinds: list[str], derive: DeriveConfig,
                evaluation: EvalConfig | None = None) -> list[dict[str, Any]]:
    from dataengine.stages.datasets import derive_datasets

    results = derive_datasets(store, kinds, run_ids=run_ids, out_run_id=out_run_id, derive=derive, evaluation=evaluation)
    return [dataclasses.asdict(r) for r in results]


@flow(name="derive", log_prints=False)
def derive_flow(
    store: str = "runs/store",
    run_ids: list[str] | None = None,
    out_run_id: str | None = None,
    kinds: list[Literal["step-pairs", "trajectory-pairs", "sft", "recovery", "replay"]] | None = None,
    derive: DeriveConfig | None = None,
    evaluation: EvalConfig | None = None,
) -> list[dict[str, Any]]:
    """Derive step pairs, trajectory pairs, SFT, recovery splices and GRPO replay prompts from
    the trees of `run_ids` (None: every run, then give out_run_id), written to the store with
    lineage (source table versions). kinds None: all; derive None: DeriveConfig defaults;
    evaluation: the eval settings whose held-out tasks rows must not match (None: defaults)."""
    run_ids = list(run_ids or [])
    results = derive_task(store, run_ids, out_run_id, list(kinds or DERIVED), derive or DeriveConfig(), evaluation)
    create_markdown_artifact(
        key=artifact_key("derive", *(run_ids or ["all"])),
        markdown=rows_markdown(f"derive {', '.join(run_ids) or 'all runs'}", results,
                               ["kind", "table", "run_id", "rows", "version", "seconds"]),
    )
    return results


# ---------------------------------------------------------------------------- export


@task(name="export", task_run_name="export {kind}", tags=["dataengine"])
def export_task(store: str, kind: str, out: str, fmt: str, run_ids: list[str] | None, include_logprobs: bool = False,
                balance_by: str | None = None, decontaminate: bool = True,
                evaluation: EvalConfig | None = None) -> dict[str, Any]:
    """{kind, path, rows, dedup, decontaminated, source_versions}; path None and rows 0 when
    nothing was selected."""
    from dataengine.stages.datasets import export_dataset
    from storage.export import ExportFilters

    result = export_dataset(store, kind, out, fmt=fmt, filters=ExportFilters(run_ids=list(run_ids) if run_ids else None),
                            include_logprobs=include_logprobs, balance_by=balance_by, decontaminate=decontaminate,
                            evaluation=evaluation)
    if result is None:
        return {"kind": kind, "path": None, "rows": 0}
    return {"kind": kind, "path": result.path, "rows": result.rows, "dedup": result.dedup,
            "decontaminated": result.decontaminated, "source_versions": result.source_versions, "balance": result.balance}


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
    decontaminate: bool = True,
    evaluation: EvalConfig | None = None,
) -> dict[str, dict[str, Any]]:
    """Export the derived tables in TRL formats (pairs: preference, sft: messages, replay:
    prompt-only) to `out_dir/<kind>.parquet` (a file) or `out_dir/<kind>` (jsonl, hf: a dataset
    folder), each with its lineage; kinds None: all three; run_ids None: every run; balance_by: a
    task metadata field whose values get equal row counts by oversampling (storage.export), in the
    kinds of balance_kinds (None: every kind exported); decontaminate: refuse rows matching an
    eval-only item (evaluation's held-out tasks among them)."""
    kinds = list(kinds or EXPORTS)
    run_ids = list(run_ids or [])
    suffix = ".parquet" if format == "parquet" else ""
    futures = {k: export_task.submit(store, k, str(Path(out_dir) / f"{k}{suffix}"), format, list(run_ids) or None,
                                     include_logprobs and k == "pairs",
                                     balance_by if balance_kinds is None or k in balance_kinds else None,
                                     decontaminate, evaluation)
               for k in kinds}
    results = {k: f.result() for k, f in futures.items()}
    create_markdown_artifact(
        key=artifact_key("export", *(run_ids or ["all"])),
        markdown=rows_markdown(f"export to {out_dir}", list(results.values()), ["kind", "rows", "path"]),
    )
    return results


# ---------------------------------------------------------------------------- rescore


@task(name="rescore-shard", task_run_name="rescore {run_id} {shard_id}", tags=["dataengine"])
def rescore_shard(config: EngineConfig, run_id: str, shard_id: str, out_run_id: str, toolboxes: list[str]) -> RescoreResult:
    """The rescore stage's shard function (`rescore_shard_at`)."""
    return rescore_shard_at(config, run_id, shard_id, out_run_id, toolboxes)


def prefect_rescore_shards(runtime: RuntimeConfig) -> RescoreExecutor:
    """The rescore stage's executor on Prefect: one `rescore_shard` task per shard."""
    def execute(config: EngineConfig, store: Any, run_id: str, out_run_id: str, shard_ids: list[str],
                toolboxes: list[str]) -> list[RescoreResult]:
        return submit_shards(rescore_shard, runtime, [(config, run_id, s, out_run_id, toolboxes) for s in shard_ids])

    return execute


@flow(name="rescore", log_prints=False)
def rescore_flow(
    config: EngineConfig | None = None,
    run_id: str = "",
    out_run_id: str | None = None,
    runtime: RuntimeConfig | None = None,
) -> dict[str, Any]:
    """Re-run the verifiers (config.reward) over every trajectory of `run_id`, one task per
    shard, writing run `out_run_id` (default `<run_id>/rescore`); committed shards are skipped.
    The rescore stage's driver (`dataengine.stages.rescore.rescore`) with Prefect tasks."""
    config, runtime = config or EngineConfig(), runtime or RuntimeConfig()
    done = rescore(config, run_id, out_run_id, execute=prefect_rescore_shards(runtime))
    results = [dataclasses.asdict(r) for r in done.shards]
    create_markdown_artifact(
        key=artifact_key("rescore", run_id),
        markdown=rows_markdown(f"rescore {run_id} -> {done.run_id} (skipped {done.skipped} committed)",
                               results, ["shard_id", "trajectories", "changed", "successes_before", "successes_after"]),
    )
    return {"run_id": done.run_id, "shards": results, "skipped": done.skipped}
