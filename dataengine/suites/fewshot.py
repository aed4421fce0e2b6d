"""Worked example episodes for the chat template, drawn from the suites' own generators.

SmolLM2-135M writes tool calls when it has seen a few episodes like the task in front of it as
real chat turns (user, assistant `<tool_call>`, tool `<tool_response>`, assistant answer); a block
of example text inside the system prompt did not do it (0/64 calls on arithmetic, see
docs/policy.md). So each built-in toolbox gets a short set of episodes: task prompts from a seed
no split uses, the gold calls, the outputs the real tools return (replayed, not written by hand)
and the gold answer. The arithmetic set includes a `notool` episode so that "answer directly"
is shown next to "call a tool".

The chat template picks a set by the tools a conversation offers (`example_sets`): the first
offered tool that belongs to a set's toolbox picks it, and the arithmetic set stands in when none
matches (for instance BFCL's tools), as a demonstration of the format. Within a set, episodes
that call a tool the conversation does not offer are skipped.

A user's toolbox (a tools file, `docs/your-own-tools.md`) brings its own episodes: the file's
`EXAMPLES`, replayed through its tools when it loads (`user_episode`). `user_example_sets` turns
them into sets placed after the built-in ones, for the policy of a run given those tools files;
a run without tools files renders exactly the built-in template.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dataengine.suites.gold import DEFAULT_REPLY, gold_turns, render_call, replay
from dataengine.types import Task, ToolCall, canonical_json

Episode = Sequence[Mapping[str, str]]  # role/content dicts: user, then assistant/tool turns


@dataclass(frozen=True)
class ExampleSet:
    """Worked episodes for one toolbox.

    tools: the tool names that select this set (the first offered one that belongs to a set wins).
    episodes: shown in order, skipping any that calls a tool the conversation does not offer
        (so the model is never shown a call it cannot make), at most `max_shown` of them.
    """

    tools: Sequence[str]
    episodes: Sequence[Episode]
    max_shown: int | None = None


# Seed for example tasks: no split or test uses it, so examples are not evaluation tasks.
EXAMPLE_SEED = 7_919
# Per toolbox: (suite, number of gold calls[, task kind or template]) picks, in the order shown. The first
# task of that suite with that many calls (and kind) is taken; the next one when a pick repeats.
# Arithmetic shows each question template once (probes in docs/policy.md: two examples of one
# template gave 31% calls at temperature 0.7, three templates 84%); its notool pick is a
# non-arithmetic question, because "what is 8 times 7" answered directly taught the model to
# answer arithmetic without tools.
EXAMPLE_PLAN: dict[str, list[tuple]] = {
    "arithmetic": [
        ("notool", 0, "capital"),
        ("arithmetic", 2, "what_is"),
        ("arithmetic", 1, "calculate"),
        ("arithmetic", 2, "steps"),
    ],
    "units": [("units", 1), ("units", 1)],
    "shop": [("shop", 2), ("shop", 1)],
    # Chains offer 6 of 14 tools per task: a pool of episodes, of which the template shows the
    # first two whose tools are all offered.
    "chains": [("chains", 2)] * 12,
}
MAX_SHOWN = {"chains": 2}
FALLBACK = "arithmetic"
_POOL = 200  # tasks generated per suite to find the picks in


def episode_messages(task: Task) -> list[dict[str, str]]:
    """The gold episode of `task` as chat messages, with real tool outputs."""
    outputs, _ = replay(task.toolbox, task.gold.calls, task.initial_state)
    *calls, final = gold_turns(task, sort_keys=False)  # name first, as the template writes calls
    messages = [{"role": "user", "content": task.messages[-1].content}]
    for call, output in zip(calls, outputs):
        messages.append({"role": "assistant", "content": call})
        messages.append({"role": "tool", "content": canonical_json(output)})
    messages.append({"role": "assistant", "content": final})
    return messages


@functools.cache
def _pool(suite: str) -> tuple[Task, ...]:
    from dataengine.suites import generate_suite

    return tuple(generate_suite(suite, _POOL, 0, seed=EXAMPLE_SEED))


def _pick(suite: str, n_calls: int, kind: str | None, skip: int) -> Task:
    matches = [
        t
        for t in _pool(suite)
        if len(t.gold.calls) == n_calls and kind in (None, t.metadata.get("kind"), t.metadata.get("template"))
    ]
    if len(matches) <= skip:
        raise ValueError(f"suite {suite!r} has fewer than {skip + 1} tasks with {n_calls} gold calls (kind {kind}) in {_POOL}")
    return matches[skip]


@functools.cache
def _examples(toolbox: str) -> list[list[dict[str, str]]]:
    seen: dict[tuple[str, int], int] = {}
    episodes = []
    for suite, n_calls, *kind in EXAMPLE_PLAN[toolbox]:
        pick = (suite, n_calls, kind[0] if kind else None)
        skip = seen.get(pick, 0)
        seen[pick] = skip + 1
        episodes.append(episode_messages(_pick(*pick, skip)))
    return episodes


def example_sets() -> list[ExampleSet]:
    """An ExampleSet for every built-in toolbox; the fallback first.

    Deterministic; built once per process (a few hundred generated tasks and replayed calls).
    """
    from dataengine.tools.registry import get_toolbox

    order = [FALLBACK] + [name for name in EXAMPLE_PLAN if name != FALLBACK]
    return [ExampleSet(list(get_toolbox(name).tools), _examples(name), MAX_SHOWN.get(name)) for name in order]


USER_EXAMPLE_KEYS = ("user", "calls", "answer", "initial_state")


def user_episode(toolbox: Any, example: Mapping[str, Any]) -> list[dict[str, str]]:
    """One entry of a tools file's `EXAMPLES` as chat messages, its calls replayed through the
    toolbox's tools (direct calls, no sandbox) from the example's `initial_state`, else the
    toolbox's state at reset. ValueError (or the tool's own error) names what is wrong."""
    if not isinstance(example, Mapping):
        raise ValueError(f"an example is a dict with keys {', '.join(USER_EXAMPLE_KEYS)}, not {type(example).__name__}")
    unknown = sorted(set(example) - set(USER_EXAMPLE_KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; an example has {', '.join(USER_EXAMPLE_KEYS)}")
    user, answer = example.get("user"), example.get("answer", DEFAULT_REPLY)
    if not isinstance(user, str) or not user.strip():
        raise ValueError("'user' must be the request as a non-empty string")
    if not isinstance(answer, str) or not answer:
        raise ValueError("'answer' must be the final reply as a non-empty string")
    calls = [ToolCall.model_validate(c) for c in example.get("calls", [])]
    state = example.get("initial_state")
    if state is None:
        state = toolbox.initial_state(None)
    outputs, _ = replay(toolbox, calls, state)
    messages = [{"role": "user", "content": user}]
    for call, output in zip(calls, outputs):
        messages.append({"role": "assistant", "content": render_call(call, sort_keys=False)})
        messages.append({"role": "tool", "content": canonical_json(output)})
    messages.append({"role": "assistant", "content": answer})
    return messages


def user_example_sets(toolboxes: Sequence[str]) -> list[ExampleSet]:
    """An ExampleSet for each of `toolboxes` (names) that has example episodes, in order."""
    from dataengine.tools.registry import get_toolbox

    boxes = [get_toolbox(name) for name in dict.fromkeys(toolboxes)]
    return [ExampleSet(list(box.tools), [list(e) for e in box.examples]) for box in boxes if box.examples]
