"""Reading the training datasets, from exported files or straight from the store's tables.

The three formats (what the store exports and TRL reads):
- preference: {"prompt": [msg], "chosen": [msg], "rejected": [msg], "tools": str}
  (+ "ref_chosen_logps"/"ref_rejected_logps": float, behaviour log-probs used as reference);
- sft: {"messages": [msg], "tools": str};
- prompt (GRPO): {"prompt": [msg], "tools": str, "task_id": str, "task_json": str}.
A message is {"role", "content"} (+ "name" on tool turns); assistant content is the raw model
text including `<tool_call>{...}</tool_call>`. "tools" is a JSON string of OpenAI tool dicts
(a list is accepted and serialised: nested, heterogeneous JSON schemas do not fit one Arrow type,
and TRL's DPO/SFT tokenizers json.loads a string "tools" themselves).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Kind = Literal["preference", "sft", "prompt"]

REQUIRED: dict[str, tuple[str, ...]] = {
    "preference": ("prompt", "chosen", "rejected"),
    "sft": ("messages",),
    "prompt": ("prompt", "task_json"),
}
MESSAGE_COLUMNS: dict[str, tuple[str, ...]] = {
    "preference": ("prompt", "chosen", "rejected"),
    "sft": ("messages",),
    "prompt": ("prompt",),
}
STORE_TABLE: dict[str, str] = {"preference": "pairs", "sft": "sft", "prompt": "replay"}
ROLES = ("system", "user", "assistant", "tool")


class TrainingDataError(ValueError):
    """A training dataset is missing, malformed or in the wrong format; the message says where."""


@dataclass
class TrainingData:
    """Rows in a trainer's format plus where they came from.

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


def load_training_data(
    kind: Kind,
    source: str | Path | None = None,
    *,
    store: Any = None,
    pair_kind: str | None = None,
    min_margin: float | None = None,
    behaviour_ref: bool = False,
    drop_zero_variance: bool = False,
    limit: int | None = None,
) -> TrainingData:
    """Rows for one trainer from a file/folder (`source`) or from the store (`store`).

    pair_kind: preference only: keep "step" or "trajectory" pairs (store rows carry `kind`).
    min_margin: preference only: keep pairs with margin >= this (store rows carry `margin`).
    behaviour_ref: preference only: the rows must carry ref_chosen_logps/ref_rejected_logps
        (store: taken from chosen_logprob/rejected_logprob); pairs lacking them are refused.
    drop_zero_variance: prompt only: drop prompts whose p_success is 0 or 1 (every sample would
        get the same reward, so GRPO's group advantage is zero and they teach nothing).
    limit: keep the first `limit` rows after filtering.
    """
    if kind not in REQUIRED:
        raise TrainingDataError(f"unknown dataset kind {kind!r}; expected one of {sorted(REQUIRED)}")
    if (source is None) == (store is None):
        raise TrainingDataError("give exactly one data source: a dataset file/folder or a store")
    if store is not None:
        raw, versions = _read_store(
            kind,
            store,
            pair_kind=pair_kind,
            min_margin=min_margin,
            behaviour_ref=behaviour_ref,
            drop_zero_variance=drop_zero_variance,
        )
    else:
        raw, versions = _read_files(Path(source))
    where = _where(source, store, kind)
    if source is not None and (pair_kind is not None or min_margin is not None):
        raise TrainingDataError(
            f"{where}: pair_kind / min_margin filter the store's pairs table; exported files are already "
            "filtered (use `dataengine export pairs --kind/--min-margin`, or train with --store)"
        )
    rows = [_normalise_row(kind, row, index, behaviour_ref=behaviour_ref, where=where) for index, row in enumerate(raw)]
    if drop_zero_variance and source is not None:
        if any("_p_success" not in r for r in rows):
            raise TrainingDataError(f"{where}: drop_zero_variance needs a p_success column (or train with --store)")
        rows = [r for r in rows if r["_p_success"] is None or 0.0 < r["_p_success"] < 1.0]
    if limit is not None:
        rows = rows[:limit]
    for r in rows:
        r.pop("_p_success", None)
    if not rows:
        raise TrainingDataError(f"no {kind} rows left in {where} after filtering")
    return TrainingData(kind=kind, rows=rows, versions=versions)


def as_training_data(kind: Kind, data: Any) -> TrainingData:
    """Accept TrainingData, a datasets.Dataset, a list of row dicts or a path; check the format."""
    if isinstance(data, TrainingData):
        if data.kind != kind:
            raise TrainingDataError(f"expected {kind} data, got {data.kind} data")
        return data
    if isinstance(data, (str, Path)):
        return load_training_data(kind, data)
    rows = list(data)
    normalised = [_normalise_row(kind, dict(r), i, behaviour_ref=False, where="the given rows") for i, r in enumerate(rows)]
    for r in normalised:
        r.pop("_p_success", None)
    if not normalised:
        raise TrainingDataError(f"the given {kind} dataset is empty")
    return TrainingData(kind=kind, rows=normalised, versions={"in_memory_rows": len(normalised)})


def _where(source: Any, store: Any, kind: str) -> str:
    if source is not None:
        return str(source)
    return f"store table {STORE_TABLE[kind]!r}"


def _read_files(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of a .parquet / .jsonl / .json file, a folder of those, or a `datasets` save_to_disk folder."""
    if not path.exists():
        raise TrainingDataError(f"dataset {path} does not exist")
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        from datasets import load_from_disk

        loaded = load_from_disk(str(path))
        if hasattr(loaded, "keys"):  # a DatasetDict: train on its train split
            if "train" not in loaded:
                raise TrainingDataError(f"dataset folder {path} has splits {list(loaded)} but no 'train'")
            loaded = loaded["train"]
        versions = {f"hf:{path.resolve()}": loaded._fingerprint, **_export_lineage(path / "lineage.json")}
        return loaded.to_list(), versions
    def is_data(p: Path) -> bool:
        return p.suffix in (".parquet", ".jsonl", ".json") and not p.name.endswith("lineage.json")

    files = sorted(p for p in path.rglob("*") if is_data(p)) if path.is_dir() else [path]
    if not files:
        raise TrainingDataError(f"dataset folder {path} holds no .parquet, .jsonl or .json files")
    rows: list[dict[str, Any]] = []
    versions: dict[str, Any] = {}
    for file in files:
        rows.extend(_read_file(file))
        versions[f"file:{file.resolve()}"] = _sha(file)
        versions.update(_export_lineage(Path(f"{file}.lineage.json")))
    return rows, versions


def _export_lineage(file: Path) -> dict[str, Any]:
    """{table: Delta version} from the lineage record `dataengine export` writes beside a file."""
    if not file.is_file():
        return {}
    try:
        return {str(k): v for k, v in json.loads(file.read_text()).get("source_versions", {}).items()}
    except (OSError, ValueError, AttributeError) as exc:
        raise TrainingDataError(f"export lineage file {file} is unreadable: {exc}") from exc


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
    kind: str,
    store: Any,
    *,
    pair_kind: str | None,
    min_margin: float | None,
    behaviour_ref: bool,
    drop_zero_variance: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of the pairs / sft / replay table at its current Delta version, in trainer format,
    through the store's own export (same filters and exact dedup as `dataengine export`)."""
    from storage.export import ExportFilters, export_frame

    table = STORE_TABLE[kind]
    if table not in store.table_versions():
        raise TrainingDataError(
            f"the store at {getattr(store, 'root', store)} has no {table!r} table yet; generate and derive data first"
        )
    filters = ExportFilters(
        kinds=[pair_kind] if pair_kind else None,
        min_margin=min_margin,
        # GRPO learns nothing from prompts the policy always or never solves (zero group variance).
        where="p_success IS NULL OR (p_success > 0 AND p_success < 1)" if drop_zero_variance else None,
    )
    frame, _report, versions = export_frame(store, table, filters=filters, include_logprobs=behaviour_ref)
    return frame.to_dicts(), dict(versions)


def _normalise_row(kind: str, row: dict[str, Any], index: int, *, behaviour_ref: bool, where: str) -> dict[str, Any]:
    """Check the columns of one row and bring it to the trainer format (tools as a JSON string,
    messages as plain {"role", "content", "name"} dicts)."""
    missing = [c for c in REQUIRED[kind] if c not in row or row[c] is None]
    if missing:
        raise TrainingDataError(
            f"{where}: row {index} lacks column(s) {missing} needed for {kind} training "
            f"(it has {sorted(k for k in row if not k.startswith('_'))})"
        )
    out: dict[str, Any] = {}
    for column in MESSAGE_COLUMNS[kind]:
        value = row[column]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise TrainingDataError(f"{where}: row {index} column {column!r} is not a JSON message list") from exc
        out[column] = [_message(m, where, index, column, i) for i, m in enumerate(_as_list(value, where, index, column))]
    if kind == "preference":
        for column in ("chosen", "rejected"):
            if not out[column] or out[column][0]["role"] != "assistant":
                raise TrainingDataError(f"{where}: row {index} column {column!r} must start with an assistant message")
        if behaviour_ref or "ref_chosen_logps" in row:
            for column in ("ref_chosen_logps", "ref_rejected_logps"):
                value = row.get(column)
                if value is None:
                    raise TrainingDataError(
                        f"{where}: row {index} lacks {column!r}, needed to use the behaviour log-probs as the DPO "
                        "reference (turn that option off, or export pairs with their log-probs)"
                    )
                out[column] = float(value)
    if kind == "sft" and not any(m["role"] == "assistant" for m in out["messages"]):
        raise TrainingDataError(f"{where}: row {index} has no assistant message: nothing to train on")
    tools = row.get("tools")
    if tools is None:
        tools = "[]"
    elif not isinstance(tools, str):
        tools = json.dumps(tools)
    else:
        try:
            json.loads(tools)
        except json.JSONDecodeError as exc:
            raise TrainingDataError(f"{where}: row {index} column 'tools' is not valid JSON") from exc
    out["tools"] = tools
    if kind == "prompt":
        out["task_json"] = row["task_json"]
        out["task_id"] = str(row.get("task_id") or json.loads(row["task_json"]).get("id", f"row-{index}"))
        if "p_success" in row:
            out["_p_success"] = row["p_success"]
    return out


def _as_list(value: Any, where: str, index: int, column: str) -> list[Any]:
    if isinstance(value, dict):  # a single message given bare
        return [value]
    if not isinstance(value, (list, tuple)):
        raise TrainingDataError(f"{where}: row {index} column {column!r} must be a list of messages, got {type(value).__name__}")
    return list(value)


def _message(message: Any, where: str, index: int, column: str, position: int) -> dict[str, Any]:
    if not isinstance(message, dict) or "role" not in message:
        raise TrainingDataError(f"{where}: row {index} column {column!r} message {position} is not a {{'role', 'content'}} dict")
    role = message["role"]
    if role not in ROLES:
        raise TrainingDataError(f"{where}: row {index} column {column!r} message {position} has unknown role {role!r}")
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise TrainingDataError(f"{where}: row {index} column {column!r} message {position}: content must be text")
    if role == "assistant" and not content and message.get("tool_calls"):
        raise TrainingDataError(
            f"{where}: row {index} column {column!r} message {position}: assistant turn has structured tool_calls "
            "but no text; export the raw model text (with <tool_call>...</tool_call>) as its content"
        )
    out = {"role": role, "content": content}
    if role == "tool":
        out["name"] = message.get("name") or "tool"
    return out
