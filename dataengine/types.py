"""The core model shared by every part of the engine (DESIGN.md section 4).

Plain pydantic models: they validate task files and configs, and serialise to JSON for the
store. Everything that search branches on is treated as immutable once built.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
    """

    answer: str | None = None
    calls: list[ToolCall] = Field(default_factory=list)
    acceptable: list[dict[str, Any]] = Field(default_factory=list)
    needs_tool: bool = True
    end_state_hash: str | None = None


class Task(BaseModel):
    """One episode to solve.

    toolbox: name of a registered Toolbox that supplies the executable tools and, for stateful
        suites, the initial tool state (dataengine.tools.registry).
    tools: the schemas shown to the model (a subset of, or equal to, the toolbox's tools).
    initial_state: the mutable tool state at reset (a JSON object), or None for stateless tools.
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
    """One step of an episode: the action, the observations it produced, and the tool results."""

    action: Action
    observations: list[Message] = Field(default_factory=list)
    results: list[ToolResult] = Field(default_factory=list)


class Episode(BaseModel):
    """A whole trajectory of a task, as verifiers and dataset derivation read it.

    final_state: the tool state at the end (None for stateless tools).
    done: the episode ended by a final answer; truncated: it hit max steps or a budget.
    """

    task: Task
    steps: list[Step] = Field(default_factory=list)
    final_state: dict[str, Any] | None = None
    done: bool = False
    truncated: bool = False

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

    score: in [0, 1] unless the verifier documents otherwise (graded numeric scores are <= 0).
    passed: True/False, or None when the verifier does not apply.
    confidence: in [0, 1]; the cascade escalates when it is low.
    """

    name: str
    version: str
    score: float
    passed: bool | None
    confidence: float = 1.0
    details: dict[str, Any] = Field(default_factory=dict)
