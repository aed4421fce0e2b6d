"""Exports of the derived tables as TRL datasets that load anywhere, written atomically.

Rows are in the formats of storage.formats (pairs: preference, sft: conversational language
modeling, replay: prompt-only), with structured `tool_calls`, tool turns and the tool list as
JSON schemas, so `tokenizer.apply_chat_template(row[...], tools=row["tools"])` of any
tool-aware chat template renders them.

Formats (`out` is the path written):
- `parquet`: one file; the lineage record is in its key-value metadata (`dataengine.lineage`),
  next to the `datasets` features (`huggingface`).
- `jsonl`, `hf`: a dataset folder: `README.md` (a dataset card whose YAML front matter holds
  the data files, the features and the lineage record under `dataengine.lineage`) and
  `data/train-00000-of-00001.jsonl` or `.parquet`. `datasets.load_dataset(folder)` reads it.

Atomic (`storage.atomic`): a file is written under a hidden temporary name in the same folder
and renamed over `out`; a folder is built under a hidden temporary name and swapped with the
old one in one rename. A killed export leaves the old export as it was and at most a hidden
`.<name>.<pid>-*.tmp` entry, which `datasets` and the trainers skip and the next export removes.

Balancing (`balance_by`, e.g. "level"): after dedup, every value of that field of the rows' tasks
(`metadata.<field>` of the stored task) is oversampled, rows repeated in order, to the row count of
the largest value, so one kind of task does not set the mix a trainer sees. Several keys,
comma-separated ("level,decision"), balance every combination of their values. Two keys are
properties of a pair, not of its task, and other exports leave them out: `decision`, what the
chosen side's first reply does against the rejected side's (`call>answer`, `answer>call`,
`call>call` or `answer>answer`; a reply with a tool call, parsed or not, is a call), which keeps
DPO from learning only the direction most pairs lean to (answer after a tool result, or call
again); and `depth`, the tool results in the shared prompt (how far into the episode the choice is).

The lineage record (source table versions, filters, dedup and balance settings and counts)
rebuilds the same rows through Delta time travel: `reexport(store, out, new_out)`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

from storage.atomic import destination, replace_file, replace_folder
from storage.dedup import DedupReport, dedup_frame
from storage.formats import (
    DatasetKind,
    chat_messages,
    chat_tools,
    dataset_kind,
    decoded_row,
    features,
    polars_schema,
    to_json_text,
    with_text_arguments,
)
from storage.schemas import SCHEMA_VERSION
from storage.store import Store

Format = Literal["parquet", "jsonl", "hf"]
KINDS: tuple[str, ...] = ("pairs", "sft", "replay")
FORMATS: tuple[str, ...] = ("parquet", "jsonl", "hf")
LINEAGE_KEY = "dataengine.lineage"
CARD = "README.md"
DATA_FILE = {"jsonl": "data/train-00000-of-00001.jsonl", "hf": "data/train-00000-of-00001.parquet"}


@dataclass
class ExportFilters:
    """Which rows of the source table are exported (all None: every row).

    run_ids, suites, task_ids: keep rows whose column is in the list.
    kinds: pairs `kind` (step | trajectory) or sft `kind` (rs | recovery).
    min_margin: pairs with margin >= this.
    min_score: sft rows with score >= this.
    min_p_success, max_p_success: replay prompts with p_success in this range (GRPO wants
        prompts the policy sometimes solves).
    where: a SQL boolean expression over the source table's columns (Polars SQL).
    limit: at most this many rows (after filters, before dedup).
    """

    run_ids: list[str] | None = None
    suites: list[str] | None = None
    task_ids: list[str] | None = None
    kinds: list[str] | None = None
    min_margin: float | None = None
    min_score: float | None = None
    min_p_success: float | None = None
    max_p_success: float | None = None
    where: str | None = None
    limit: int | None = None

    def apply(self, frame: pl.LazyFrame, kind: str) -> pl.LazyFrame:
        for column, values in (("run_id", self.run_ids), ("suite", self.suites), ("task_id", self.task_ids)):
            if values:
                frame = frame.filter(pl.col(column).is_in(list(values)))
        if self.kinds:
            if kind == "replay":
                raise ValueError("replay rows have no kind; drop the kinds filter")
            frame = frame.filter(pl.col("kind").is_in(list(self.kinds)))
        for value, column, wanted, op in (
            (self.min_margin, "margin", "pairs", "ge"),
            (self.min_score, "score", "sft", "ge"),
            (self.min_p_success, "p_success", "replay", "ge"),
            (self.max_p_success, "p_success", "replay", "le"),
        ):
            if value is None:
                continue
            if kind != wanted:
                raise ValueError(f"filter on {column} applies to {wanted} exports, not {kind}")
            frame = frame.filter(getattr(pl.col(column), op)(value))
        if self.where:
            try:
                frame = frame.filter(pl.sql_expr(self.where))
            except Exception as exc:
                raise ValueError(f"bad --where expression {self.where!r}: {exc}") from exc
        if self.limit is not None:
            frame = frame.head(self.limit)
        return frame


@dataclass
class ExportResult:
    """What an export wrote: path, rows, dedup counts, and the lineage to rebuild it."""

    kind: str
    format: str
    path: str
    rows: int
    dedup: dict[str, int]
    source_versions: dict[str, int]
    filters: dict[str, Any]
    dedup_settings: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    balance: dict[str, Any] = field(default_factory=dict)

    def lineage(self) -> dict[str, Any]:
        return asdict(self)


def _normalised_key(messages: list[dict[str, Any]]) -> str:
    """Exact-dedup key of messages (arguments as text): role, whitespace-collapsed content,
    name and calls, as JSON."""
    return json.dumps([{**m, "content": " ".join(m["content"].split())} for m in messages],
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _plain_text(messages: list[dict[str, Any]]) -> str:
    """"role: content" lines, calls written as name(arguments): the near-dedup embedding input."""
    lines = []
    for m in messages:
        calls = " ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in m.get("tool_calls", []))
        lines.append(f"{m['role']}: {m['content']} {calls}".rstrip())
    return "\n".join(lines)


def _by_value(values: list[Any], ids: list[Any], convert: Callable[[Any, Any], Any]) -> tuple[list[Any], Any]:
    """`convert(value, row_id)` of each distinct value (rows share prompts and tool lists) and
    the Arrow indices that spread them back over the rows."""
    import pyarrow as pa

    index: dict[Any, int] = {}
    distinct: list[Any] = []
    positions = []
    for value, row_id in zip(values, ids):
        i = index.get(value)
        if i is None:
            i = index[value] = len(distinct)
            distinct.append(convert(value, row_id))
        positions.append(i)
    return distinct, pa.array(positions, type=pa.int64())


def build_rows(kind: str, source: pl.DataFrame, *, include_logprobs: bool = False) -> pl.DataFrame:
    """TRL rows (storage.formats; JSON leaves as text) of collected source-table rows, plus the
    dedup helper columns `_key_<column>`, `_text` and `_group`.

    A message list that is null, not JSON, or holds a bad message raises DatasetFormatError
    (a ValueError) naming the row id and the column.
    """
    import pyarrow as pa

    spec = dataset_kind(kind)
    names = list(spec.columns)
    if include_logprobs and spec.name == "pairs":
        names += ["ref_chosen_logps", "ref_rejected_logps"]
    types = pl.DataFrame(schema=polars_schema(spec, names)).to_arrow().schema
    ids = source[spec.id_column].to_list()
    text = pa.large_string()
    arrays: dict[str, Any] = {}

    def messages(value: str | None, row_id: Any, column: str) -> tuple[list[dict[str, Any]], str, str]:
        if value is None:
            raise ValueError(f"row {row_id}: {column} is null")
        converted = with_text_arguments(chat_messages(value, f"row {row_id}: {column}"))
        return converted, _normalised_key(converted), _plain_text(converted)

    for column, stored in zip(spec.message_columns, spec.store_message_columns):
        distinct, take = _by_value(source[stored].to_list(), ids, lambda v, i, c=stored: messages(v, i, c))
        arrays[column] = pa.array([d[0] for d in distinct], type=types.field(column).type).take(take)
        arrays[f"_key_{column}"] = pa.array([d[1] for d in distinct], type=text).take(take)
        arrays[f"_text_{column}"] = pa.array([d[2] for d in distinct], type=text).take(take)
    distinct, take = _by_value(
        source["tools_json"].to_list(), ids,
        lambda v, i: [to_json_text(t) for t in chat_tools(v, f"row {i}: tools_json")],
    )
    arrays["tools"] = pa.array(distinct, type=types.field("tools").type).take(take)
    rows = pl.from_arrow(pa.table(arrays))
    extra = {"replay": ("task_id", "task_json")}.get(spec.name, ())
    rows = rows.with_columns(source.select(*extra))
    if include_logprobs and spec.name == "pairs":
        # TRL's DPOTrainer uses these columns as the reference log-probs when present.
        rows = rows.with_columns(ref_chosen_logps=source["chosen_logprob"].cast(pl.Float64),
                                 ref_rejected_logps=source["rejected_logprob"].cast(pl.Float64))
    if spec.name == "pairs":
        helper = [pl.concat_str("_text_chosen", pl.lit("\n---\n"), "_text_rejected").alias("_text"),
                  pl.col("_key_prompt").alias("_group")]  # near duplicates only among pairs with the same prompt
    else:
        group = pl.lit(source["task_id"]) if spec.name == "sft" else pl.lit("")
        helper = [pl.col(f"_text_{spec.message_columns[0]}").alias("_text"), group.alias("_group")]
    if spec.name == "replay":
        helper.append(pl.col("task_id").alias("_key_task"))
    keys = [f"_key_{c}" for c in spec.message_columns]
    return rows.select(*names, *keys, *helper)


def task_field(store: Store, task_ids: pl.Series, name: str, version: int | None = None) -> pl.Series:
    """`metadata.<name>` of each task in `task_ids` (the stored task JSON; text, null where the
    task or the field is missing). `name` is a plain identifier (balance_keys checks it).
    ValueError when no task has the field (a misspelt name would otherwise balance nothing)."""
    if not store.has_table("tasks"):
        raise ValueError("balance_by needs the store's tasks table, and the store has none")
    values = (
        store.tasks(version).select("task_id", pl.col("task_json").str.json_path_match(f"$.metadata.{name}").alias(name))
        .unique("task_id", keep="first").collect()
    )
    joined = pl.DataFrame({"task_id": task_ids}).join(values, on="task_id", how="left", maintain_order="left")
    if task_ids.len() and joined[name].null_count() == joined.height:
        raise ValueError(f"balance_by: no task of these rows has metadata.{name}")
    return joined[name]


def balance_keys(balance_by: str, kind: str) -> list[str]:
    """The keys of a `balance_by` setting ("level" or "level,decision") that apply to `kind`:
    the pair keys (PAIR_KEYS) only to pairs. ValueError for an empty or malformed key."""
    keys = [k.strip() for k in balance_by.split(",")]
    for key in keys:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"balance_by must name task metadata fields (letters, digits, _) or pair keys "
                             f"({', '.join(PAIR_KEYS)}), comma-separated; not {balance_by!r}")
    return [k for k in keys if k not in PAIR_KEYS or kind == "pairs"]


def _reply_kind(messages_json: str | None) -> str:
    """"call" when the first assistant message holds a tool call (structured, or `<tool_call>`
    markup that did not parse), else "answer"."""
    for message in json.loads(messages_json or "[]"):
        if isinstance(message, dict) and message.get("role") == "assistant":
            calls = message.get("tool_calls") or []
            return "call" if calls or "<tool_call>" in (message.get("content") or "") else "answer"
    return "answer"


def pair_decision(source: pl.DataFrame) -> pl.Series:
    """Per pair, what the chosen side does against the rejected one: "call>answer", ..."""
    sides = zip(source["chosen_json"].to_list(), source["rejected_json"].to_list())
    return pl.Series("decision", [f"{_reply_kind(c)}>{_reply_kind(r)}" for c, r in sides], dtype=pl.String)


def pair_depth(source: pl.DataFrame) -> pl.Series:
    """Per pair, the tool results in its prompt, as text."""
    def depth(prompt: str | None) -> str:
        return str(sum(isinstance(m, dict) and m.get("role") == "tool" for m in json.loads(prompt or "[]")))

    return pl.Series("depth", [depth(p) for p in source["prompt_json"].to_list()], dtype=pl.String)


# balance_by keys computed from the pair rows themselves (not task metadata); pairs only.
PAIR_KEYS: dict[str, Callable[[pl.DataFrame], pl.Series]] = {"decision": pair_decision, "depth": pair_depth}


def oversample(rows: pl.DataFrame, column: str) -> tuple[pl.DataFrame, dict[str, int]]:
    """Rows of each value of `column` repeated in order (whole copies, then the first rows) up to
    the row count of the most frequent value; returns them grouped by value in first-seen order,
    and the rows per value before ("null" for a missing value)."""
    if rows.height == 0:
        return rows, {}
    counts = rows.group_by(column, maintain_order=True).len()
    target = int(counts["len"].max())
    parts = []
    for value, n in counts.iter_rows():
        part = rows.filter(pl.col(column).eq_missing(value))
        parts.append(pl.concat([part] * -(-target // n)).head(target))
    return pl.concat(parts), {("null" if v is None else str(v)): int(n) for v, n in counts.iter_rows()}


def export_frame(
    store: Store,
    kind: str,
    *,
    filters: ExportFilters | None = None,
    versions: dict[str, int] | None = None,
    dedup: Literal["none", "exact", "near"] = "exact",
    near_threshold: float = 0.95,
    embedder: str = "ngram",
    include_logprobs: bool = False,
    balance_by: str | None = None,
) -> tuple[pl.DataFrame, DedupReport, dict[str, int], dict[str, int]]:
    """The TRL rows of an export (JSON leaves as text; storage.formats), its dedup report, the
    source table versions read ({table: version}, plus the commit marker table's version when
    shards of the table declare one, and the tasks table's with balance_by), and with
    balance_by the rows per value before oversampling (module docstring; else {}).

    dedup: "exact" drops rows equal after normalisation (whitespace-collapsed content, same
    calls); "near" also drops rows whose embedding is at cosine >= near_threshold to a kept
    row with the same prompt (pairs) or task (sft). Near dedup is off by default: tool
    arguments that differ by one digit embed almost identically but are different actions.
    """
    spec = _kind(kind)
    if dedup not in ("none", "exact", "near"):
        raise ValueError(f"dedup must be none, exact or near, not {dedup!r}")
    filters = filters or ExportFilters()
    versions = versions or {}
    used = {spec.table: versions.get(spec.table, store.version(spec.table))}
    # Committed shards only: a shard declared with a commit marker table (the store's
    # convention: tasks) whose marker has no rows of it is left out. The marker's version is
    # lineage too, so a rebuild judges the same shards committed.
    markers = {}
    for marker in sorted(store.manifest.declared(spec.table)):
        if store.has_table(marker):
            markers[marker] = used[marker] = versions.get(marker, store.version(marker))
    source = store.committed(spec.table, used[spec.table], marker_versions=markers)
    source = filters.apply(source, spec.name).collect()
    rows = build_rows(spec.name, source, include_logprobs=include_logprobs)
    keys = balance_keys(balance_by, spec.name) if balance_by is not None else []
    if any(k not in PAIR_KEYS for k in keys) and "tasks" not in used and store.has_table("tasks"):
        used["tasks"] = versions.get("tasks", store.version("tasks"))
    if keys:
        values = [PAIR_KEYS[k](source) if k in PAIR_KEYS else task_field(store, source["task_id"], k, used.get("tasks"))
                  for k in keys]
        rows = rows.with_columns(pl.concat_str([v.fill_null("null") for v in values], separator="|").alias("_balance"))
    helper = [c for c in rows.columns if c.startswith("_")]
    rows, report = dedup_frame(
        rows,
        key=[c for c in helper if c.startswith("_key_")],
        text="_text",
        group="_group",
        exact=dedup != "none",
        near_threshold=near_threshold if dedup == "near" else None,
        embedder=embedder,
    )
    groups: dict[str, int] = {}
    if keys:
        rows, groups = oversample(rows, "_balance")
    return rows.drop(helper), report, used, groups


def _kind(kind: str) -> DatasetKind:
    try:
        return dataset_kind(kind)
    except ValueError:
        raise ValueError(f"unknown export {kind!r}; choose from {', '.join(KINDS)}") from None


# ---- writing ----------------------------------------------------------------------------------


def to_arrow(rows: pl.DataFrame, kind: str) -> Any:
    """The rows as a pyarrow Table typed by the kind's `datasets` features (JSON leaves as
    Arrow JSON values; the features are in the schema metadata)."""
    from datasets.table import table_cast

    return table_cast(rows.to_arrow(), features(kind, rows.columns).arrow_schema)


def _write_parquet(table: Any, path: Path, lineage_text: str) -> None:
    import pyarrow.parquet as pq

    metadata = {**(table.schema.metadata or {}), LINEAGE_KEY.encode(): lineage_text.encode()}
    pq.write_table(table.replace_schema_metadata(metadata), path)


def _write_jsonl(rows: pl.DataFrame, kind: str, path: Path) -> None:
    tools: dict[tuple[str, ...], str] = {}  # rows share tool lists: decode and encode each once
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows.iter_rows(named=True):
            key = tuple(row.pop("tools"))
            if key not in tools:
                tools[key] = to_json_text(chat_tools(list(key), "tools"))
            line = to_json_text(decoded_row(row, kind))
            handle.write(f'{line[:-1]}, "tools": {tools[key]}}}\n')


def _card(kind: str, fmt: str, rows: int, data_file: Path, lineage: dict[str, Any], feats: Any) -> str:
    """README.md of a dataset folder: YAML front matter (data files, features, lineage) and text."""
    import yaml

    spec = dataset_kind(kind)
    meta = {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": DATA_FILE[fmt]}]}],
        "dataset_info": {
            "features": feats._to_yaml_list(),
            "splits": [{"name": "train", "num_bytes": data_file.stat().st_size, "num_examples": rows}],
        },
        "tags": ["trl"],
        "dataengine": {"lineage": lineage},
    }
    versions = ", ".join(f"`{t}` version {v}" for t, v in lineage.get("source_versions", {}).items())
    return (
        "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n\n"
        f"# dataengine `{spec.name}` export\n\n"
        f"{rows} rows of a TRL {spec.trl_type} dataset ({spec.trainer}), exported from {versions}.\n\n"
        f"Columns: {', '.join(feats)}. Messages carry structured `tool_calls`; `tools` is the list of\n"
        "JSON schemas to pass as `apply_chat_template(..., tools=row[\"tools\"])`.\n\n"
        "Load with `datasets.load_dataset(\"<this folder>\", split=\"train\")`. The lineage record\n"
        "(`dataengine.lineage` above) rebuilds these rows: `dataengine store reexport <this folder> --out NEW`.\n"
    )


def write_rows(rows: pl.DataFrame, out: str | Path, fmt: str, lineage: dict[str, Any]) -> Path:
    """Write TRL rows of `lineage["kind"]` to `out` atomically with their lineage (module doc)."""
    out = Path(out)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if fmt == "parquet" and out.is_dir():
        raise ValueError(f"{out} is a folder; parquet exports write one file")
    if fmt != "parquet" and out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file; {fmt} exports write a dataset folder (README.md and data/)")
    kind = lineage["kind"]
    out = destination(out)
    text = json.dumps(lineage, sort_keys=True)
    if fmt == "parquet":
        table = to_arrow(rows, kind)
        replace_file(out, lambda tmp: _write_parquet(table, tmp, text))
        return out

    def build(folder: Path) -> None:
        data = folder / DATA_FILE[fmt]
        data.parent.mkdir(parents=True)
        if fmt == "hf":
            _write_parquet(to_arrow(rows, kind), data, text)
        else:
            _write_jsonl(rows, kind, data)
        card = _card(kind, fmt, rows.height, data, lineage, features(kind, rows.columns))
        (folder / CARD).write_text(card, encoding="utf-8")

    replace_folder(out, build)
    return out


def export(
    store: Store,
    kind: str,
    out: str | Path,
    *,
    format: str = "parquet",
    filters: ExportFilters | None = None,
    versions: dict[str, int] | None = None,
    dedup: Literal["none", "exact", "near"] = "exact",
    near_threshold: float = 0.95,
    embedder: str = "ngram",
    include_logprobs: bool = False,
    balance_by: str | None = None,
    record_run_id: str | None = None,
) -> ExportResult:
    """Export `kind` (pairs | sft | replay) to `out` in `format`; see `export_frame`.

    record_run_id: also append a `runs` row (kind "export") with the lineage.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; choose from {', '.join(FORMATS)}")
    spec = _kind(kind)
    filters = filters or ExportFilters()
    rows, report, source_versions, groups = export_frame(
        store, spec.name, filters=filters, versions=versions, dedup=dedup,
        near_threshold=near_threshold, embedder=embedder, include_logprobs=include_logprobs, balance_by=balance_by,
    )
    result = ExportResult(
        kind=spec.name,
        format=format,
        path=str(out),
        rows=rows.height,
        dedup=report.as_dict(),
        source_versions=source_versions,
        filters=asdict(filters),
        dedup_settings={"dedup": dedup, "near_threshold": near_threshold, "embedder": embedder,
                        "include_logprobs": include_logprobs},
        balance={"by": balance_by, "rows_before": groups} if balance_by is not None else {},
    )
    write_rows(rows, out, format, result.lineage())
    if record_run_id is not None:
        store.record_run(record_run_id, kind="export", config=result.lineage(), source_versions=source_versions)
    return result


def lineage_path(out: str | Path, fmt: str) -> Path:
    """Where an export's lineage record is: the parquet file itself, or the folder's README.md."""
    return Path(out) if fmt == "parquet" else Path(out) / CARD


def read_lineage(path: str | Path) -> dict[str, Any] | None:
    """The lineage record of an export (a parquet file, a dataset folder or its README.md, or a
    JSON file holding the record); None when the file carries none. ValueError when unreadable."""
    path = Path(path)
    if path.is_dir():
        path = path / CARD
        if not path.is_file():
            return None
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            raw = (pq.read_schema(path).metadata or {}).get(LINEAGE_KEY.encode())
            return None if raw is None else json.loads(raw)
        if path.suffix == ".md":
            from huggingface_hub.repocard import metadata_load

            meta = metadata_load(path) or {}
            return (meta.get("dataengine") or {}).get("lineage")
        if path.suffix == ".json":
            return json.loads(path.read_text())
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"lineage of {path} is unreadable: {exc}") from exc
    except Exception as exc:  # pyarrow and yaml raise their own types for broken files
        raise ValueError(f"lineage of {path} is unreadable: {exc}") from exc
    raise ValueError(f"{path}: not an export (expected a .parquet file, a dataset folder, README.md or .json)")


def reexport(store: Store, lineage_source: str | Path, out: str | Path, *, format: str | None = None) -> ExportResult:
    """Rebuild an export exactly from its lineage record (same table versions, filters, dedup).

    lineage_source: the old export (parquet file or dataset folder), its README.md, or a JSON
    lineage record.
    """
    lineage = read_lineage(lineage_source)
    try:
        settings = lineage["dedup_settings"]
        filters = ExportFilters(**lineage["filters"])
    except (TypeError, KeyError) as exc:
        raise ValueError(f"{lineage_source} holds no usable lineage record ({exc})") from exc
    return export(
        store,
        lineage["kind"],
        out,
        format=format or lineage["format"],
        filters=filters,
        versions=lineage["source_versions"],
        dedup=settings["dedup"],
        near_threshold=settings["near_threshold"],
        embedder=settings["embedder"],
        include_logprobs=settings.get("include_logprobs", False),
        balance_by=(lineage.get("balance") or {}).get("by"),
    )


def load_exported(path: str | Path, fmt: str = "parquet", *, cache_dir: str | None = None):
    """The export as a datasets.Dataset, loaded the way a TRL user loads it."""
    import datasets

    if fmt == "parquet":
        return datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=cache_dir)
    return datasets.load_dataset(str(path), split="train", cache_dir=cache_dir)
