"""Exports of the derived tables in the dataset formats TRL reads.

| export | source table | row format (TRL 1.16)                                              |
|--------|--------------|--------------------------------------------------------------------|
| pairs  | pairs        | {"prompt": [msg], "chosen": [msg], "rejected": [msg], "tools": str} |
| sft    | sft          | {"messages": [msg], "tools": str}                                   |
| replay | replay       | {"prompt": [msg], "tools": str, "task_id": str, "task_json": str}   |

A message is {"role", "content"} plus "name" when any message of the export names a tool
(then null on the other turns); assistant
content is the raw model text including `<tool_call>...</tool_call>`. `tools` is the JSON
string of the OpenAI-form tool list: TRL's DPOTrainer and SFTTrainer `json.loads` a string
`tools` column, and a JSON string avoids Arrow unifying heterogeneous JSON schemas.

Formats: `parquet` (one file), `jsonl` (one JSON object per line), `hf` (datasets
`save_to_disk` folder). Each export writes a lineage record (the source table versions, the
filters and the dedup counts) next to it: `<out>.lineage.json` for files, `<out>/lineage.json`
for `hf`; `reexport` rebuilds the same rows from it through Delta time travel.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

from storage.dedup import DedupReport, dedup_frame
from storage.schemas import SCHEMA_VERSION
from storage.store import Store

Kind = Literal["pairs", "sft", "replay"]
Format = Literal["parquet", "jsonl", "hf"]
KINDS: tuple[str, ...] = ("pairs", "sft", "replay")
FORMATS: tuple[str, ...] = ("parquet", "jsonl", "hf")

MESSAGE = pl.Struct({"role": pl.String, "content": pl.String, "name": pl.String})
MESSAGES = pl.List(MESSAGE)


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

    def lineage(self) -> dict[str, Any]:
        return asdict(self)


def _messages(value: str | None, what: str, row_id: str) -> list[dict[str, Any]]:
    """A message list JSON as TRL message dicts; a clear error naming the row otherwise."""
    if value is None:
        raise ValueError(f"row {row_id}: {what} is null")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"row {row_id}: {what} is not JSON: {exc}") from exc
    if not isinstance(parsed, list) or not all(isinstance(m, dict) and m.get("role") for m in parsed):
        raise ValueError(f"row {row_id}: {what} must be a JSON list of message dicts, each with a role")
    return parsed


def _decode_messages(source: pl.DataFrame, column: str, id_column: str) -> pl.Series:
    """`column` (JSON message lists) decoded to `MESSAGES`, vectorised.

    Content null becomes "". A row that is null, not JSON, not a list of messages, or has a
    message without a role raises ValueError naming the row and the column.
    """
    try:
        decoded = source.select(pl.col(column).str.json_decode(MESSAGES)).to_series()
    except pl.exceptions.PolarsError:
        # Find the bad row with the plain parser, which names it.
        for value, row_id in zip(source[column], source[id_column]):
            _messages(value, column, row_id)
        raise
    bad = source.select(
        pl.col(id_column),
        bad=decoded.is_null() | decoded.list.eval(pl.element().struct.field("role").is_null()).list.any(),
    ).filter("bad")
    if bad.height:
        row_id = bad[id_column][0]
        _messages(source.filter(pl.col(id_column) == row_id)[column][0], column, row_id)
        raise ValueError(f"row {row_id}: {column} must be a JSON list of message dicts, each with a role")
    return decoded.list.eval(
        pl.struct(
            pl.element().struct.field("role"),
            pl.element().struct.field("content").fill_null(""),
            pl.element().struct.field("name"),
        )
    ).cast(MESSAGES)


def build_rows(kind: str, source: pl.DataFrame, *, include_logprobs: bool = False) -> pl.DataFrame:
    """TRL rows from collected rows of the source table (see the module table for columns)."""
    tools = source["tools_json"].fill_null("[]").alias("tools") if "tools_json" in source.columns else None
    if kind == "pairs":
        frame = pl.DataFrame([
            _decode_messages(source, "prompt_json", "pair_id").alias("prompt"),
            _decode_messages(source, "chosen_json", "pair_id").alias("chosen"),
            _decode_messages(source, "rejected_json", "pair_id").alias("rejected"),
            tools,
        ])
        if include_logprobs:
            # TRL's DPOTrainer uses these columns as the reference log-probs when present.
            frame = frame.with_columns(
                ref_chosen_logps=source["chosen_logprob"], ref_rejected_logps=source["rejected_logprob"]
            )
        return frame
    if kind == "sft":
        return pl.DataFrame([_decode_messages(source, "messages_json", "example_id").alias("messages"), tools])
    if kind == "replay":
        return pl.DataFrame([
            _decode_messages(source, "prompt_json", "prompt_id").alias("prompt"),
            tools,
            source["task_id"],
            source["task_json"],
        ])
    raise ValueError(f"unknown export {kind!r}; choose from {', '.join(KINDS)}")


MESSAGE_COLUMNS = {"pairs": ("prompt", "chosen", "rejected"), "sft": ("messages",), "replay": ("prompt",)}


def _normalised(column: str) -> pl.Expr:
    """Messages with whitespace-collapsed content: the exact-dedup form (see dedup.normalise_messages)."""
    return pl.col(column).list.eval(
        pl.struct(
            pl.element().struct.field("role"),
            pl.element().struct.field("content").str.replace_all(r"\s+", " ").str.strip_chars(),
            pl.element().struct.field("name"),
        )
    )


def _text(column: str) -> pl.Expr:
    """Plain "role: content" lines of a message column (see dedup.messages_text)."""
    element = pl.element().struct
    return pl.col(column).list.eval(pl.concat_str(element.field("role"), pl.lit(": "), element.field("content"))).list.join("\n")


def _dedup_columns(kind: str, rows: pl.DataFrame) -> pl.DataFrame:
    """Add `_key_*` columns (exact dedup), `_text` (embedding input) and `_group` (near dedup)."""
    keys = [_normalised(c).alias(f"_key_{c}") for c in MESSAGE_COLUMNS[kind]]
    if kind == "replay":
        keys.append(pl.col("task_id").alias("_key_task"))
    if kind == "pairs":
        text = pl.concat_str(_text("chosen"), pl.lit("\n---\n"), _text("rejected"))
    else:
        text = _text(MESSAGE_COLUMNS[kind][0])
    # Near duplicates are only looked for among rows with the same prompt (pairs, replay) or task.
    group = _normalised("prompt").hash() if kind == "pairs" else pl.lit(0) if kind == "replay" else None
    return rows.with_columns(*keys, _text=text, **({"_group": group} if group is not None else {}))


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
) -> tuple[pl.DataFrame, DedupReport, dict[str, int]]:
    """The TRL rows of an export, its dedup report and the source table versions read.

    dedup: "exact" drops rows equal after normalisation; "near" also drops rows whose
    embedding is at cosine >= near_threshold to a kept row with the same prompt (pairs) or
    task (sft, replay). Near dedup is off by default: tool arguments that differ by one digit
    embed almost identically but are different actions.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown export {kind!r}; choose from {', '.join(KINDS)}")
    if dedup not in ("none", "exact", "near"):
        raise ValueError(f"dedup must be none, exact or near, not {dedup!r}")
    filters = filters or ExportFilters()
    version = (versions or {}).get(kind, store.version(kind))
    source = filters.apply(store.read(kind, version=version), kind).collect()
    rows = build_rows(kind, source, include_logprobs=include_logprobs)
    if kind == "sft":
        rows = rows.with_columns(_group=source["task_id"])
    rows = _dedup_columns(kind, rows)
    helper = [c for c in rows.columns if c.startswith("_")]
    rows, report = dedup_frame(
        rows,
        key=[c for c in helper if c.startswith("_key_")],
        text="_text",
        group="_group" if "_group" in rows.columns else None,
        exact=dedup != "none",
        near_threshold=near_threshold if dedup == "near" else None,
        embedder=embedder,
    )
    return _drop_empty_names(rows.drop(helper)), report, {kind: version}


def _drop_empty_names(rows: pl.DataFrame) -> pl.DataFrame:
    """Drop the message field "name" when no message has one, so templates never see name=None."""
    columns = [c for c, t in rows.schema.items() if t == MESSAGES]
    if any(rows[c].explode().struct.field("name").drop_nulls().len() for c in columns):
        return rows
    plain = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
    return rows.with_columns(
        pl.col(c).list.eval(pl.struct(pl.element().struct.field("role"), pl.element().struct.field("content"))).cast(plain)
        for c in columns
    )


def write_rows(rows: pl.DataFrame, out: str | Path, fmt: str, lineage: dict[str, Any]) -> Path:
    """Write TRL rows as parquet, jsonl or an HF datasets folder, with the lineage record."""
    out = Path(out)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if out.exists() and out.is_dir() and fmt != "hf":
        raise ValueError(f"{out} is a folder; {fmt} exports write one file")
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(lineage, indent=2, sort_keys=True)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = rows.to_arrow()
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"dataengine.lineage": text.encode()})
        pq.write_table(table, out)
        Path(f"{out}.lineage.json").write_text(text)
    elif fmt == "jsonl":
        rows.write_ndjson(out)
        Path(f"{out}.lineage.json").write_text(text)
    else:
        import datasets

        datasets.Dataset.from_polars(rows).save_to_disk(str(out))
        (out / "lineage.json").write_text(text)
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
    record_run_id: str | None = None,
) -> ExportResult:
    """Export `kind` (pairs | sft | replay) to `out` in `format`; see `export_frame`.

    record_run_id: also append a `runs` row (kind "export") with the lineage.
    """
    filters = filters or ExportFilters()
    rows, report, source_versions = export_frame(
        store, kind, filters=filters, versions=versions, dedup=dedup,
        near_threshold=near_threshold, embedder=embedder, include_logprobs=include_logprobs,
    )
    result = ExportResult(
        kind=kind,
        format=format,
        path=str(out),
        rows=rows.height,
        dedup=report.as_dict(),
        source_versions=source_versions,
        filters=asdict(filters),
        dedup_settings={"dedup": dedup, "near_threshold": near_threshold, "embedder": embedder,
                        "include_logprobs": include_logprobs},
    )
    write_rows(rows, out, format, result.lineage())
    if record_run_id is not None:
        store.record_run(record_run_id, kind="export", config=result.lineage(), source_versions=source_versions)
    return result


def lineage_path(out: str | Path, fmt: str) -> Path:
    return Path(out) / "lineage.json" if fmt == "hf" else Path(f"{out}.lineage.json")


def reexport(store: Store, lineage_file: str | Path, out: str | Path, *, format: str | None = None) -> ExportResult:
    """Rebuild an export exactly from its lineage record (same table versions, filters, dedup)."""
    path = Path(lineage_file)
    try:
        lineage = json.loads(path.read_text())
        settings = lineage["dedup_settings"]
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"lineage file {path} is unreadable: {exc}") from exc
    return export(
        store,
        lineage["kind"],
        out,
        format=format or lineage["format"],
        filters=ExportFilters(**lineage["filters"]),
        versions=lineage["source_versions"],
        dedup=settings["dedup"],
        near_threshold=settings["near_threshold"],
        embedder=settings["embedder"],
        include_logprobs=settings.get("include_logprobs", False),
    )


def load_exported(path: str | Path, fmt: str = "parquet"):
    """The export as a datasets.Dataset, loaded the way a TRL user loads it."""
    import datasets

    if fmt == "parquet":
        return datasets.load_dataset("parquet", data_files=str(path), split="train")
    if fmt == "jsonl":
        return datasets.load_dataset("json", data_files=str(path), split="train")
    return datasets.load_from_disk(str(path))

