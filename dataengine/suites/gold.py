"""Gold solutions as text and as executed calls.

`gold_turns` renders a task's reference solution as the assistant turns a Hermes-format policy
would write; `replay` executes gold calls directly (no sandbox) to get their outputs and the
reference end state.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from dataengine.tools.registry import Toolbox, get_toolbox
from dataengine.types import Task, ToolCall

# Final text of a gold episode whose task is judged by end state only (no gold answer).
DEFAULT_REPLY = "Done."


def render_call(call: ToolCall, *, sort_keys: bool = True) -> str:
    """One Hermes tool call with canonical JSON: `<tool_call>{"arguments": {...}, "name": ...}</tool_call>`.

    sort_keys=False writes "name" first, the order the chat template and its instructions use.
    """
    body = json.dumps({"name": call.name, "arguments": call.arguments}, sort_keys=sort_keys, ensure_ascii=False)
    return f"<tool_call>{body}</tool_call>"


def gold_turns(task: Task, *, sort_keys: bool = True) -> list[str]:
    """The assistant texts that solve `task`: one tool call per turn, then the final answer.

    The final text is gold.answer, else metadata["gold_reply"] (a confirmation for tasks judged
    by end state), else "Done.". A multi-turn task (gold.turn_calls) gets each user turn's calls
    followed by "Done." (which starts the next user turn), the last turn's by the final text.
    """
    final = task.gold.answer
    if final is None:
        final = task.metadata.get("gold_reply", DEFAULT_REPLY)
    per_turn = task.gold.turn_calls or [task.gold.calls]
    turns: list[str] = []
    for t, calls in enumerate(per_turn):
        turns += [render_call(c, sort_keys=sort_keys) for c in calls]
        turns.append(str(final) if t == len(per_turn) - 1 else DEFAULT_REPLY)
    return turns


def replay(
    toolbox: Toolbox | str, calls: list[ToolCall], state: dict[str, Any] | None = None
) -> tuple[list[Any], dict[str, Any] | None]:
    """Execute `calls` in order by calling the tool functions directly.

    Returns (outputs, end_state): one output per call, and the tool state after the last call
    (a deep copy of `state` mutated by stateful tools; None for stateless toolboxes). An
    exception from a tool propagates: gold calls must all succeed.
    """
    box = get_toolbox(toolbox) if isinstance(toolbox, str) else toolbox
    end_state = copy.deepcopy(state)
    outputs: list[Any] = []
    for call in calls:
        if call.name not in box.tools:
            raise KeyError(f"toolbox {box.name!r} has no tool {call.name!r}")
        tool = box.tools[call.name]
        if tool.stateful:
            if end_state is None:
                raise ValueError(f"tool {call.name!r} is stateful but the task has no tool state")
            outputs.append(tool.fn(end_state, **call.arguments))
        else:
            outputs.append(tool.fn(**call.arguments))
    return outputs, end_state
