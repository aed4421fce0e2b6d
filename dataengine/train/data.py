"""Reading the training datasets, from exported files or straight from the store's tables.

The formats are storage.formats' (the same rows `dataengine export` writes and TRL reads):
- pairs ("preference"): {"prompt", "chosen", "rejected": [msg], "tools": [tool]}
  (+ "ref_chosen_logps"/"ref_rejected_logps": float, behaviour log-probs used as reference);
- sft: {"messages": [msg], "tools": [tool]};
- replay ("prompt", GRPO): {"prompt": [msg], "tools": [tool], "task_id": str, "task_json": str}.
Messages carry structured `tool_calls` on assistant turns and `name` on tool turns.

`TrainingData.rows` hold the rows the trainers build their `datasets.Dataset` from, with two
leaves as JSON text: each call's `arguments` and the whole `tools` list (TRL's DPO and SFT
trainers `json.loads` a string `tools`; our chat template renders text arguments verbatim).
Argument objects and tool schemas differ from row to row, and `Dataset.from_list` would merge
them into one struct type, filling every missing key with null.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage.formats import (
    DatasetFormatError,
    DatasetKind,
    chat_messages,
    chat_tools,
    dataset_kind,
    to_json_text,
    with_text_arguments,
)

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


class TrainingDataError(ValueError):
    """A training dataset is missing, malformed or in the wrong format; the message says where."""


@dataclass
class TrainingData:
    """Rows in a trainer's format plus where they came from.

    kind: the dataset kind's name (storage.formats: pairs, sft or replay).
    rows: list of dicts in the format of `kind` (see the module docstring).
    versions: lineage, e.g. {"pairs": 4} (store table -> Delta version) or
        {"file:/abs/path.parquet": "<sha256 16 hex>"} for files.
    """

    kind: str
    rows: list[dict[str, Any]]
    versions: dict[str, Any] = field(default_factory=dict)

    def to_dataset(self) -> Any:
        """A datasets.Dataset of the rows."""
        from datasets import Dataset

        return Dataset.from_list(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _spec(kind: str) -> DatasetKind:
    try:
        return dataset_kind(kind)
    except DatasetFormatError as exc:
        raise TrainingDataError(str(exc)) from None


def load_training_data(
    kind: str,
    source: str | Path | None = None,
    *,
    store: Any = None,
    pair_kind: str | None = None,
    min_margin: float | None = None,
    behaviour_ref: bool = False,
    drop_zero_variance: bool = False,
    limit: int | None = None,
    run_ids: list[str] | None = None,
    suites: list[str] | None = None,
) -> TrainingData:
    """Rows for one trainer from a file/folder (`source`) or from the store (`store`).

    kind: pairs ("preference"), sft, or replay ("prompt").
    pair_kind: pairs only: keep "step" or "trajectory" pairs (store rows carry `kind`).
    min_margin: pairs only: keep pairs with margin >= this (store rows carry `margin`).
    behaviour_ref: pairs only: also read the logged sampling log-probs (ref_chosen_logps /
        ref_rejected_logps, from chosen_logprob / rejected_logprob); optional per row. DPO's
        behaviour reference re-scores TRL's completion tokens (dataengine.train.reference).
    drop_zero_variance: replay only: drop prompts whose p_success is 0 or 1 (every sample would
        get the same reward, so GRPO's group advantage is zero and they teach nothing).
    limit: keep the first `limit` rows after filtering.
    run_ids, suites: store only: rows of these runs / suites (None: all).
    """
    spec = _spec(kind)
    if (source is None) == (store is None):
        raise TrainingDataError("give exactly one data source: a dataset file/folder or a store")
    where = str(source) if source is not None else f"store table {spec.table!r}"
    if source is not None and (pair_kind is not None or min_margin is not None or run_ids or suites):
        raise TrainingDataError(
            f"{where}: pair kind, margin, run and suite filters apply to the store's tables; exported files are "
            "already filtered (use `dataengine export ... --kind/--min-margin/--run-id/--suite`, or train with --store)"
        )
    if store is not None:
        raw, versions = _read_store(
            spec,
            store,
            pair_kind=pair_kind,
            min_margin=min_margin,
            behaviour_ref=behaviour_ref,
            drop_zero_variance=drop_zero_variance,
            run_ids=run_ids,
            suites=suites,
        )
    else:
        raw, versions = _read_files(Path(source))
    rows = [_normalise_row(spec, row, index, behaviour_ref=behaviour_ref, where=where) for index, row in enumerate(raw)]
    if drop_zero_variance and source is not None:
        if any("_p_success" not in r for r in rows):
            raise TrainingDataError(f"{where}: drop_zero_variance needs a p_success column (or train with --store)")
        rows = [r for r in rows if r["_p_success"] is None or 0.0 < r["_p_success"] < 1.0]
    if limit is not None:
        rows = rows[:limit]
    for r in rows:
        r.pop("_p_success", None)
    if not rows:
        raise TrainingDataError(f"no {spec.name} rows left in {where} after filtering")
    return TrainingData(kind=spec.name, rows=rows, versions=versions)


def as_training_data(kind: str, data: Any) -> TrainingData:
    """Accept TrainingData, a datasets.Dataset, a list of row dicts or a path; check the format."""
    spec = _spec(kind)
    if isinstance(data, TrainingData):
        if _spec(data.kind) is not spec:
            raise TrainingDataError(f"expected {spec.name} data, got {data.kind} data")
        return data
    if isinstance(data, (str, Path)):
        return load_training_data(spec.name, data)
    rows = list(data)
    normalised = [_normalise_row(spec, dict(r), i, behaviour_ref=False, where="the given rows") for i, r in enumerate(rows)]
    for r in normalised:
        r.pop("_p_success", None)
    if not normalised:
        raise TrainingDataError(f"the given {spec.name} dataset is empty")
    return TrainingData(kind=spec.name, rows=normalised, versions={"in_memory_rows": len(normalised)})


def _read_files(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of a .parquet / .jsonl / .json file, a folder of those (an exported dataset folder
    included), or a `datasets` save_to_disk folder. Hidden files and folders are skipped."""
    from storage.export import read_lineage

    if not path.exists():
        raise TrainingDataError(f"dataset {path} does not exist")
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        from datasets import load_from_disk

        loaded = load_from_disk(str(path))
        if hasattr(loaded, "keys"):  # a DatasetDict: train on its train split
            if "train" not in loaded:
                raise TrainingDataError(f"dataset folder {path} has splits {list(loaded)} but no 'train'")
            loaded = loaded["train"]
        return loaded.to_list(), {f"hf:{path.resolve()}": loaded._fingerprint}

    def is_data(p: Path) -> bool:
        hidden = any(part.startswith(".") for part in p.relative_to(path).parts)
        return p.suffix in DATA_SUFFIXES and p.is_file() and not hidden

    files = sorted(p for p in path.rglob("*") if is_data(p)) if path.is_dir() else [path]
    if not files:
        raise TrainingDataError(f"dataset folder {path} holds no .parquet, .jsonl or .json files")
    rows: list[dict[str, Any]] = []
    versions: dict[str, Any] = {}
    try:
        if path.is_dir():
            versions.update(_source_versions(read_lineage(path)))
        for file in files:
            rows.extend(_read_file(file))
            versions[f"file:{file.resolve()}"] = _sha(file)
            if file.suffix == ".parquet":
                versions.update(_source_versions(read_lineage(file)))
    except ValueError as exc:
        raise TrainingDataError(f"export lineage in {path} is unreadable: {exc}") from exc
    return rows, versions


def _source_versions(lineage: dict[str, Any] | None) -> dict[str, Any]:
    """{table: Delta version} of the lineage record `dataengine export` writes with the data."""
    if not lineage:
        return {}
    return {str(k): v for k, v in (lineage.get("source_versions") or {}).items()}


def _read_file(file: Path) -> list[dict[str, Any]]:
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(file).to_pylist()
        except Exception as exc:  # pyarrow raises several types for broken files
            raise TrainingDataError(f"cannot read parquet file {file}: {exc}") from exc
    if file.suffix in (".jsonl", ".json"):
        rows = []
        with open(file) as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TrainingDataError(f"{file} line {number}: invalid JSON ({exc.msg})") from exc
        return rows
    raise TrainingDataError(f"{file}: unknown suffix {file.suffix!r}; use .parquet, .jsonl or .json")


def _sha(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _read_store(
    spec: DatasetKind,
    store: Any,
    *,
    pair_kind: str | None,
    min_margin: float | None,
    behaviour_ref: bool,
    drop_zero_variance: bool,
    run_ids: list[str] | None = None,
    suites: list[str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of the pairs / sft / replay table at its current Delta version, in trainer format,
    through the store's own export (same filters and exact dedup as `dataengine export`)."""
    from dataengine.derive.export import export_frame
    from storage.export import ExportFilters

    if spec.table not in store.table_versions():
        raise TrainingDataError(
            f"the store at {getattr(store, 'root', store)} has no {spec.table!r} table yet; generate and derive data first"
        )
    filters = ExportFilters(
        run_ids=list(run_ids) if run_ids else None,
        suites=list(suites) if suites else None,
        kinds=[pair_kind] if pair_kind else None,
        min_margin=min_margin,
        # GRPO learns nothing from prompts the policy always or never solves (zero group variance).
        where="p_success IS NULL OR (p_success > 0 AND p_success < 1)" if drop_zero_variance else None,
    )
    frame, _report, versions, _groups = export_frame(store, spec.name, filters=filters, include_logprobs=behaviour_ref)
    return frame.to_dicts(), dict(versions)


def _normalise_row(spec: DatasetKind, row: dict[str, Any], index: int, *, behaviour_ref: bool, where: str) -> dict[str, Any]:
    """Check the columns of one row and bring it to the trainer format (module docstring)."""
    missing = [c for c in spec.required if c not in row or row[c] is None]
    if missing:
        raise TrainingDataError(
            f"{where}: row {index} lacks column(s) {missing} needed for {spec.name} training "
            f"(it has {sorted(k for k in row if not k.startswith('_'))})"
        )
    out: dict[str, Any] = {}
    try:
        for column in spec.message_columns:
            messages = chat_messages(row[column], f"{where}: row {index} column {column!r}")
            out[column] = with_text_arguments(messages)
        tools = chat_tools(row.get("tools"), f"{where}: row {index} column 'tools'")
    except DatasetFormatError as exc:
        raise TrainingDataError(str(exc)) from None
    out["tools"] = to_json_text(tools)
    if spec.name == "pairs":
        for column in ("chosen", "rejected"):
            if not out[column] or out[column][0]["role"] != "assistant":
                raise TrainingDataError(f"{where}: row {index} column {column!r} must start with an assistant message")
        # Logged sampling log-probs travel along when present; the DPO behaviour reference does not
        # use them (it scores exactly TRL's completion tokens with the behaviour model instead).
        if row.get("ref_chosen_logps") is not None and row.get("ref_rejected_logps") is not None:
            for column in ("ref_chosen_logps", "ref_rejected_logps"):
                out[column] = float(row[column])
    if spec.name == "sft" and not any(m["role"] == "assistant" for m in out["messages"]):
        raise TrainingDataError(f"{where}: row {index} has no assistant message: nothing to train on")
    if spec.name == "replay":
        out["task_json"] = row["task_json"]
        out["task_id"] = str(row.get("task_id") or json.loads(row["task_json"]).get("id", f"row-{index}"))
        if "p_success" in row:
            out["_p_success"] = row["p_success"]
    return out
