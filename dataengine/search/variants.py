"""Argument variants: tool calls that differ from a candidate in one numeric argument, the new
value taken from a number the conversation shows (the user's turns or a tool's output), or in
the tool called: another offered tool that takes the same arguments (`subtract` for `add`).
Variants of variants come from later rounds, so two edits are two rounds away.

Why: a small policy chaining two calls mostly picks the wrong operand for the second call
(`divide(122, 14)` for `(1708 / 14) / 61`, where 122 is the first call's result); the right
call has a probability near 1e-3, out of reach of sampling at any budget a CPU affords, but it
is one substitution away from what the policy wrote. Variants only recombine values the episode
already shows: nothing is read from the task's gold, and the verifiers still judge every
episode.

With the tools' schemas (`widen_arguments: schema`) three more edits read what the tool offers:
an enum argument set to a value the conversation names (`us_gallon` for "US gallons") or, when
the current value is not in the enum, to the closest enum values (`pound` for "pounds"); a
required argument the call left out, added with each such value (or each context number for a
numeric one); and two arguments of one kind exchanged (`convert(5, "week", "day")` for
`convert(5, "day", "week")`). 17 of greedy SmolLM2's 25 failures on 30 held-out units tasks
are a call without a unit argument or with a unit outside the enum (docs/search.md).

The search scores each variant with the policy (`Policy.score`) and adds the most likely ones
at a widening round (`SearchConfig.widen_arguments`), so they enter the tree with
their real log-probs as priors and as behaviour log-probs.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

from dataengine.parsing import render_inline_calls
from dataengine.types import Action, Message, ToolCall, ToolSpec

# A number not glued to a word or to another number's digits ("x2", "3.5.1" give nothing odd).
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
MAX_NUMBERS = 12  # distinct context numbers considered, the most recent first
MAX_VARIANTS = 32  # variants of one candidate action


def context_numbers(messages: Sequence[Message], limit: int = MAX_NUMBERS) -> list[int | float]:
    """Distinct numbers in the user and tool turns, most recent turn first (a tool's fresh
    result is the likeliest next operand), in reading order within a turn."""
    seen: dict[str, int | float] = {}
    for message in reversed(messages):
        if message.role not in ("user", "tool"):
            continue
        for literal in NUMBER.findall(message.content or ""):
            value: int | float = float(literal) if "." in literal else int(literal)
            key = json.dumps(value)
            if key not in seen:
                seen[key] = value
                if len(seen) >= limit:
                    return list(seen.values())
    return list(seen.values())


def context_text(messages: Sequence[Message]) -> str:
    """The user and tool turns, lowercased, in reading order (where enum values are looked up)."""
    return "\n".join((m.content or "").lower() for m in messages if m.role in ("user", "tool"))


def named_values(values: Sequence[Any], text: str) -> list[str]:
    """The string `values` that `text` names at a word start, `_` read as a space ('us_gallon' in
    'us gallons'), in the order `text` first names them."""
    found = []
    for value in values:
        if isinstance(value, str) and value:
            hit = re.search(r"\b" + re.escape(value.replace("_", " ").lower()), text)
            if hit:
                found.append((hit.start(), value))
    return [value for _, value in sorted(found, key=lambda x: x[0])]


def same_signature(tools: Sequence[ToolSpec]) -> dict[str, list[str]]:
    """Tool name -> the other tools whose parameters have the same names (in offer order)."""
    params = {t.name: frozenset((t.parameters or {}).get("properties", {})) for t in tools}
    return {a: [b for b in params if b != a and params[b] == pa] for a, pa in params.items() if pa}


def argument_variants(
    action: Action,
    numbers: Sequence[int | float],
    limit: int = MAX_VARIANTS,
    swaps: dict[str, list[str]] | None = None,
    schemas: dict[str, dict[str, Any]] | None = None,
    text: str = "",
) -> list[str]:
    """Texts of the actions that replace, in one of `action`'s calls, one numeric top-level
    argument by another of `numbers`, or the tool by another of `swaps[tool]` (tools taking the
    same arguments, `same_signature`); in call, argument, number, then swap order (ties in the
    policy's scores keep it); none for an action without calls. Booleans are not numbers here.
    With `schemas` (tool name -> JSON-schema parameters) and the conversation's `text`
    (`context_text`), the schema edits of the module docstring come after the numeric ones."""
    calls = action.tool_calls
    return [
        render_inline_calls([*calls[:c], changed, *calls[c + 1 :]])
        for c, changed in islice(_edited_calls(calls, numbers, swaps or {}, schemas, text), limit)
    ]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _edited_calls(
    calls: Sequence[ToolCall],
    numbers: Sequence[int | float],
    swaps: dict[str, list[str]],
    schemas: dict[str, dict[str, Any]] | None,
    text: str,
) -> Iterator[tuple[int, ToolCall]]:
    """(index, edited call) for each single edit `argument_variants` describes, in its order."""
    for c, call in enumerate(calls):
        for name, current in call.arguments.items():
            if not _number(current):
                continue
            for value in numbers:
                if value != current:
                    yield c, ToolCall(name=call.name, arguments={**call.arguments, name: value})
        if schemas is not None and call.name in schemas:
            for name, value in _schema_edits(call.arguments, schemas[call.name], numbers, text):
                yield c, ToolCall(name=call.name, arguments={**call.arguments, name: value})
            for exchanged in _exchanges(call.arguments):
                yield c, ToolCall(name=call.name, arguments=exchanged)
        for other in swaps.get(call.name, []):
            yield c, ToolCall(name=other, arguments=dict(call.arguments))


def _schema_edits(
    arguments: dict[str, Any], schema: dict[str, Any], numbers: Sequence[int | float], text: str
) -> Iterator[tuple[str, Any]]:
    """(argument, new value): enum values the text names (and, for a value outside the enum, the
    closest ones) for each enum argument present or required; context numbers for a required
    numeric argument the call left out."""
    required = set(schema.get("required") or [])
    for name, spec in (schema.get("properties") or {}).items():
        if not isinstance(spec, dict) or (name not in arguments and name not in required):
            continue
        current = arguments.get(name)
        enum = spec.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            options = named_values(enum, text)
            if isinstance(current, str) and current not in enum:
                options += difflib.get_close_matches(current.lower(), enum, n=3, cutoff=0.6)
            for value in dict.fromkeys(options):
                if value != current:
                    yield name, value
        elif name not in arguments and spec.get("type") in ("number", "integer"):
            for value in numbers:
                yield name, value


def _exchanges(arguments: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`arguments` with two different values of one kind (both strings, or both numbers) exchanged."""
    names = list(arguments)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            va, vb = arguments[a], arguments[b]
            if va != vb and (isinstance(va, str) and isinstance(vb, str) or _number(va) and _number(vb)):
                yield {**arguments, a: vb, b: va}
