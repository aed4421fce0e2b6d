"""End state: the tool state after the episode equals the state after replaying the gold calls.

As tau-bench does it: hash both states and compare. The reference hash is
task.gold.end_state_hash when the suite stored it, else it is computed by replaying the gold
calls on a fresh copy of the initial state with a `replay` callable (ToolEnv.replay fits; the
default, `replay_in_process`, runs the toolbox's functions directly in this process).

A suite whose state carries bookkeeping that is not part of "the world" (BFCL's call log)
names the part to compare in task.metadata["state_view_key"].
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dataengine.types import Episode, Task, ToolCall, Verdict, stable_hash
from dataengine.verifiers.base import not_applicable, verdict

Replay = Callable[[Task, list[ToolCall]], "dict[str, Any] | None"]

STATE_VIEW_KEY = "state_view_key"


def state_view(task: Task, state: dict[str, Any] | None) -> Any:
    """The part of a tool state that end-state comparison looks at (all of it by default)."""
    key = task.metadata.get(STATE_VIEW_KEY)
    if key is None or state is None:
        return state
    return state.get(key)


def end_state_hash(task: Task, state: dict[str, Any] | None) -> str:
    """stable_hash of the compared part of `state`."""
    return stable_hash(state_view(task, state))


def replay_in_process(task: Task, calls: list[ToolCall]) -> dict[str, Any] | None:
    """Run `calls` on a deep copy of the task's initial state with its toolbox, in this process.

    A call that raises leaves the state as the tool left it and the replay goes on, as an
    environment would after an error observation.
    """
    from dataengine.tools.registry import get_toolbox

    toolbox = get_toolbox(task.toolbox)
    # states are JSON by contract; a JSON round trip copies big ones faster than deepcopy
    initial = toolbox.initial_state(task)
    state = None if initial is None else json.loads(json.dumps(initial))
    for call in calls:
        tool = toolbox.tools.get(call.name)
        if tool is None:
            continue
        try:
            if tool.stateful:
                tool.fn(state, **call.arguments)
            else:
                tool.fn(**call.arguments)
        except Exception:  # noqa: BLE001 - a failing gold call is replayed as the env would run it
            continue
    return state


def reference_hash(task: Task, replay: Replay | None = None) -> str | None:
    """The gold end-state hash: stored, or replayed with `replay` (default: in process)."""
    if task.gold.end_state_hash is not None:
        return task.gold.end_state_hash
    if task.initial_state is None and task.metadata.get(STATE_VIEW_KEY) is None and not task.metadata.get("stateful"):
        return None
    state = (replay or replay_in_process)(task, list(task.gold.calls))
    return end_state_hash(task, state)


class EndStateVerifier:
    """Hash of the episode's final tool state vs the gold end-state hash.

    replay: (task, calls) -> final state, used only when the task stores no end_state_hash.
    Replayed hashes are cached per (task id, toolbox, gold calls). Not applicable to stateless tasks.
    details: expected, got (the two hashes).
    """

    name = "end_state"
    version = "1"

    def __init__(self, replay: Replay | None = None) -> None:
        self.replay = replay
        self._cache: dict[tuple, str | None] = {}

    def expected(self, task: Task) -> str | None:
        if task.gold.end_state_hash is not None:
            return task.gold.end_state_hash
        # the id alone is not enough: hand-made or perturbed tasks may reuse an id
        key = (task.id, task.toolbox, stable_hash([c.key() for c in task.gold.calls]), task.initial_state is None)
        if key not in self._cache:
            self._cache[key] = reference_hash(task, self.replay)
        return self._cache[key]

    def verify(self, episode: Episode) -> Verdict:
        expected = self.expected(episode.task)
        if expected is None:
            return not_applicable(self.name, self.version, "task has no tool state")
        if episode.final_state is None:
            return verdict(self.name, self.version, False, expected=expected, got=None)
        got = end_state_hash(episode.task, episode.final_state)
        return verdict(self.name, self.version, got == expected, expected=expected, got=got)
