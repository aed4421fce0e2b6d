"""How well a policy writes tool calls: sample K first replies per task, parse, and count.

Used by `dataengine policy probe` and the docs' measured figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataengine.parsing import parse_action
from dataengine.policy.base import Conversation, Policy
from dataengine.types import Task


def tool_call_rate(
    policy: Policy,
    tasks: Sequence[Task],
    *,
    k: int = 4,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Sample `k` first replies for each task and report rates over all samples.

    parsed_call: the reply parsed into at least one tool call (no parse error);
    known_tool: ... and every called tool is one the task offers;
    gold_first_call: ... and the first call equals the task's first gold call (name and arguments,
        numbers compared as floats);
    final_answer / parse_error: the reply was a final answer / malformed;
    examples: the first few replies, for a look.
    """
    if not tasks:
        raise ValueError("tool_call_rate needs at least one task")
    out = policy.sample([Conversation.from_task(t) for t in tasks], k, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    counts = {"parsed_call": 0, "known_tool": 0, "gold_first_call": 0, "final_answer": 0, "parse_error": 0}
    examples = []
    for task, row in zip(tasks, out):
        names = {t.name for t in task.tools}
        gold = task.gold.calls[0] if task.gold.calls else None
        for sample in row:
            action = parse_action(sample.text)
            if len(examples) < 6:
                examples.append(sample.text)
            if action.parse_error is not None:
                counts["parse_error"] += 1
            elif action.tool_calls:
                counts["parsed_call"] += 1
                if all(c.name in names for c in action.tool_calls):
                    counts["known_tool"] += 1
                first = action.tool_calls[0]
                if gold is not None and first.name == gold.name and _same_args(first.arguments, gold.arguments):
                    counts["gold_first_call"] += 1
            else:
                counts["final_answer"] += 1
    total = len(tasks) * k
    return {"samples": total, **{f"{name}_rate": n / total for name, n in counts.items()}, **policy.stats.as_dict(), "examples": examples}


def _same_args(got: dict[str, Any], want: dict[str, Any]) -> bool:
    if set(got) != set(want):
        return False
    for key, value in want.items():
        other = got[key]
        try:
            if float(other) != float(value):
                return False
        except (TypeError, ValueError):
            if other != value:
                return False
    return True
