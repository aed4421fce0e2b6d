"""ToolEnv: a functional tool-use environment that search can branch.

States are immutable values: `step(state, action)` returns a new state and never changes the
old one, so one node can be expanded many times and two branches never share tool-state
changes. Tool calls run in the Sandbox; `step_many` sends the calls of a whole batch of
expansions through one `Sandbox.call_many`, so they run in parallel.

Multi-turn: when the assistant ends its turn (a reply without tool calls) and there is a next
user turn, that turn starts instead of the episode ending: its user messages become the step's
observations and its functions join the offered tools. The next turn comes from the task's
schedule (`Task.user_turns`, see `scheduled_turn`) or from a `next_user_turn` hook given to
ToolEnv (a user simulator).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dataengine.parsing import EXPECTED, parse_action
from dataengine.tools.registry import get_toolbox
from dataengine.tools.sandbox import Sandbox
from dataengine.types import (
    Action,
    Episode,
    Message,
    Step,
    Task,
    ToolCall,
    ToolResult,
    UserTurn,
    canonical_json,
    stable_hash,
    user_turn_problem,
)

# Default cap on assistant steps per user turn (per episode for single-turn tasks).
MAX_STEPS = 8


@dataclass(frozen=True, eq=True)
class EnvState:
    """One point of an episode.

    task: the task as offered at this point: the task given to reset, or from a user turn that
        added functions on, a copy whose `tools` include them (same id, gold and schedule).
    messages: the conversation so far (the task's messages, then assistant and tool turns, and
        the user messages of each later turn).
    tool_state: the mutable tool state as a JSON object (None for stateless toolboxes); never
        mutated in place: each step that changes it makes a new dict.
    steps: the history, for building an Episode.
    done: the episode ended with a final answer of its last user turn; truncated: it reached
        the step limit of a turn.
    turn: the user turn the conversation is in (0-based).
    turn_start: index in `steps` of the first step of the current turn.
    turn_states: the tool state at the end of each finished turn (shared, never mutated).
    """

    task: Task
    messages: tuple[Message, ...]
    tool_state: dict[str, Any] | None
    steps: tuple[Step, ...] = ()
    done: bool = False
    truncated: bool = False
    turn: int = 0
    turn_start: int = 0
    turn_states: tuple[dict[str, Any] | None, ...] = ()

    __hash__ = None  # type: ignore[assignment]  # holds dicts; compare, do not hash

    @property
    def terminal(self) -> bool:
        """The episode is over (final answer of the last turn, or step limit)."""
        return self.done or self.truncated

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def turn_steps(self) -> int:
        """Steps taken in the current user turn."""
        return len(self.steps) - self.turn_start

    @cached_property
    def state_hash(self) -> str:
        """stable_hash of the tool state: equal hashes mean equal environments."""
        return stable_hash(self.tool_state)

    @cached_property
    def prefix_hash(self) -> str:
        """stable_hash of the conversation so far (the prompt the policy continues)."""
        return stable_hash([m.model_dump(mode="json") for m in self.messages])

    def episode(self) -> Episode:
        """The trajectory up to this state."""
        return Episode(
            task=self.task,
            steps=list(self.steps),
            final_state=copy.deepcopy(self.tool_state),
            done=self.done,
            truncated=self.truncated,
            turn_states=list(self.turn_states),
        )


NextUserTurn = Callable[[EnvState], "UserTurn | None"]
"""A hook that gives the next user turn of an episode: called with the state right after the
assistant's reply that ends the current turn (its `turn` is still the turn being ended);
returns the UserTurn to start, or None to end the episode. For search it should be a function
of the state (seed any sampling from `state.prefix_hash`), so that a branch replays the same."""


def scheduled_turn(state: EnvState) -> UserTurn | None:
    """The default NextUserTurn: the task's own schedule, `task.user_turns[state.turn]`."""
    turns = state.task.user_turns
    return turns[state.turn] if state.turn < len(turns) else None


def schedule_errors(task: Task, turns: Sequence[UserTurn] | None = None, first: int = 0) -> list[str]:
    """Problems of user turns (default: the task's schedule) against the task's toolbox: every
    function a turn adds must be a tool of the toolbox. Each names the task and the field."""
    box = get_toolbox(task.toolbox)
    out = []
    for i, turn in enumerate(task.user_turns if turns is None else turns, start=first):
        for k, spec in enumerate(turn.tools):
            if spec.name not in box.tools:
                out.append(f"task {task.id!r}: user_turns[{i}].tools[{k}]: {spec.name!r} is not a tool of toolbox {task.toolbox!r}")
    return out


@dataclass(frozen=True)
class StepOutcome:
    """What one step gave.

    state: the new state.
    observations: the messages added after the assistant turn (tool results or a parser error).
    done: the episode is over (final answer or step limit): `state.terminal`.
    info: parse_error (str or None), statuses (one tool status per call), truncated (bool).
    """

    state: EnvState
    observations: list[Message]
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class ToolEnv:
    """Executes actions against a task's toolbox. Holds no episode state itself.

    sandbox: where tool calls run (shared, not owned: the caller closes it).
    max_steps: assistant steps per user turn after which an episode is truncated (for a
        single-turn task: per episode).
    next_user_turn: where the next user turn comes from when the assistant ends a turn
        (default `scheduled_turn`: the task's user_turns); a user simulator goes here.
    """

    def __init__(self, sandbox: Sandbox, max_steps: int = MAX_STEPS, next_user_turn: NextUserTurn | None = None) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.sandbox = sandbox
        self.max_steps = max_steps
        self.next_user_turn = next_user_turn or scheduled_turn

    def reset(self, task: Task) -> EnvState:
        """The initial state: the task's messages and a private copy of its initial tool state.

        A schedule whose turns add functions the toolbox lacks is refused here (ValueError naming
        the task and field), before any step."""
        if not isinstance(task, Task):
            raise TypeError(f"reset expects a Task, got {type(task).__name__}")
        box = get_toolbox(task.toolbox)
        if box.client is not None and not task.tools:  # a served toolbox offers what its server lists
            task = task.model_copy(update={"tools": box.specs()})
        initial = box.initial_state(task)
        if task.user_turns:
            problems = schedule_errors(task)
            if problems:
                raise ValueError(problems[0])
        return EnvState(task=task, messages=tuple(task.messages), tool_state=copy.deepcopy(initial))

    def step(self, state: EnvState, action: Action | str) -> StepOutcome:
        """Apply one assistant turn. A str is parsed first (see dataengine.parsing)."""
        return self.step_many([state], [action])[0]

    def step_many(self, states: Sequence[EnvState], actions: Sequence[Action | str]) -> list[StepOutcome]:
        """Apply one action to each state. The k-th tool call of every action runs in the same
        `Sandbox.call_many` round (calls of one action run in order, each on the state the
        previous one left), so a batch of expansions costs as many rounds as its longest action.
        """
        if len(states) != len(actions):
            raise ValueError(f"step_many got {len(states)} states but {len(actions)} actions")
        parsed = [self._action(a) for a in actions]
        for i, s in enumerate(states):
            if not isinstance(s, EnvState):
                raise TypeError(f"states[{i}] is a {type(s).__name__}, not an EnvState")
            if s.terminal:
                raise ValueError(f"states[{i}] is terminal (done={s.done}, truncated={s.truncated}); it cannot step")
        tool_states = [s.tool_state for s in states]
        results: list[list[ToolResult]] = [[] for _ in states]
        rounds = max((len(a.tool_calls) for a in parsed if a.parse_error is None), default=0)
        for k in range(rounds):
            batch = [i for i, a in enumerate(parsed) if a.parse_error is None and k < len(a.tool_calls)]
            outs = self._call_many(
                [(states[i].task.toolbox, parsed[i].tool_calls[k], tool_states[i]) for i in batch]
            )
            for i, (result, new_state) in zip(batch, outs):
                results[i].append(result)
                tool_states[i] = new_state
        return [self._outcome(s, a, r, t) for s, a, r, t in zip(states, parsed, results, tool_states)]

    def replay(self, task: Task, calls: list[ToolCall]) -> dict[str, Any] | None:
        """The tool state after running `calls` in order on a fresh initial state (end-state
        verifiers compare it with the episode's final state). Failed calls leave it unchanged."""
        state = self.reset(task).tool_state
        for call in calls:
            _, state = self._call_many([(task.toolbox, call, state)])[0]
        return state

    def _call_many(self, items: list[tuple[str, ToolCall, dict[str, Any] | None]]) -> list[tuple[ToolResult, Any]]:
        """Sandbox.call_many, except that calls of a toolbox with a client (an MCP server) go
        to that client; results in input order."""
        out: list[Any] = [None] * len(items)
        by_client: dict[int, tuple[Any, list[int]]] = {}
        local = []
        for i, (name, _, _) in enumerate(items):
            try:
                client = get_toolbox(name).client
            except KeyError:  # the sandbox answers an unknown toolbox with an unknown_tool result
                client = None
            if client is None:
                local.append(i)
            else:
                by_client.setdefault(id(client), (client, []))[1].append(i)
        if local:
            for i, o in zip(local, self.sandbox.call_many([items[i] for i in local])):
                out[i] = o
        for client, indices in by_client.values():
            for i, o in zip(indices, client.call_many([items[i][1:] for i in indices])):
                out[i] = o
        return out

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _action(action: Action | str) -> Action:
        if isinstance(action, str):
            return parse_action(action)
        if isinstance(action, Action):
            return action
        raise TypeError(f"an action must be an Action or model text (str), got {type(action).__name__}")

    def _outcome(
        self, state: EnvState, action: Action, results: list[ToolResult], tool_state: dict[str, Any] | None
    ) -> StepOutcome:
        if action.parse_error is not None:
            hint = "" if EXPECTED in action.parse_error else f" ({EXPECTED})"
            observations = [Message(role="tool", name="parser", content=f"Error: {action.parse_error}{hint}")]
        else:
            observations = [observation(r) for r in results]
        done = action.is_final
        task, turn, turn_start, turn_states = state.task, state.turn, state.turn_start, state.turn_states
        steps = state.steps + (Step(action=action, observations=observations, results=results, turn=turn),)
        if done:
            ended = EnvState(task=task, messages=state.messages + (action.to_message(),), tool_state=tool_state,
                             steps=steps, turn=turn, turn_start=turn_start, turn_states=turn_states)
            nxt = self._next_turn(ended)
            if nxt is not None:
                done = False
                observations = list(nxt.messages)
                steps = steps[:-1] + (steps[-1].model_copy(update={"observations": observations}),)
                if nxt.tools:
                    task = task.offering(nxt.tools, state.turn if nxt is scheduled_turn(ended) else None)
                turn, turn_start, turn_states = turn + 1, len(steps), turn_states + (tool_state,)
        truncated = not done and len(steps) - turn_start >= self.max_steps
        new_state = EnvState(
            task=task,
            messages=state.messages + (action.to_message(), *observations),
            tool_state=tool_state,
            steps=steps,
            done=done,
            truncated=truncated,
            turn=turn,
            turn_start=turn_start,
            turn_states=turn_states,
        )
        info = {
            "parse_error": action.parse_error,
            "statuses": [r.status for r in results],
            "truncated": truncated,
        }
        return StepOutcome(state=new_state, observations=observations, done=new_state.terminal, info=info)


    def _next_turn(self, ended: EnvState) -> UserTurn | None:
        nxt = self.next_user_turn(ended)
        if nxt is None:
            return None
        if not isinstance(nxt, UserTurn):
            raise TypeError(f"next_user_turn must return a UserTurn or None, got {type(nxt).__name__}")
        if nxt is not scheduled_turn(ended):  # the schedule was checked at construction and reset
            problem = user_turn_problem(nxt, {t.name for t in ended.task.tools})
            problems = [f"task {ended.task.id!r}: next_user_turn gave turn {ended.turn + 1} with {problem}"] if problem else []
            problems += schedule_errors(ended.task, [nxt], first=ended.turn)
            if problems:
                raise ValueError(problems[0])
        return nxt


def observation(result: ToolResult) -> Message:
    """The tool message for a result: canonical JSON of the output, or `Error: <status>: <message>`."""
    if result.ok:
        content = canonical_json(result.output)
    else:
        content = f"Error: {result.status}: {result.error}"
    return Message(role="tool", name=result.call.name, content=content)
