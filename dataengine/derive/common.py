"""Shared expressions of dataset derivation: message lists, tool lists, row ids.

Message lists live in the store as JSON strings (`messages_json`, `prompt_json`, ...). Where a
derivation must cut or join them, they are decoded to `MESSAGES` (a Polars list of
{role, content, name} structs), the same shape storage's exports produce; assistant `content`
is the raw model text (with its `<tool_call>` markup), so nothing the trainers read is lost.
"""

from __future__ import annotations

import json

import polars as pl

MESSAGE = pl.Struct({"role": pl.String, "content": pl.String, "name": pl.String})
MESSAGES = pl.List(MESSAGE)


def decode_messages(column: str) -> pl.Expr:
    """`column` (a JSON message list) as `MESSAGES`; extra keys such as tool_calls are dropped."""
    return pl.col(column).str.json_decode(MESSAGES)


def encode_messages(expr: pl.Expr) -> pl.Expr:
    """A `MESSAGES` expression back to a JSON list string (a null `name` is left out)."""
    # `name` is the struct's last field, so a null one is exactly this suffix of the object.
    element = pl.element().struct.json_encode().str.replace(',"name":null}', "}", literal=True)
    return pl.concat_str(pl.lit("["), expr.list.eval(element).list.join(","), pl.lit("]"))


def with_parsed_calls(messages_json: str | None) -> str | None:
    """A stored message list (JSON) whose assistant turns all carry `tool_calls` in the order
    their raw text wrote the arguments.

    Turns without the key (cut and re-joined by the Polars expressions here, or one action's raw
    text) get the calls dataengine.parsing reads in their raw text, so exports can give
    structured calls. Turns whose stored calls equal the text's up to key order (stores write
    JSON with sorted keys) take the text's order: training renders `tool_calls`, and sorted
    arguments on units were followed by SmolLM2 calls with a second, trailing `"value"` key
    after its own leading one (which then ran past the token limit)."""
    from dataengine.parsing import parse_action

    if messages_json is None:
        return None
    messages = json.loads(messages_json)
    changed = False
    for m in messages:
        if m.get("role") != "assistant":
            continue
        stored = m.get("tool_calls")
        if stored is not None and "<tool_call>" not in (m.get("content") or ""):
            continue
        parsed = [c.model_dump(mode="json") for c in parse_action(m.get("content") or "").tool_calls]
        # dict equality ignores key order: only the text's order replaces a stored call list.
        if stored is None or (parsed == stored and json.dumps(parsed) != json.dumps(stored)):
            m["tool_calls"] = parsed
            changed = True
    return json.dumps(messages, ensure_ascii=False) if changed else messages_json


def assistant_message_json(text: pl.Expr) -> pl.Expr:
    """`[{"role": "assistant", "content": text}]` as a JSON string (one chosen/rejected action)."""
    message = pl.struct(role=pl.lit("assistant"), content=text.fill_null(""))
    return pl.concat_str(pl.lit("["), message.struct.json_encode(), pl.lit("]"))


def first_assistant_index(messages: pl.Expr) -> pl.Expr:
    """Index of the first assistant message of a `MESSAGES` expression (the prompt's length)."""
    return messages.list.eval(pl.element().struct.field("role") == "assistant").list.arg_max()


def count_assistant(messages: pl.Expr) -> pl.Expr:
    """Number of assistant turns of a `MESSAGES` expression."""
    return messages.list.eval(pl.element().struct.field("role") == "assistant").list.sum()


def _openai_tools(task_json: str | None) -> str:
    """The OpenAI-form tool list (JSON) of a Task JSON; "[]" when it has none."""
    if not task_json:
        return "[]"
    try:
        tools = json.loads(task_json).get("tools") or []
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"task_json is not a Task JSON object: {exc}") from exc
    out = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                             "parameters": t.get("parameters") or {}}} for t in tools]
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def task_info(tasks: pl.LazyFrame | None) -> pl.LazyFrame:
    """One row per (run_id, task_id): task_json, tools_json (OpenAI form) and prompt_json (the
    task's own messages). Empty when `tasks` is None.

    Tool lists are rebuilt per distinct task in Python (a handful of rows per run): their
    parameter schemas differ from tool to tool, so they do not decode to one Arrow type.
    """
    schema = {"run_id": pl.String, "task_id": pl.String, "task_json": pl.String,
              "tools_json": pl.String, "task_prompt_json": pl.String}
    if tasks is None:
        return pl.LazyFrame(schema=schema)
    return (
        tasks.select("run_id", "task_id", "task_json")
        .unique(["run_id", "task_id"], keep="last", maintain_order=True)
        .with_columns(
            tools_json=pl.col("task_json").map_elements(_openai_tools, return_dtype=pl.String),
            task_prompt_json=encode_messages(
                pl.col("task_json").str.json_path_match("$.messages").str.json_decode(MESSAGES)
            ),
        )
        .select(list(schema))
    )


def keep_runs(frame: pl.LazyFrame, run_ids: list[str] | None) -> pl.LazyFrame:
    """Rows of the given runs (all rows when `run_ids` is None or empty)."""
    return frame.filter(pl.col("run_id").is_in(list(run_ids))) if run_ids else frame
