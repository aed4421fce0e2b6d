"""The three dataset kinds, named once: their store table, columns and TRL dataset type.

| kind   | TRL dataset type (trainer)             | store table | row                                                            |
|--------|----------------------------------------|-------------|----------------------------------------------------------------|
| pairs  | preference, explicit prompt (DPO)      | pairs       | prompt, chosen, rejected: [msg]; tools: [tool]; + ref_chosen_logps, ref_rejected_logps: float (optional) |
| sft    | conversational language modeling (SFT) | sft         | messages: [msg]; tools: [tool]                                 |
| replay | prompt-only (GRPO)                     | replay      | prompt: [msg]; tools: [tool]; task_id: str; task_json: str      |

The trainers' older names are aliases: "preference" is pairs, "prompt" is replay.

A message, in the Hugging Face / TRL tool-calling form that `apply_chat_template(..., tools=...)`
of tool-aware templates renders:
- {"role": "system" | "user", "content": str}
- {"role": "assistant", "content": str, "tool_calls": [{"type": "function",
  "function": {"name": str, "arguments": {...}}}]}: content is the text before the first call
  ("" when there is none); tool_calls only on turns that call tools;
- {"role": "tool", "name": str, "content": str}.
In sft rows an assistant turn may carry "weight": 0 (OpenAI's fine-tuning convention): the turn
stays in the conversation as context and is not trained on (the engine's chat template leaves
it outside the `{% generation %}` markers that TRL's assistant-only loss reads). Recovery
examples mark the failed step that way.
A tool is {"type": "function", "function": {"name", "description", "parameters": JSON schema}}.

In Arrow files a message is a struct with all four fields (null where a turn has none);
`arguments` and each tool are `datasets.Json` values (Arrow's JSON extension type), because
argument objects and tool schemas differ from row to row and cannot share one struct type;
`datasets` decodes them back to dicts. In Polars frames (which have no JSON type) those leaves
are JSON text.

The store keeps message lists as JSON in `<column>_json` columns, in the form the engine writes
(dataengine.types.Message): assistant `content` is the raw model text with its `<tool_call>`
markup and `tool_calls` is [{"name", "arguments"}]. `chat_message` turns that form, or the one
above, into the one above.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

ROLES = ("system", "user", "assistant", "tool")
CALL_TAG = "<tool_call>"
LOGPROB_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")


class DatasetFormatError(ValueError):
    """A row, message, tool call or tool is not in the dataset format; the message says where."""


@dataclass(frozen=True)
class DatasetKind:
    """One dataset kind.

    name: the kind's name (also the store table and the export name).
    trl_type, trainer: the TRL dataset type and the trainer that reads it.
    message_columns: columns holding message lists (store: `<column>_json`).
    columns: every column of a row, in order (optional ones excluded).
    required: columns a row must have (tools may be missing: no tools).
    optional: columns a row may add.
    id_column: the store column that names a row in errors.
    aliases: other accepted names.
    """

    name: str
    trl_type: str
    trainer: str
    message_columns: tuple[str, ...]
    columns: tuple[str, ...]
    required: tuple[str, ...]
    id_column: str
    optional: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def table(self) -> str:
        return self.name

    @property
    def store_message_columns(self) -> tuple[str, ...]:
        return tuple(f"{c}_json" for c in self.message_columns)


PAIRS = DatasetKind(
    "pairs", "preference (explicit prompt)", "DPOTrainer", ("prompt", "chosen", "rejected"),
    ("prompt", "chosen", "rejected", "tools"), ("prompt", "chosen", "rejected"), "pair_id",
    optional=LOGPROB_COLUMNS, aliases=("preference",),
)
SFT = DatasetKind(
    "sft", "conversational language modeling", "SFTTrainer", ("messages",),
    ("messages", "tools"), ("messages",), "example_id",
)
REPLAY = DatasetKind(
    "replay", "prompt-only", "GRPOTrainer", ("prompt",),
    ("prompt", "tools", "task_id", "task_json"), ("prompt", "task_json"), "prompt_id", aliases=("prompt",),
)
KINDS: dict[str, DatasetKind] = {k.name: k for k in (PAIRS, SFT, REPLAY)}


def dataset_kind(name: str | DatasetKind) -> DatasetKind:
    """The kind called `name` (or one of its aliases); a clear error listing the names otherwise."""
    if isinstance(name, DatasetKind):
        return name
    for kind in KINDS.values():
        if name == kind.name or name in kind.aliases:
            return kind
    names = ", ".join(n for k in KINDS.values() for n in (k.name, *k.aliases))
    raise DatasetFormatError(f"unknown dataset kind {name!r}; choose from {names}")


# ---- messages, calls and tools ----------------------------------------------------------------


def _json_object(value: Any, what: str) -> dict[str, Any]:
    """`value` (a dict, or JSON text of one) as a dict."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(f"{what} is not valid JSON: {exc.msg}") from exc
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DatasetFormatError(f"{what} must be a JSON object, got {type(value).__name__}")
    return dict(value)


def tool_call(call: Any, where: str) -> dict[str, Any]:
    """One call as {"type": "function", "function": {"name", "arguments": dict}}; accepts that
    form or the store's {"name", "arguments"}, with arguments as a dict or JSON text."""
    if not isinstance(call, Mapping):
        raise DatasetFormatError(f"{where} is not a tool-call object")
    function = call.get("function", call)
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
        raise DatasetFormatError(f"{where} has no function name")
    arguments = _json_object(function.get("arguments"), f"{where} arguments")
    return {"type": "function", "function": {"name": function["name"], "arguments": arguments}}


def chat_message(message: Any, where: str) -> dict[str, Any]:
    """One message in the module's form (arguments as dicts), from that form or the store's.

    An assistant turn with calls keeps, as content, its text before the first `<tool_call>`
    (the calls themselves are in `tool_calls`); a turn stored without parsed `tool_calls` keeps
    its raw text. Raises DatasetFormatError naming `where` and the message index otherwise.
    """
    if not isinstance(message, Mapping) or "role" not in message:
        raise DatasetFormatError(f"{where} is not a message dict with a role")
    role = message["role"]
    if role not in ROLES:
        raise DatasetFormatError(f"{where} has unknown role {role!r}; expected one of {', '.join(ROLES)}")
    content = message.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise DatasetFormatError(f"{where}: content must be text, got {type(content).__name__}")
    out: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        calls = message.get("tool_calls") or []
        if not isinstance(calls, (list, tuple)):
            raise DatasetFormatError(f"{where}: tool_calls must be a list")
        if calls:
            out["tool_calls"] = [tool_call(c, f"{where} tool call {i}") for i, c in enumerate(calls)]
            cut = content.find(CALL_TAG)
            if cut >= 0:
                out["content"] = content[:cut].strip()
        weight = message.get("weight")
        if weight is not None:
            if weight not in (0, 1) or isinstance(weight, bool):
                raise DatasetFormatError(f"{where}: weight must be 0 (not trained on) or 1, got {weight!r}")
            out["weight"] = int(weight)
    elif role == "tool":
        out["name"] = str(message.get("name") or "tool")
    return out


def chat_messages(value: Any, where: str) -> list[dict[str, Any]]:
    """A message list (a list, or JSON text of one) in the module's form."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(f"{where} is not JSON: {exc.msg}") from exc
    if isinstance(value, Mapping):  # a single message given bare
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise DatasetFormatError(f"{where} must be a list of messages, got {type(value).__name__}")
    return [chat_message(m, f"{where} message {i}") for i, m in enumerate(value)]


def chat_tools(value: Any, where: str) -> list[dict[str, Any]]:
    """The tool list (a list of dicts or of JSON texts, JSON text of a list, or None: no tools)."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(f"{where} is not valid JSON: {exc.msg}") from exc
    if not isinstance(value, (list, tuple)):
        raise DatasetFormatError(f"{where} must be a list of tools, got {type(value).__name__}")
    tools = [_json_object(t, f"{where} item {i}") for i, t in enumerate(value)]
    for i, tool in enumerate(tools):
        function = tool.get("function", tool)
        if not isinstance(function, Mapping) or not function.get("name"):
            raise DatasetFormatError(f"{where} item {i} has no function name")
    return tools


def to_json_text(value: Any) -> str:
    """JSON text the way chat templates' `tojson` writes it (so a template renders text and
    dict the same)."""
    return json.dumps(value, ensure_ascii=False)


def with_text_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with every call's `arguments` as JSON text (what Polars and `Dataset.from_list`
    can hold across rows whose arguments differ)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [
                {"type": "function", "function": {"name": c["function"]["name"],
                                                  "arguments": _text(c["function"]["arguments"])}}
                for c in m["tool_calls"]]}
        out.append(m)
    return out


def _text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else to_json_text(arguments)


def decoded_row(row: Mapping[str, Any], kind: str | DatasetKind) -> dict[str, Any]:
    """A row whose JSON leaves are text (a Polars or pyarrow row) with them decoded and unset
    message fields left out: the row as a JSON line holds it."""
    spec = dataset_kind(kind)
    out = dict(row)
    for column in spec.message_columns:
        messages = []
        for m in row[column] or []:
            m = {k: v for k, v in m.items() if v is not None}
            if m.get("tool_calls"):
                m["tool_calls"] = [tool_call(c, "tool call") for c in m["tool_calls"]]
            messages.append(m)
        out[column] = messages
    if "tools" in out:
        out["tools"] = chat_tools(out["tools"], "tools")
    return out


# ---- schemas ----------------------------------------------------------------------------------

_POLARS_CALLS = pl.List(pl.Struct({"type": pl.String, "function": pl.Struct({"name": pl.String, "arguments": pl.String})}))
POLARS_MESSAGES = pl.List(pl.Struct({"role": pl.String, "content": pl.String, "name": pl.String, "tool_calls": _POLARS_CALLS}))
"""A message list in a Polars frame (arguments as JSON text)."""
POLARS_SFT_MESSAGES = pl.List(pl.Struct({**POLARS_MESSAGES.inner.to_schema(), "weight": pl.Int64}))
"""An sft message list: assistant turns may carry weight 0 (kept as context, not trained on)."""


def polars_schema(kind: str | DatasetKind, columns: list[str] | tuple[str, ...] | None = None) -> dict[str, pl.DataType]:
    """Polars dtypes of the kind's columns (or of `columns`, optional ones included)."""
    spec = dataset_kind(kind)
    types = {c: POLARS_SFT_MESSAGES if spec is SFT else POLARS_MESSAGES for c in spec.message_columns}
    types.update(tools=pl.List(pl.String), task_id=pl.String, task_json=pl.String,
                 **{c: pl.Float64 for c in LOGPROB_COLUMNS})
    return {c: types[c] for c in (columns or spec.columns)}


def features(kind: str | DatasetKind, columns: list[str] | tuple[str, ...] | None = None) -> Any:
    """The `datasets.Features` of the kind's columns (or of `columns`, optional ones included)."""
    from datasets import Features, Json, List, Value

    spec = dataset_kind(kind)
    call = {"type": Value("string"), "function": {"name": Value("string"), "arguments": Json()}}
    message = {"role": Value("string"), "content": Value("string"), "name": Value("string"), "tool_calls": List(call)}
    if spec is SFT:
        message["weight"] = Value("int64")
    types: dict[str, Any] = {c: List(message) for c in spec.message_columns}
    types.update(tools=List(Json()), task_id=Value("string"), task_json=Value("string"),
                 **{c: Value("float64") for c in LOGPROB_COLUMNS})
    return Features({c: types[c] for c in (columns or spec.columns)})
