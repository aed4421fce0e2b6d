"""Which rows a report covers, for any set of run ids (one pipeline, or runs made by separate
generate / derive / train / eval commands).

`select_runs(store, runs)` joins:
- the given runs' own rows (run_id equal to one of them or under it, `RUN/...`): trees,
  trajectories, derived pairs / sft / replay rows, models and evals written under those ids;
- the models trained on their data. A model trained from an exported file
  (dataset_versions_json {"file:/x.parquet": sha, "pairs": 7}) whose export lineage is still
  readable is joined when the export's run filter names one of the runs (no filter: as below).
  Otherwise a models row is joined when a store table version it names ({"pairs": 7}) held rows
  of the runs: what a trainer reading the store took, unless it filtered the rows by run, which
  the checkpoint does not record (then every run the table held is credited);
- the models trained from those (parent_id chain, any depth) and the models evaluated in the
  given runs;
- the evals of every joined model and of the models they started from (evals.model_id =
  models.model_id), so a report shows before and after.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

TABLES = ("runs", "tasks", "nodes", "trajectories", "pairs", "sft", "replay", "evals", "models")
DATA_TABLES = ("pairs", "sft", "replay")


def run_filter(runs: str | Iterable[str]) -> pl.Expr:
    """Rows of the given runs and of their sub-runs (`run/...`)."""
    runs = [runs] if isinstance(runs, str) else list(runs)
    expr = pl.lit(False)
    for run in runs:
        expr = expr | (pl.col("run_id") == run) | pl.col("run_id").str.starts_with(run + "/")
    return expr


@dataclass
class Selection:
    """The rows of a report.

    runs: the given run ids (each covers its sub-runs).
    models: {model_id: why it is joined} ("given run", "trained on the runs' data",
        "trained from <parent>", "evaluated in the runs").
    starting: ids of the models the joined ones started from, not joined themselves (their
        evals are shown as the starting point).
    """

    runs: list[str]
    models: dict[str, str] = field(default_factory=dict)
    starting: list[str] = field(default_factory=list)
    extra_runs: list[str] = field(default_factory=list)

    def rows(self) -> pl.Expr:
        """Rows written under the given runs (trees, trajectories, derived data)."""
        return run_filter(self.runs)

    def model_rows(self) -> pl.Expr:
        return self.rows() | pl.col("model_id").is_in(list(self.models))

    def eval_rows(self) -> pl.Expr:
        return self.rows() | pl.col("model_id").is_in(list(self.models) + self.starting)

    def run_rows(self) -> pl.Expr:
        """runs-table rows: the given runs and the train / eval runs joined through the models."""
        return self.rows() | pl.col("run_id").is_in(self.extra_runs)


def _run_ids(store: Any) -> set[str]:
    ids: set[str] = set()
    for table in TABLES:
        if store.has_table(table):
            ids |= set(store.scan(table).select("run_id").unique().collect()["run_id"].to_list())
    return ids


def _held_at(store: Any, table: str, version: int, runs: list[str]) -> bool:
    """Whether `table` at Delta `version` holds rows of `runs` (False when that version is gone)."""
    from storage import StoreError

    try:
        frame = store.scan(table, version=version).filter(run_filter(runs)).select(pl.len())
        return frame.collect().item() > 0
    except (StoreError, OSError, ValueError):
        return False


def _data_versions(versions: dict[str, Any]) -> list[tuple[str, int]]:
    """The (store table, Delta version) entries of a dataset_versions dict."""
    return [(t, v) for t, v in versions.items() if t in DATA_TABLES and isinstance(v, int) and not isinstance(v, bool)]


def _covers(runs: list[str], run_id: str) -> bool:
    return any(run_id == r or run_id.startswith(r + "/") for r in runs)


def _export_lineage(file: Path) -> dict[str, Any] | None:
    """The export lineage of a training file: its own (parquet) or its dataset folder's card."""
    from storage.export import read_lineage

    for candidate in (file, file.parent, file.parent.parent):
        try:
            lineage = read_lineage(candidate) if candidate.exists() else None
        except ValueError:
            lineage = None
        if isinstance(lineage, dict):
            return lineage
    return None


def _trained_on(store: Any, versions_json: str | None, runs: list[str], held: dict[tuple[str, int], bool]) -> bool:
    """Whether a models row's training data (its dataset_versions_json) came from `runs`."""
    try:
        versions = json.loads(versions_json or "{}")
    except ValueError:
        return False
    if not isinstance(versions, dict):
        return False
    filtered: set[str] = set()
    for key in versions:
        if not key.startswith("file:"):
            continue
        lineage = _export_lineage(Path(key[len("file:"):]))
        run_ids = ((lineage or {}).get("filters") or {}).get("run_ids")
        if lineage and run_ids:
            filtered |= set(lineage.get("source_versions") or {})
            if any(_covers(runs, r) for r in run_ids):
                return True
    for key in _data_versions(versions):
        if key[0] in filtered:
            continue
        if key not in held:
            held[key] = _held_at(store, *key, runs)
        if held[key]:
            return True
    return False


def select_runs(store: Any, runs: str | Iterable[str]) -> Selection:
    """The Selection of `runs` in `store` (module docstring). ValueError naming a run of which
    the store holds no row, with the runs it does hold."""
    runs = [runs] if isinstance(runs, str) else list(dict.fromkeys(runs))
    if not runs or any(not r or not r.strip() for r in runs):
        raise ValueError("give at least one run id, none empty")
    have = _run_ids(store)
    for run in runs:
        if not any(_covers([run], r) for r in have):
            tops = sorted({r.split("/")[0] for r in have})
            raise ValueError(f"store {store.root} has no rows of run {run!r}; runs there: {', '.join(tops[:20]) or 'none'}")
    selection = Selection(runs=runs)
    models = store.scan_or_empty("models").select("run_id", "model_id", "parent_id", "dataset_versions_json").collect()
    held: dict[tuple[str, int], bool] = {}
    for row in models.iter_rows(named=True):
        if _covers(runs, row["run_id"]):
            selection.models.setdefault(row["model_id"], "given run")
        elif _trained_on(store, row["dataset_versions_json"], runs, held):
            selection.models.setdefault(row["model_id"], "trained on the runs' data")
    evaluated = store.scan_or_empty("evals").filter(run_filter(runs)).select("model_id").unique().collect()
    for model in evaluated["model_id"].to_list():
        if model in set(models["model_id"].to_list()):
            selection.models.setdefault(model, "evaluated in the runs")
    parents = dict(zip(models["model_id"].to_list(), models["parent_id"].to_list()))
    grew = True
    while grew:
        grew = False
        for child, parent in parents.items():
            if child not in selection.models and parent in selection.models:
                selection.models[child] = f"trained from {parent}"
                grew = True
    selection.starting = sorted({p for m, p in parents.items() if m in selection.models and p} - set(selection.models))
    model_runs = models.filter(pl.col("model_id").is_in(list(selection.models)))["run_id"].to_list()
    eval_runs = store.scan_or_empty("evals").filter(selection.eval_rows()).select("run_id").unique().collect()
    selection.extra_runs = sorted(set(model_runs) | set(eval_runs["run_id"].to_list()))
    return selection
