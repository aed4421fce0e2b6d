"""Exports of the derived tables as TRL datasets: the engine's rendering of stored messages.

The store keeps messages as the engine wrote them (dataengine.types.Message: raw model text
with its `<tool_call>` markup, parsed calls beside it); an export renders them in TRL's
tool-calling form (storage.formats: structured `tool_calls`, tool turns, the tool list as JSON
schemas), so `tokenizer.apply_chat_template(row[...], tools=row["tools"])` of any tool-aware
chat template renders them, dedups them, balances them and hands them to storage.export's
atomic writer with their lineage. Formats, filters and the file layout: storage.export.

Balancing (`balance_by`, e.g. "level"): after dedup, every value of that field of the rows' tasks
(`metadata.<field>` of the stored task) is oversampled, rows repeated in order, to the row count of
the largest value, so one kind of task does not set the mix a trainer sees. Several keys,
comma-separated ("level,decision"), balance every combination of their values. Two keys are
properties of a pair, not of its task, and other exports leave them out: `decision`, what the
chosen side's first reply does against the rejected side's (`call>answer`, `answer>call`,
`call>call` or `answer>answer`; a reply with a tool call, parsed or not, is a call), which keeps
DPO from learning only the direction most pairs lean to (answer after a tool result, or call
again); and `depth`, the tool results in the shared prompt (how far into the episode the choice is).

Decontamination (on by default): before anything else, rows whose user question matches an
eval-only item (BFCL, tau2, the built-in held-out splits; dataengine.derive.decontam) are
refused, and the lineage counts them per source (`decontaminated`).

The lineage record (source table versions, filters, decontamination, dedup and balance settings
and counts) rebuilds the same rows through Delta time travel: `reexport(store, out, new_out)`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import polars as pl

from dataengine.derive.decontam import THRESHOLD, EvalIndex, index_for
from dataengine.derive.decontam import decontaminate as _decontaminate
from storage.dedup import DedupReport, dedup_frame
from storage.export import (
    FORMATS,
    ExportFilters,
    ExportResult,
    _kind,
    committed_source,
    oversample,
    read_lineage,
    task_field,
    write_rows,
)
from storage.formats import (
    CALL_TAG,
    chat_messages,
    chat_tools,
    dataset_kind,
    polars_schema,
    to_json_text,
    with_text_arguments,
)
from storage.store import Store


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


def balance_keys(balance_by: str, kind: str) -> list[str]:
    """The keys of a `balance_by` setting ("level" or "level,decision") that apply to `kind`:
    the pair keys (PAIR_KEYS) only to pairs. ValueError for an empty or malformed key."""
    keys = [k.strip() for k in balance_by.split(",")]
    for key in keys:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"balance_by must name task metadata fields (letters, digits, _) or pair keys "
                             f"({', '.join(PAIR_KEYS)}), comma-separated; not {balance_by!r}")
    return [k for k in keys if k not in PAIR_KEYS or kind == "pairs"]


# What a stored message list decodes to for the pair keys: roles, text and call names only.
_TURNS = pl.List(pl.Struct({"role": pl.String, "content": pl.String, "tool_calls": pl.List(pl.Struct({"name": pl.String}))}))


def reply_kind(column: str) -> pl.Expr:
    """"call" when the first assistant message of the stored message list in `column` holds a
    tool call (structured, or `<tool_call>` markup that did not parse), else "answer"."""
    first = (pl.col(column).fill_null("[]").str.json_decode(_TURNS)
             .list.eval(pl.element().filter(pl.element().struct.field("role") == "assistant")).list.first())
    calls = first.struct.field("tool_calls").list.len().fill_null(0) > 0
    markup = first.struct.field("content").fill_null("").str.contains(CALL_TAG, literal=True)
    return pl.when(calls | markup).then(pl.lit("call")).otherwise(pl.lit("answer"))


def pair_decision(source: pl.DataFrame) -> pl.Series:
    """Per pair, what the chosen side does against the rejected one: "call>answer", ..."""
    return source.select(pl.concat_str(reply_kind("chosen_json"), pl.lit(">"), reply_kind("rejected_json"))
                         .alias("decision")).to_series()


def pair_depth(source: pl.DataFrame) -> pl.Series:
    """Per pair, the tool results in its prompt, as text."""
    roles = pl.col("prompt_json").fill_null("[]").str.json_decode(_TURNS).list.eval(pl.element().struct.field("role"))
    tools = roles.list.eval((pl.element() == "tool").cast(pl.Int64)).list.sum().fill_null(0)
    return source.select(tools.cast(pl.String).alias("depth")).to_series()


# balance_by keys computed from the pair rows themselves (not task metadata); pairs only.
PAIR_KEYS: dict[str, Callable[[pl.DataFrame], pl.Series]] = {"decision": pair_decision, "depth": pair_depth}


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
    decontaminate: bool = True,
    decontam_threshold: float | None = THRESHOLD,
    eval_index: EvalIndex | None = None,
) -> tuple[pl.DataFrame, DedupReport, dict[str, int], dict[str, int]]:
    """The TRL rows of an export (JSON leaves as text; storage.formats), its dedup report, the
    source table versions read ({table: version}, plus the commit marker table's version when
    shards of the table declare one, and the tasks table's with balance_by), and with
    balance_by the rows per value before oversampling (module docstring; else {}).
    `export_rows` also returns the rows refused as eval items.

    dedup: "exact" drops rows equal after normalisation (whitespace-collapsed content, same
    calls); "near" also drops rows whose embedding is at cosine >= near_threshold to a kept
    row with the same prompt (pairs) or task (sft). Near dedup is off by default: tool
    arguments that differ by one digit embed almost identically but are different actions.

    decontaminate: refuse rows whose user question matches an item of `eval_index` (None:
    decontam.index_for()), exactly or as a near duplicate at `decontam_threshold` (None: exact only).
    """
    rows, report, used, groups, _ = export_rows(
        store, kind, filters=filters, versions=versions, dedup=dedup, near_threshold=near_threshold,
        embedder=embedder, include_logprobs=include_logprobs, balance_by=balance_by, decontaminate=decontaminate,
        decontam_threshold=decontam_threshold, eval_index=eval_index)
    return rows, report, used, groups


def export_rows(
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
    decontaminate: bool = True,
    decontam_threshold: float | None = THRESHOLD,
    eval_index: EvalIndex | None = None,
) -> tuple[pl.DataFrame, DedupReport, dict[str, int], dict[str, int], dict[str, int]]:
    """`export_frame`'s four results and the rows refused per eval source ({} when off)."""
    spec = _kind(kind)
    if dedup not in ("none", "exact", "near"):
        raise ValueError(f"dedup must be none, exact or near, not {dedup!r}")
    source, used = committed_source(store, spec.name, filters, versions)
    refused: dict[str, int] = {}
    if decontaminate:
        source, refused = _decontaminate(source, spec.store_message_columns, eval_index or index_for(),
                                         threshold=decontam_threshold)
    versions = versions or {}
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
    return rows.drop(helper), report, used, groups, refused


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
    decontaminate: bool = True,
    decontam_threshold: float | None = THRESHOLD,
    eval_index: EvalIndex | None = None,
) -> ExportResult:
    """Export `kind` (pairs | sft | replay) to `out` in `format`; see `export_frame`.

    record_run_id: also append a `runs` row (kind "export") with the lineage.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; choose from {', '.join(FORMATS)}")
    spec = _kind(kind)
    filters = filters or ExportFilters()
    if decontaminate and eval_index is None:
        eval_index = index_for()
    rows, report, source_versions, groups, refused = export_rows(
        store, spec.name, filters=filters, versions=versions, dedup=dedup,
        near_threshold=near_threshold, embedder=embedder, include_logprobs=include_logprobs, balance_by=balance_by,
        decontaminate=decontaminate, decontam_threshold=decontam_threshold, eval_index=eval_index,
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
                        "include_logprobs": include_logprobs, "decontaminate": decontaminate,
                        "decontam_threshold": decontam_threshold,
                        "eval_index": eval_index.digest if decontaminate else None},
        balance={"by": balance_by, "rows_before": groups} if balance_by is not None else {},
        decontaminated=refused,
    )
    write_rows(rows, out, format, result.lineage())
    if record_run_id is not None:
        store.record_run(record_run_id, kind="export", config=result.lineage(), source_versions=source_versions)
    return result


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
        # Records from before decontamination existed did not refuse rows; neither does their rebuild.
        decontaminate=settings.get("decontaminate", False),
        decontam_threshold=settings.get("decontam_threshold", THRESHOLD),
    )
