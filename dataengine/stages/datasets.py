"""The derive and export stages: datasets from the stored trees (dataengine.derive), and TRL
files from the derived tables (storage.export)."""

from __future__ import annotations

from typing import Any

from dataengine.config import DeriveConfig, EvalConfig


def derive_datasets(store: Any, kinds: list[str], *, run_ids: list[str] | None = None, out_run_id: str | None = None,
                    derive: DeriveConfig | None = None, evaluation: EvalConfig | None = None,
                    **overrides: Any) -> list[Any]:
    """Derive `kinds` (step-pairs, trajectory-pairs, sft, recovery, replay) from `run_ids` (None:
    every run; then give out_run_id) with config.derive's settings, `overrides` (None: keep) on
    top; written to the store with lineage. Rows matching an eval-only item are refused (held-out
    tasks at config.eval's seed and size among them; dataengine.derive.decontam.index_for).
    Returns one DeriveResult per dataset."""
    from dataengine.derive import DeriveOptions
    from dataengine.derive import derive as derive_rows
    from dataengine.derive.decontam import index_for
    from dataengine.stages.resources import open_store

    options = DeriveOptions.from_config(derive or DeriveConfig(), **overrides)
    index = index_for(evaluation) if options.decontaminate else None
    return derive_rows(open_store(store, create=False), list(kinds), run_ids=list(run_ids or []) or None,
                       out_run_id=out_run_id, options=options, eval_index=index)


def selected_rows(store: Any, kind: str, run_ids: list[str] | None) -> int:
    """Rows of table `kind` in `run_ids` (None: all)."""
    import polars as pl

    if not store.has_table(kind):
        return 0
    frame = store.scan(kind)
    if run_ids:
        frame = frame.filter(pl.col("run_id").is_in(list(run_ids)))
    return frame.select(pl.len()).collect().item()


def export_dataset(store: Any, kind: str, out: str, *, fmt: str = "parquet", filters: Any = None,
                   evaluation: EvalConfig | None = None, **options: Any) -> Any:
    """dataengine.derive.export.export of `kind` (pairs, sft, replay) to `out`; None when the selection is
    empty: nothing is written (an empty file would fail a trainer later, less clearly).
    `options` go to dataengine.derive.export.export (versions, dedup, include_logprobs,
    decontaminate, ...); the eval items refused cover `evaluation`'s held-out tasks."""
    from dataengine.derive.decontam import index_for
    from dataengine.derive.export import export
    from dataengine.stages.resources import open_store
    from storage.export import ExportFilters

    store = open_store(store, create=False)
    filters = filters or ExportFilters()
    if selected_rows(store, kind, filters.run_ids) == 0:
        return None
    if options.get("decontaminate", True) and options.get("eval_index") is None:
        options["eval_index"] = index_for(evaluation)
    result = export(store, kind, out, format=fmt, filters=filters, **options)
    return result if result.rows else None
