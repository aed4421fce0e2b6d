"""Model text -> Action, and Action -> canonical model text (Hermes/Qwen tool-call format).

Accepted (see docs/tools.md):
- one or more `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; "parameters"
  is an alias of "arguments", which may also be a JSON string holding the object; text before
  the first block is the thought; a block may also hold a JSON array of such objects (the
  `<tool_call>[{...}, ...]</tool_call>` form SmolLM2 was fine-tuned on), one call each;
- text without any tool-call tag is a final answer (a leading "Final answer:" or "Answer:"
  label is removed);
- everything from the first `<tool_response>` on is dropped: small models hallucinate the
  tool's reply after their call.

Parsing checks syntax only: unknown tool names are the verifiers' business. parse_action never
raises; a malformed reply becomes an Action whose `parse_error` names the problem.

Limits (the text is untrusted): a reply over MAX_REPLY_CHARS is a parse error; arguments must be
finite JSON (no NaN/Infinity), at most MAX_ARGUMENT_DEPTH deep and MAX_ARGUMENT_CHARS long.
Parsing is linear in the reply length: str.find/strip/startswith and fixed-word regexes only.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from dataengine.types import (
    MAX_ARGUMENT_DEPTH,
    Action,
    ToolCall,
    ToolSpec,
    argument_problem,
    canonical_json,
)

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
RESPONSE_TAG = "<tool_response>"
EXPECTED = "expected <tool_call>{...}</tool_call> or a final answer"

MAX_REPLY_CHARS = 1 << 20
"""Longer replies (after the hallucinated `<tool_response>` tail is cut) are a parse error."""
MAX_ARGUMENT_CHARS = 1 << 16
"""Longest arguments of one call, as canonical JSON (sorted keys, no spaces)."""

# Fixed words: no quantifier, so nothing to backtrack; the regex gives re.IGNORECASE's matching.
_FINAL = re.compile("final", re.IGNORECASE)
_ANSWER = re.compile("answer", re.IGNORECASE)
_FENCE = "```"


def parse_action(text: str, tools: list[ToolSpec] | None = None) -> Action:
    """Parse one assistant reply into an Action; never raises.

    `tools` is accepted for callers that have them at hand; names are not checked against it.
    """
    if not isinstance(text, str):
        return Action(text=repr(text), parse_error=f"reply is a {type(text).__name__}, not text ({EXPECTED})")
    try:
        return _parse(text)
    except Exception as exc:  # a parser bug must not stop an episode
        return Action(text=text, parse_error=f"could not parse the reply ({type(exc).__name__}: {exc}; {EXPECTED})")


def _parse(text: str) -> Action:
    cut = text.find(RESPONSE_TAG)
    if cut >= 0:
        text = text[:cut].rstrip()
    if len(text) > MAX_REPLY_CHARS:
        error = f"reply is {len(text)} characters long, over the {MAX_REPLY_CHARS}-character limit"
        return Action(text=text, parse_error=error)
    start = text.find(OPEN_TAG)
    if start < 0:
        if CLOSE_TAG in text:
            return Action(text=text, parse_error=f"found {CLOSE_TAG} without an opening {OPEN_TAG} ({EXPECTED})")
        answer = _drop_answer_label(text.strip()).strip()
        if not answer:
            return Action(text=text, parse_error=f"empty reply ({EXPECTED})")
        return Action(text=text, final_answer=answer)

    thought = text[:start].strip() or None
    calls: list[ToolCall] = []
    pos = start
    index = 0
    while True:
        index += 1
        body_start = pos + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body_start)
        if end < 0 or text.find(OPEN_TAG, body_start, end) >= 0:
            error = f"unclosed {OPEN_TAG} tag in tool call {index} (missing {CLOSE_TAG})"
            return Action(text=text, thought=thought, parse_error=error)
        found, error = _parse_block(text[body_start:end], index)
        if error:
            return Action(text=text, thought=thought, parse_error=error)
        calls.extend(found)
        pos = text.find(OPEN_TAG, end + len(CLOSE_TAG))
        if pos < 0:
            break
    return Action(text=text, thought=thought, tool_calls=calls)


def _drop_answer_label(text: str) -> str:
    """`text` (stripped) without a leading `Final answer:` / `Answer:` label: any case, optionally
    bold (`**Answer:**`, `**Answer**:`), `:` or `：`. A few str operations: linear time."""
    rest = _drop_bold(text)
    if _FINAL.match(rest):
        after = rest[5:]
        rest = after.lstrip()
        if len(rest) == len(after):  # "final" must be followed by whitespace
            return text
    if not _ANSWER.match(rest):
        return text
    rest = _drop_bold(rest[6:].lstrip()).lstrip()
    if not rest.startswith((":", "：")):
        return text
    return _drop_bold(rest[1:].lstrip())


def _drop_bold(text: str) -> str:
    return text.removeprefix("**")


def _unfence(body: str) -> str:
    """The inside of a ```` ```json ... ``` ```` fence around the whole (stripped) body, stripped;
    `body` itself when it is not fenced."""
    if len(body) < 2 * len(_FENCE) or not (body.startswith(_FENCE) and body.endswith(_FENCE)):
        return body
    inner = body[len(_FENCE):-len(_FENCE)]
    return inner.removeprefix("json").strip()


class _BadNumber(ValueError):
    """A number in model JSON that cannot be stored: NaN, Infinity or a float that overflows."""


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _BadNumber(literal)
    return value


def _no_constant(literal: str) -> float:
    raise _BadNumber(literal)


def _loads(text: str, where: str) -> tuple[Any, str | None]:
    """(value, None) or (None, error) for JSON from the model: finite numbers only."""
    try:
        return json.loads(text, parse_float=_finite_float, parse_constant=_no_constant), None
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON in {where} at line {exc.lineno} column {exc.colno} (char {exc.pos}): {exc.msg}"
    except _BadNumber as exc:
        literal = str(exc)
        shown = literal if len(literal) <= 40 else literal[:40] + "..."
        return None, f"the JSON in {where} holds {shown}, which is not a finite number (NaN and Infinity are not allowed)"
    except ValueError as exc:  # an integer over Python's digit limit
        return None, f"the JSON in {where} holds a number that cannot be read: {str(exc).split(';')[0]}"
    except RecursionError:
        return None, f"the JSON in {where} is nested too deeply (arguments may nest at most {MAX_ARGUMENT_DEPTH} levels)"


def _parse_block(body: str, index: int) -> tuple[list[ToolCall], str | None]:
    """The calls in one `<tool_call>` block: a JSON object, or a JSON array of objects."""
    where = f"tool call {index}"
    body = _unfence(body.strip())
    if not body:
        return [], f"empty {where}: {EXPECTED}"
    obj, error = _loads(body, where)
    if error:
        return [], error
    if not isinstance(obj, list):
        call, error = _parse_call(obj, where)
        return ([call] if call else []), error
    if not obj:
        return [], f"{where} is an empty JSON array: {EXPECTED}"
    calls = []
    for item, element in enumerate(obj, 1):
        call, error = _parse_call(element, f"item {item} of the array in {where}")
        if error:
            return [], error
        calls.append(call)
    return calls, None


def _parse_call(obj: Any, where: str) -> tuple[ToolCall | None, str | None]:
    if not isinstance(obj, dict):
        return None, f"{where} is a JSON {_json_type(obj)}, expected an object with \"name\" and \"arguments\""
    name = obj.get("name")
    if name is None:
        return None, f"{where} has no \"name\""
    if not isinstance(name, str) or not name.strip():
        return None, f"{where} has a \"name\" that is not a non-empty string: {json.dumps(name)[:80]}"
    arguments: Any = obj.get("arguments", obj.get("parameters", {}))
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        if not arguments.strip():
            arguments = {}
        else:
            arguments, error = _loads(arguments, f"the \"arguments\" string of {where}")
            if error:
                return None, error
    if not isinstance(arguments, dict):
        return None, f"the \"arguments\" of {where} is a JSON {_json_type(arguments)}, not an object"
    return _checked_call(name.strip(), arguments, where)


def _checked_call(name: str, arguments: dict[str, Any], where: str) -> tuple[ToolCall | None, str | None]:
    """The call, or the limit its arguments break (depth first: it bounds the size check's recursion)."""
    problem = argument_problem(arguments)
    if problem:
        return None, f"the \"arguments\" of {where} {problem}"
    size = len(canonical_json(arguments))
    if size > MAX_ARGUMENT_CHARS:
        return None, f"the \"arguments\" of {where} are {size} characters as JSON, over the {MAX_ARGUMENT_CHARS}-character limit"
    return ToolCall(name=name, arguments=arguments), None


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return "object"


def render_tool_calls(calls: list[ToolCall]) -> str:
    """Canonical Hermes text for the calls, one `<tool_call>` block per call, newline-separated."""
    return "\n".join(f"{OPEN_TAG}\n{_call_json(c)}\n{CLOSE_TAG}" for c in calls)


def render_inline_calls(calls: list[ToolCall]) -> str:
    """The calls as the worked examples write them: `<tool_call>{json}</tool_call>` per call, no
    inner newlines, newline-separated."""
    return "\n".join(f"{OPEN_TAG}{_call_json(c)}{CLOSE_TAG}" for c in calls)


def _call_json(call: ToolCall) -> str:
    text = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    # A tag inside a JSON string would end the block early: write its "<" as a JSON escape.
    for tag in (OPEN_TAG, CLOSE_TAG, RESPONSE_TAG):
        text = text.replace(tag, "\\u003c" + tag[1:])
    return text


def render_action(action: Action) -> str:
    """Canonical text of an action: thought and calls, the final answer, or the raw text of a
    malformed reply (it has no canonical form)."""
    if action.parse_error is not None:
        return action.text
    if action.tool_calls:
        calls = render_tool_calls(action.tool_calls)
        return f"{action.thought}\n{calls}" if action.thought else calls
    return action.final_answer or ""
