"""Multi-turn verdicts, judged turn by turn as BFCL's multi-turn checker does.

For a task with per-turn gold (`task.gold.turn_calls`), the episode passes when it finished
every user turn (`episode.done`, one turn per gold turn) and, for each turn t whose gold calls
are not empty:
- the episode called at least one tool in turn t ("empty_turn" otherwise);
- its tool state at the end of turn t equals the state after the gold calls of turns 0..t
  (the compared part: `state_view`, as for end_state; "state_mismatch" otherwise);
- every result of turn t's gold calls (run on the gold state of that point) is among the
  results of the episode's calls so far, turns 0..t, as a multiset, order ignored
  ("response_mismatch" otherwise).
A turn with no gold calls (where the right move is to ask or to say a function is missing) is
not checked, but its calls still change the state the next turns are judged on.

Results are compared as canonical JSON of the tool output (a failed call: its status and the
call itself). The gold runs in this process with the task's toolbox (`run_turns`), once per
task.
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from typing import Any

from dataengine.types import Action, Episode, Step, Task, ToolCall, ToolResult, Verdict, canonical_json, stable_hash
from dataengine.verifiers.base import not_applicable, verdict
from dataengine.verifiers.end_state import end_state_hash

# The reply that closes each turn of an episode built from calls alone.
TURN_REPLY = "Done."


def _copy(state: Any) -> Any:
    return None if state is None else json.loads(json.dumps(state))


def run_calls_in_process(task: Task, calls: list[ToolCall], state: dict[str, Any] | None) -> tuple[list[ToolResult], Any]:
    """Run `calls` in order with the task's toolbox in this process, as BFCL's executor does
    (no argument schema check: the tool decides). Returns (one ToolResult per call, the state
    after them); a call that raises leaves the state as it was before it, as in the sandbox."""
    from dataengine.tools.registry import get_toolbox

    toolbox = get_toolbox(task.toolbox)
    results = []
    for call in calls:
        tool = toolbox.tools.get(call.name)
        if tool is None:
            results.append(ToolResult(call=call, status="unknown_tool", error=f"unknown tool {call.name!r}"))
            continue
        trial = _copy(state) if tool.stateful else None
        try:
            output = tool.fn(trial, **call.arguments) if tool.stateful else tool.fn(**call.arguments)
        except Exception as exc:  # noqa: BLE001 - a failing tool is an observation
            results.append(ToolResult(call=call, status="exception", error=f"{type(exc).__name__}: {exc}"))
            continue
        if tool.stateful:
            state = trial
        results.append(ToolResult(call=call, status="ok", output=json.loads(json.dumps(output, default=str))))
    return results, state


def run_turns(task: Task, turns: list[list[ToolCall]], reply: str = TURN_REPLY) -> Episode:
    """The episode of a task whose turn t makes the calls `turns[t]` (one step, all calls), then
    replies `reply`, executed in this process (run_calls_in_process). Done when every turn of
    the task was played."""
    from dataengine.tools.registry import get_toolbox

    initial = get_toolbox(task.toolbox).initial_state(task)
    state = _copy(initial)
    steps: list[Step] = []
    turn_states: list[Any] = []
    for t, calls in enumerate(turns):
        if t > 0:
            turn_states.append(state)
        if calls:
            results, state = run_calls_in_process(task, list(calls), state)
            steps.append(Step(action=Action(text="", tool_calls=list(calls)), results=results, turn=t))
        steps.append(Step(action=Action(text=reply, final_answer=reply), turn=t))
    return Episode(task=task, steps=steps, final_state=state, done=len(turns) == task.num_turns, turn_states=turn_states)


def result_key(result: ToolResult) -> str:
    """What a call's result is compared by: canonical JSON of the output, or, for a call that
    failed, its status and the call (the same failing call gives the same key)."""
    if result.ok:
        return canonical_json(result.output)
    return f"error:{result.status}:{result.call.key()}"


def turns_of(episode: Episode) -> list[list[Step]]:
    """The episode's steps grouped by user turn: one list per turn reached."""
    count = max([len(episode.turn_states) + 1, *(s.turn + 1 for s in episode.steps)])
    out: list[list[Step]] = [[] for _ in range(count)]
    for step in episode.steps:
        out[step.turn].append(step)
    return out


@dataclass(frozen=True)
class TurnReference:
    """The gold after one user turn: hash of the compared state, and the keys of its results."""

    state_hash: str
    results: tuple[str, ...]


def reference_turns(task: Task) -> list[TurnReference]:
    """The gold of every turn of `task` (run_turns on gold.turn_calls)."""
    gold = run_turns(task, [list(turn) for turn in task.gold.turn_calls])
    out = []
    for t, steps in enumerate(turns_of(gold)):
        state = gold.turn_states[t] if t < len(gold.turn_states) else gold.final_state
        out.append(TurnReference(end_state_hash(task, state), tuple(result_key(r) for s in steps for r in s.results)))
    return out


class MultiTurnVerifier:
    """Per-turn state and results against the per-turn gold (module docstring gives the rules).

    Not applicable to tasks without gold.turn_calls. score: the share of user turns that passed
    before the first failure (1.0 when passed). details: turns, error_type (unfinished,
    empty_turn, state_mismatch, response_mismatch) and turn (the failing one), error, and for
    response_mismatch the missing result keys.
    """

    name = "multi_turn"
    version = "1"

    def __init__(self) -> None:
        self._cache: dict[tuple, list[TurnReference]] = {}

    def reference(self, task: Task) -> list[TurnReference]:
        key = (task.id, task.toolbox, stable_hash([[c.key() for c in turn] for turn in task.gold.turn_calls]),
               task.initial_state is None)
        if key not in self._cache:
            self._cache[key] = reference_turns(task)
        return self._cache[key]

    def verify(self, episode: Episode) -> Verdict:
        task = episode.task
        gold = task.gold.turn_calls
        if not gold:
            return not_applicable(self.name, self.version, "task has no per-turn gold")
        ref = self.reference(task)
        total = len(gold)
        turns = turns_of(episode)

        def fail(kind: str, turn: int, error: str, **more: Any) -> Verdict:
            score = 0.0 if kind == "unfinished" else turn / total
            return verdict(self.name, self.version, False, score=score, turns=total, error_type=kind,
                           turn=turn, error=error, **more)

        if len(turns) > total:
            return fail("unfinished", total, f"the episode went on to turn {len(turns) - 1}; the task has {total} turns")
        if not episode.done or len(turns) < total:
            return fail("unfinished", len(turns) - 1,
                        f"the episode ended in turn {len(turns) - 1} of {total} without finishing it"
                        + (" (truncated)" if episode.truncated else ""))
        seen: list[str] = []
        for t in range(total):
            seen += [result_key(r) for s in turns[t] for r in s.results]
            if not gold[t]:
                continue
            if not any(s.action.tool_calls and s.action.parse_error is None for s in turns[t]):
                return fail("empty_turn", t, f"no tool call in turn {t}, whose gold makes {len(gold[t])}")
            state = episode.turn_states[t] if t < total - 1 else episode.final_state
            if end_state_hash(task, state) != ref[t].state_hash:
                return fail("state_mismatch", t, f"the tool state after turn {t} differs from the gold's")
            missing = collections.Counter(ref[t].results) - collections.Counter(seen)
            if missing:
                return fail("response_mismatch", t,
                            f"{sum(missing.values())} result(s) of turn {t}'s gold calls are missing from the episode's results so far",
                            missing=sorted(missing.elements())[:5])
        return verdict(self.name, self.version, True, turns=total)
