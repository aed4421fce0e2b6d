"""The core model shared by every part of the engine (ARCHITECTURE.md).

Plain pydantic models: they validate task files and configs, and serialise to JSON for the
store. Everything that search branches on is treated as immutable once built.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["system", "user", "assistant", "tool"]
Split = Literal["train", "heldout"]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the one form that is hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def stable_hash(value: Any) -> str:
    """sha256 (hex, 16 chars) of the canonical JSON of `value`."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


MAX_ARGUMENT_DEPTH = 32
"""Tool-call arguments nest at most this many containers deep (the arguments object is level 1)."""


def argument_problem(arguments: Any) -> str | None:
    """Why `arguments` cannot be stored as standard JSON, or None: containers nested deeper than
    MAX_ARGUMENT_DEPTH, or a NaN/infinite float. Iterative, so deep input cannot recurse."""
    stack = [(arguments, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return f"hold {value!r}, which is not a finite number (NaN and Infinity are not JSON)"
        if isinstance(value, (dict, list, tuple)):
            if depth > MAX_ARGUMENT_DEPTH:
                return f"nest deeper than {MAX_ARGUMENT_DEPTH} levels"
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return None


class ToolCall(BaseModel):
    """One call of a tool: a name and a JSON object of arguments (finite, at most
    MAX_ARGUMENT_DEPTH deep: checked on construction so every call can be stored and keyed)."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("arguments")
    @classmethod
    def _storable(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = argument_problem(value)
        if problem:
            raise ValueError(f"tool-call arguments {problem}")
        return value

    def key(self) -> str:
        """Normalised identity of the call, used to merge duplicate actions. The validated
        arguments are at most MAX_ARGUMENT_DEPTH deep, so this recursion is bounded."""
        return canonical_json({"name": self.name, "arguments": self.arguments})


class Message(BaseModel):
    """One chat message. `tool_calls` only on assistant turns; `name` names the tool on tool turns."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    name: str | None = None

    def to_chat(self) -> dict[str, Any]:
        """The dict form that Hugging Face chat templates and TRL datasets read."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.name is not None:
            out["name"] = self.name
        return out


class ToolSpec(BaseModel):
    """A tool as the model sees it: name, description and JSON schema of its parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}, "required": []}
    )

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI/HF `tools=` form: {"type": "function", "function": {...}}."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class Action(BaseModel):
    """One assistant turn parsed from model text.

    Exactly one of: tool calls (one or more), a final answer, or a parse error. A malformed
    reply is still an Action (with `parse_error` set) so the episode can go on.
    """

    text: str
    thought: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    final_answer: str | None = None
    parse_error: str | None = None

    @property
    def is_final(self) -> bool:
        return self.parse_error is None and not self.tool_calls and self.final_answer is not None

    def key(self) -> str:
        """Normalised identity: equal keys mean the same action (duplicates are merged)."""
        if self.parse_error is not None:
            return "error:" + " ".join(self.text.split())
        if self.tool_calls:
            return "calls:" + "|".join(c.key() for c in self.tool_calls)
        return "final:" + " ".join((self.final_answer or "").split()).lower()

    def to_message(self) -> Message:
        """The assistant message this action adds to the conversation (the raw text)."""
        return Message(role="assistant", content=self.text, tool_calls=list(self.tool_calls))


class Gold(BaseModel):
    """What a correct episode looks like.

    answer: the expected final answer text, if the task has one.
    calls: reference tool calls in order (replayed to get the reference end state).
    acceptable: BFCL-style alternatives: per call, each parameter maps to a list of acceptable
        values ("" in the list means the parameter may be omitted). Empty when not used.
    needs_tool: whether a correct episode calls any tool at all (the "when" axis).
    end_state_hash: stable_hash of the tool state after replaying `calls`, for stateful suites.
    turn_calls: multi-turn tasks: the reference calls of each user turn (turn 0 first; a turn
        may have none). `calls` is then their concatenation (filled in when left empty). Empty
        for single-turn tasks.
    """

    answer: str | None = None
    calls: list[ToolCall] = Field(default_factory=list)
    acceptable: list[dict[str, Any]] = Field(default_factory=list)
    needs_tool: bool = True
    end_state_hash: str | None = None
    turn_calls: list[list[ToolCall]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _calls_of_turns(self) -> Gold:
        if self.turn_calls:
            flat = [c for turn in self.turn_calls for c in turn]
            if not self.calls:
                self.calls = flat
            elif self.calls != flat:
                raise ValueError("gold.calls must be the concatenation of gold.turn_calls (or left empty)")
        return self


class UserTurn(BaseModel):
    """A later user turn of a multi-turn task (turn 1, 2, ...).

    messages: what the user says at the start of the turn (role "user", non-empty content).
    tools: functions offered from this turn on, beside the ones already offered (BFCL's
        held-back functions); they must be tools of the task's toolbox.
    """

    model_config = ConfigDict(extra="forbid")

    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)


class Task(BaseModel):
    """One episode to solve.

    toolbox: name of a registered Toolbox that supplies the executable tools and, for stateful
        suites, the initial tool state (dataengine.tools.registry).
    tools: the schemas shown to the model (a subset of, or equal to, the toolbox's tools).
    initial_state: the mutable tool state at reset (a JSON object), or None for stateless tools.
    user_turns: the later user turns of a multi-turn task, in order (turn 1 is user_turns[0]):
        ToolEnv starts the next one when the assistant ends its turn with a reply without tool
        calls. Empty for single-turn tasks. When gold.turn_calls is set it has one list per turn
        (1 + len(user_turns)).
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    suite: str
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    toolbox: str
    gold: Gold = Field(default_factory=Gold)
    split: Split = "train"
    initial_state: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    user_turns: list[UserTurn] = Field(default_factory=list)

    @model_validator(mode="after")
    def _schedule(self) -> Task:
        problem = schedule_problem(self)
        if problem is not None:
            raise ValueError(f"task {self.id!r}: {problem}")
        return self

    @property
    def num_turns(self) -> int:
        """User turns of the task's schedule: 1 + len(user_turns)."""
        return 1 + len(self.user_turns)

    def offering(self, tools: list[ToolSpec], scheduled: int | None = None) -> Task:
        """A copy that also offers `tools` (same id, gold and number of turns): the task as the
        model sees it once a user turn added them. `scheduled`: the index in user_turns of the
        turn they come from, which the copy lists without them (they are offered already)."""
        turns = list(self.user_turns)
        if scheduled is not None:
            turns[scheduled] = turns[scheduled].model_copy(update={"tools": []})
        return self.model_copy(update={"tools": [*self.tools, *tools], "user_turns": turns})


def schedule_problem(task: Task) -> str | None:
    """What is wrong with the user-turn schedule of `task` ("<field>: <problem>"), or None.

    Checked without the toolbox: every later turn says something as the user, a turn offers no
    tool already offered, and gold.turn_calls (when set) has one list per turn.
    """
    offered = {t.name for t in task.tools}
    for i, turn in enumerate(task.user_turns):
        problem = user_turn_problem(turn, offered)
        if problem is not None:
            return f"user_turns[{i}].{problem}"
        offered.update(t.name for t in turn.tools)
    if task.gold.turn_calls and len(task.gold.turn_calls) != task.num_turns:
        return (f"gold.turn_calls: {len(task.gold.turn_calls)} turns of gold calls for a task of "
                f"{task.num_turns} user turns (1 + len(user_turns))")
    return None


ToolStatus = Literal[
    "ok",
    "exception",
    "timeout",
    "crash",
    "memory",
    "output_too_large",
    "unknown_tool",
    "bad_arguments",
]


class ToolResult(BaseModel):
    """What executing one ToolCall gave. `output` is JSON-able; `error` is set unless status is ok."""

    call: ToolCall
    status: ToolStatus
    output: Any = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Step(BaseModel):
    """One step of an episode: the action, the observations it produced, and the tool results.

    turn: the user turn (0-based) the action was taken in. A reply that ends a turn of a
    multi-turn task has the next turn's user messages as its observations.
    """

    action: Action
    observations: list[Message] = Field(default_factory=list)
    results: list[ToolResult] = Field(default_factory=list)
    turn: int = 0


class Episode(BaseModel):
    """A whole trajectory of a task, as verifiers and dataset derivation read it.

    final_state: the tool state at the end (None for stateless tools).
    done: the episode ended by a final answer (of the last user turn); truncated: it hit max
        steps or a budget.
    turn_states: multi-turn tasks: the tool state at the end of each user turn that was
        finished and followed by another (so turn t's is turn_states[t]; the last turn's is
        final_state). Shared with the env's states: do not mutate.
    """

    task: Task
    steps: list[Step] = Field(default_factory=list)
    final_state: dict[str, Any] | None = None
    done: bool = False
    truncated: bool = False
    turn_states: list[dict[str, Any] | None] = Field(default_factory=list)

    @property
    def final_answer(self) -> str | None:
        for step in reversed(self.steps):
            if step.action.is_final:
                return step.action.final_answer
        return None

    @property
    def calls(self) -> list[ToolCall]:
        return [c for s in self.steps for c in s.action.tool_calls]


class Verdict(BaseModel):
    """What a verifier says of a step or an episode.

    score: in [0, 1], 1 best (docs/verifiers.md lists each verifier's range).
    passed: True/False, or None when the verifier does not apply.
    confidence: in [0, 1]; the cascade escalates when it is low.
    """

    name: str
    version: str
    score: float
    passed: bool | None
    confidence: float = 1.0
    details: dict[str, Any] = Field(default_factory=dict)


def user_turn_problem(turn: UserTurn, offered: set[str]) -> str | None:
    """What is wrong with one user turn ("<field>: <problem>", relative to the turn), or None:
    no message, a message that is not the user's or is empty, or a function already `offered`."""
    if not turn.messages:
        return "messages: a user turn needs at least one message"
    for j, m in enumerate(turn.messages):
        if m.role != "user":
            return f"messages[{j}].role: a user turn holds user messages, got {m.role!r}"
        if not m.content.strip():
            return f"messages[{j}].content: the user message is empty"
    names = set(offered)
    for k, spec in enumerate(turn.tools):
        if spec.name in names:
            return f"tools[{k}]: tool {spec.name!r} is already offered before this turn"
        names.add(spec.name)
    return None
