"""TRL `environment_factory` environments whose tools run through our sandboxed ToolEnv.

GRPOTrainer (TRL 1.16) builds one environment instance per rollout, calls `reset(**row)` before
generation, exposes the instance's public methods as the tools shown to the model, parses the
model's `<tool_call>` replies, calls the matching method and appends its return value as the tool
turn. Here each method forwards the call to ToolEnv.step, which executes it in a Sandbox worker
process (timeout, memory limit, no network) on the episode's own tool state; the environment keeps
the EnvState so the reward function can rebuild the whole Episode and score it with our verifiers.

One environment class is made per toolbox (a task's `toolbox`): TRL's multi-environment mode
routes each dataset row to the class named in its "environment" column and shows only that
toolbox's tools in the prompt.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Callable
from typing import Any

from dataengine.tools.registry import Tool, Toolbox, get_toolbox
from dataengine.types import Action, Episode, Task, ToolCall

log = logging.getLogger(__name__)

STEP_BUDGET_ERROR = "Error: step budget exhausted: give the final answer now"
_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "number": float,
    "integer": int,
    "boolean": bool,
    "array": list,
    "object": dict,
}
_RESERVED = ("reset", "get_reward")


class ToolEnvironment:
    """One rollout's episode in a ToolEnv. Subclasses (see environment_class) add one public
    method per tool; only `reset` and the tool methods are public, because TRL turns every public
    method into a tool."""

    toolbox_name: str = ""

    def __init__(self, tool_env: Any) -> None:
        self._tool_env = tool_env
        self._state: Any = None
        self._prefix_steps = 0  # steps replayed from a mid-episode prompt

    def reset(self, task_json: str = "", prompt: Any = None, **_: Any) -> None:
        """Start the episode of the row's task (TRL passes the dataset row as keyword arguments).
        A prompt that goes on past the task's messages (a tree node's conversation: GRPO from
        tree prefixes) is replayed first, so the rollout continues from that node's state."""
        if not task_json:
            raise ValueError("GRPO rows need a 'task_json' column (Task.model_dump_json()) for the environment")
        task = Task.model_validate_json(task_json)
        if task.toolbox != self.toolbox_name:
            raise ValueError(
                f"task {task.id} uses toolbox {task.toolbox!r} but was routed to the {self.toolbox_name!r} environment"
            )
        self._state = self._tool_env.reset(task)
        self._prefix_steps = 0
        if isinstance(prompt, (list, tuple)):
            self._replay_prefix(task, list(prompt))

    def _replay_prefix(self, task: Task, prompt: list[Any]) -> None:
        """Run the prompt's assistant turns after the task's messages through ToolEnv again, in
        order (the tools really execute), and check that each gives the tool turns the prompt
        shows: a prompt whose recorded results the tools do not reproduce (another task, a
        changed toolbox) is an error, not a silently different state."""
        from storage.formats import DatasetFormatError, chat_message

        where = f"task {task.id} prompt"
        try:
            messages = [chat_message(m, f"{where} message {i}") for i, m in enumerate(prompt)]
        except DatasetFormatError as exc:
            raise ValueError(str(exc)) from None
        messages = [m for m in messages if m["role"] != "system"]
        head = [m for m in task.messages if m.role != "system"]
        if len(messages) <= len(head):
            return  # the task's own prompt
        if [(m["role"], m["content"]) for m in messages[: len(head)]] != [(m.role, m.content) for m in head]:
            raise ValueError(f"{where} does not start with the task's messages")
        rest, i = messages[len(head):], 0
        while i < len(rest):
            message = rest[i]
            if message["role"] != "assistant":
                raise ValueError(f"{where}: message {len(head) + i} is a {message['role']} turn where an assistant turn was expected")
            if self._state.terminal:
                raise ValueError(f"{where}: the episode ends before the prompt does (message {len(head) + i})")
            outcome = self._tool_env.step(self._state, _assistant_text(message))
            self._state = outcome.state
            i += 1
            shown = []
            while i < len(rest) and rest[i]["role"] != "assistant":
                shown.append(rest[i]["content"])
                i += 1
            replayed = [m.content for m in outcome.observations]
            if shown != replayed:
                raise ValueError(
                    f"{where}: replaying step {self._prefix_steps + 1} gives tool turns {replayed!r}, the prompt shows {shown!r}"
                )
            self._prefix_steps += 1
        if self._state.terminal:
            raise ValueError(f"{where}: the prompt ends the episode; nothing is left to roll out")

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call as one ToolEnv step; the observation text is the tool turn."""
        if self._state is None:
            raise RuntimeError("environment used before reset()")
        if self._state.done:
            return STEP_BUDGET_ERROR
        from dataengine.parsing import render_tool_calls

        try:
            call = ToolCall(name=name, arguments=dict(arguments))
        except ValueError as exc:  # NaN, over-deep or oversized arguments from the model
            return f"error: invalid arguments for {name}: {str(exc).splitlines()[-1].strip()}"
        outcome = self._tool_env.step(self._state, Action(text=render_tool_calls([call]), tool_calls=[call]))
        self._state = outcome.state
        return "\n".join(m.content for m in outcome.observations)

    def _episode(self, final_text: str | None) -> Episode:
        """The episode so far, closed by `final_text` (the last assistant reply without a tool call)
        when given; without it the episode stays unfinished (the rollout ran out of budget)."""
        if self._state is None:
            raise RuntimeError("environment used before reset()")
        state = self._state
        if final_text is not None and not state.done:
            state = self._tool_env.step(state, final_text).state
        return state.episode()


def _assistant_text(message: dict[str, Any]) -> str:
    """The raw text of a TRL-form assistant turn: its content, then its calls as markup."""
    from dataengine.parsing import render_action

    calls = [ToolCall(name=c["function"]["name"], arguments=c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    if not calls:
        return message["content"]
    return render_action(Action(text="", thought=message["content"] or None, tool_calls=calls))


def environment_class(toolbox: Toolbox) -> type:
    """A ToolEnvironment subclass with one method per tool of `toolbox`, each with the tool's
    signature and docstring so TRL renders the same JSON schema the task shows."""
    namespace: dict[str, Any] = {"toolbox_name": toolbox.name}
    for tool in toolbox.tools.values():
        if tool.name in _RESERVED or tool.name.startswith("_"):
            raise ValueError(f"toolbox {toolbox.name!r}: tool name {tool.name!r} clashes with the TRL environment API")
        namespace[tool.name] = tool_method(tool)
    safe = "".join(ch if ch.isalnum() else "_" for ch in toolbox.name)
    return type(f"ToolEnvironment_{safe}", (ToolEnvironment,), namespace)


def tool_method(tool: Tool) -> Callable[..., str]:
    """A method forwarding `tool` calls to ToolEnvironment._call, carrying a signature, type hints
    and docstring from which transformers.utils.get_json_schema rebuilds `tool.spec`."""
    name = tool.name

    def method(self: ToolEnvironment, **arguments: Any) -> str:
        return self._call(name, arguments)

    method.__name__ = name
    method.__qualname__ = name
    try:
        _copy_signature(method, tool)
        if not _schema_matches(method, tool):
            _synthesise_signature(method, tool)
    except Exception:  # a callable whose hints cannot be resolved: describe it from the spec
        _synthesise_signature(method, tool)
    if not _schema_matches(method, tool):
        log.warning("tool %s: the schema TRL renders differs from the task's spec", name)
    return method


def _copy_signature(method: Any, tool: Tool) -> None:
    """Signature, resolved hints and docstring of the tool's own function, minus `state`."""
    sig = inspect.signature(tool.fn)
    params = list(sig.parameters.values())
    if tool.stateful:
        params = params[1:]
    hints = typing.get_type_hints(tool.fn)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in params]
    method.__signature__ = inspect.Signature([self_param, *params])
    method.__annotations__ = {p.name: hints[p.name] for p in params if p.name in hints}
    method.__doc__ = inspect.getdoc(tool.fn)


def _synthesise_signature(method: Any, tool: Tool) -> None:
    """Signature and Google docstring written from the JSON schema (tools not built from a typed
    function, e.g. external suites). Nested item schemas are not reproduced."""
    props = tool.spec.parameters.get("properties", {})
    required = set(tool.spec.parameters.get("required", []))
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    lines = [tool.spec.description or tool.name, "", "Args:"]
    for pname, prop in props.items():
        json_type = prop.get("type", "string")
        json_type = json_type[0] if isinstance(json_type, list) else json_type
        hint = _JSON_TYPES.get(json_type, str)
        if pname not in required:
            hint = typing.Optional[hint]  # noqa: UP045 - built at run time for get_json_schema
        annotations[pname] = hint
        params.append(
            inspect.Parameter(
                pname,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if pname in required else None,
                annotation=hint,
            )
        )
        description = " ".join(str(prop.get("description") or pname).split())
        if "enum" in prop:
            import json

            description += f" (choices: {json.dumps(prop['enum'])})"
        lines.append(f"    {pname}: {description}")
    # Parameters with defaults must follow the required ones in a Python signature.
    params = [params[0]] + sorted(params[1:], key=lambda p: p.default is not inspect.Parameter.empty)
    method.__signature__ = inspect.Signature(params)
    method.__annotations__ = annotations
    method.__doc__ = "\n".join(lines if props else lines[:1])


def _schema_matches(method: Any, tool: Tool) -> bool:
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(method)
    except Exception:
        return False
    schema = schema.get("function", schema)  # transformers 5 wraps it as {"type": "function", "function": {...}}
    want = tool.spec.to_openai()["function"]
    return schema.get("description") == want["description"] and schema.get("parameters") == want["parameters"]


def environment_factories(toolbox_names: list[str], tool_env: Any) -> dict[str, Callable[[], ToolEnvironment]]:
    """{toolbox name: factory} for GRPOTrainer(environment_factory=...); every instance shares
    `tool_env` (and its Sandbox), each keeps its own episode state."""
    factories: dict[str, Callable[[], ToolEnvironment]] = {}
    for name in sorted(set(toolbox_names)):
        cls = environment_class(get_toolbox(name))
        factories[name] = lambda cls=cls: cls(tool_env)
    return factories


def regroup_turns(episode: Episode, completion: list[dict[str, Any]], skip: int = 0) -> Episode:
    """The episode with one step per assistant turn, as search records it.

    skip: steps at the start that came from a replayed prompt prefix (kept as they are).

    The environment runs each tool call as its own ToolEnv step (TRL calls tools one at a time);
    this merges the calls of one assistant reply (parallel calls) back into one step and keeps the
    text the model wrote before its calls as the step's thought. Left as is when the completion
    and the episode disagree on the number of calls (e.g. calls refused after the step budget).
    """
    from dataengine.parsing import render_tool_calls
    from dataengine.types import Step

    head, tail = episode.steps[:skip], episode.steps[skip:]
    turns = [m for m in completion if m.get("role") == "assistant" and m.get("tool_calls")]
    call_steps = [step for step in tail if step.action.tool_calls]
    sizes = [len(m["tool_calls"]) for m in turns]
    if sum(sizes) != len(call_steps) or not any(n > 1 or m.get("content") for n, m in zip(sizes, turns)):
        return episode
    steps, position = list(head), 0
    for turn, size in zip(turns, sizes):
        group = call_steps[position : position + size]
        position += size
        calls = [call for step in group for call in step.action.tool_calls]
        thought = (turn.get("content") or "").strip() or None
        text = ((thought + "\n") if thought else "") + render_tool_calls(calls)
        steps.append(
            Step(
                action=Action(text=text, thought=thought, tool_calls=calls),
                observations=[m for step in group for m in step.observations],
                results=[r for step in group for r in step.results],
            )
        )
    steps += [step for step in tail if not step.action.tool_calls]
    return episode.model_copy(update={"steps": steps})


def final_reply(completion: list[dict[str, Any]]) -> str | None:
    """The final answer text of a rollout: the last assistant message when it made no tool call
    (TRL's parsed completion: assistant and tool messages), else None (the rollout was cut)."""
    if not completion:
        return None
    last = completion[-1]
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    return last.get("content") or ""
