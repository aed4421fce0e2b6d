"""Argument variants: tool calls that differ from a candidate in one numeric argument, the new
value taken from a number the conversation shows (the user's turns or a tool's output), or in
the tool called: another offered tool that takes the same arguments (`subtract` for `add`).
Variants of variants come from later rounds, so two edits are two rounds away.

Why: a small policy chaining two calls mostly picks the wrong operand for the second call
(`divide(122, 14)` for `(1708 / 14) / 61`, where 122 is the first call's result); the right
call has a probability near 1e-3, out of reach of sampling at any budget a CPU affords, but it
is one substitution away from what the policy wrote. Variants only recombine values the episode
already shows: nothing is read from the task's gold, and the verifiers still judge every
episode. The search scores each variant with the policy (`Policy.score`) and adds the most
likely ones at a widening round (`SearchConfig.widen_arguments`), so they enter the tree with
their real log-probs as priors and as behaviour log-probs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from itertools import islice

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


def same_signature(tools: Sequence[ToolSpec]) -> dict[str, list[str]]:
    """Tool name -> the other tools whose parameters have the same names (in offer order)."""
    params = {t.name: frozenset((t.parameters or {}).get("properties", {})) for t in tools}
    return {a: [b for b in params if b != a and params[b] == pa] for a, pa in params.items() if pa}


def argument_variants(
    action: Action,
    numbers: Sequence[int | float],
    limit: int = MAX_VARIANTS,
    swaps: dict[str, list[str]] | None = None,
) -> list[str]:
    """Texts of the actions that replace, in one of `action`'s calls, one numeric top-level
    argument by another of `numbers`, or the tool by another of `swaps[tool]` (tools taking the
    same arguments, `same_signature`); in call, argument, number, then swap order (ties in the
    policy's scores keep it); none for an action without calls. Booleans are not numbers here."""
    calls = action.tool_calls
    return [
        render_inline_calls([*calls[:c], changed, *calls[c + 1 :]])
        for c, changed in islice(_edited_calls(calls, numbers, swaps or {}), limit)
    ]


def _edited_calls(
    calls: Sequence[ToolCall], numbers: Sequence[int | float], swaps: dict[str, list[str]]
) -> Iterator[tuple[int, ToolCall]]:
    """(index, edited call) for each single edit `argument_variants` describes, in its order."""
    for c, call in enumerate(calls):
        for name, current in call.arguments.items():
            if isinstance(current, bool) or not isinstance(current, (int, float)):
                continue
            for value in numbers:
                if value != current:
                    yield c, ToolCall(name=call.name, arguments={**call.arguments, name: value})
        for other in swaps.get(call.name, []):
            yield c, ToolCall(name=other, arguments=dict(call.arguments))
