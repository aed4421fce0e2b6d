"""A tool-aware ChatML chat template for models whose own template has no tool support.

SmolLM2's template is plain ChatML: it ignores `tools=` and `tool_calls`. `install_tool_template`
puts this template on the tokenizer so that transformers, TRL trainers and our policy render a
conversation identically (and checkpoints save it):

- with `tools`, the system turn lists the tools (one compact signature a line, or their JSON
  schemas), the instruction to answer with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  or a plain final answer, and optional extra text (`fewshot`);
- then, with `tools`, worked example episodes as real chat turns (user, assistant call, tool
  response, assistant answer), picked by the tools offered (dataengine.suites.fewshot). They sit
  outside the generation markers, so no trainer learns on them;
- assistant turns render their `content` verbatim (it may hold the raw `<tool_call>` text);
  structured `tool_calls` are rendered after it (a newline between) in the same form, unless
  the content already holds `<tool_call>` markup;
- tool turns render as `<|im_start|>tool\\n<tool_response>\\n...\\n</tool_response><|im_end|>`;
- assistant content and its `<|im_end|>` sit inside `{% generation %}` markers, which is what
  TRL's `SFTConfig(assistant_only_loss=True)` needs.

Measured with SmolLM2 on arithmetic (docs/policy.md): examples as text inside the system prompt
gave 0 tool calls in 64 samples; example episodes as chat turns give most replies as calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from dataengine.suites.fewshot import Episode, ExampleSet

DEFAULT_SYSTEM = "You are a helpful assistant that solves tasks step by step with the tools provided."

INSTRUCTIONS = (
    "You can call the tools below. The tool signatures are inside <tools></tools> XML tags:\n"
    "<tools>{tools}\n</tools>\n\n"
    "To call a tool, reply with only a JSON object inside <tool_call></tool_call> tags:\n"
    '<tool_call>{"name": <tool-name>, "arguments": <arguments-json-object>}</tool_call>\n'
    "The result comes back inside <tool_response></tool_response> tags. "
    "When you know the answer, reply with the final answer as plain text and no tool call. "
    "Only call tools that are listed in <tools></tools>."
)

Listing = Literal["compact", "json"]


_TEMPLATE = """\
{%- macro assistant_turn(message) -%}
{%- if message.content -%}
{{- message.content -}}
{%- endif -%}
{%- if message.tool_calls and '<tool_call>' not in (message.content or '') -%}
{%- if message.content -%}
{{- '\\n' -}}
{%- endif -%}
{%- for call in message.tool_calls -%}
{%- set call = call.function if call.function is defined else call -%}
{%- set arguments = call.arguments if call.arguments is string else (call.arguments | tojson) -%}
{{- '<tool_call>{"name": "' + call.name + '", "arguments": ' + arguments + '}</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>' -}}
{%- endmacro -%}
{%- set default_system = __SYSTEM__ -%}
{%- set fewshot = __FEWSHOT__ -%}
{%- set example_sets = __EXAMPLE_SETS__ -%}
{%- set example_index = __EXAMPLE_INDEX__ -%}
{%- set compact = __COMPACT__ -%}
{%- if messages and messages[0].role == 'system' -%}
{%- set system_text = messages[0].content -%}
{%- set rest = messages[1:] -%}
{%- else -%}
{%- set system_text = default_system -%}
{%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system_text -}}
{%- if tools -%}
{%- set ns = namespace(listing='') -%}
{%- for tool in tools -%}
{%- if compact -%}
{%- set f = tool.function if tool.function is defined else tool -%}
{%- set params = f.parameters if f.parameters is defined and f.parameters else {} -%}
{%- set props = params.properties if params.properties is defined else {} -%}
{%- set required = params.required if params.required is defined else [] -%}
{%- set ns.listing = ns.listing + '\\n- ' + f.name + '(' -%}
{%- for pname, p in props.items() -%}
{%- set ptype = ((p.type if p.type is string else (p.type | join('|'))) if p.type is defined else 'any') -%}
{%- set ns.listing = ns.listing + ('' if loop.first else ', ') + pname + ': ' + ptype -%}
{%- if p.enum is defined -%}
{%- set ns.listing = ns.listing + ' (one of ' + (p.enum | map('tojson') | join(', ')) + ')' -%}
{%- endif -%}
{%- if pname not in required -%}
{%- set ns.listing = ns.listing + ' = optional' -%}
{%- endif -%}
{%- endfor -%}
{%- set ns.listing = ns.listing + ')' + ((': ' + f.description) if f.description is defined and f.description else '') -%}
{%- else -%}
{%- set ns.listing = ns.listing + '\\n' + (tool | tojson) -%}
{%- endif -%}
{%- endfor -%}
{{- '\\n\\n' + __INSTRUCTIONS_HEAD__ + ns.listing + __INSTRUCTIONS_TAIL__ -}}
{%- if fewshot -%}
{{- '\\n\\n' + fewshot -}}
{%- endif -%}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- if tools and example_sets -%}
{%- set offered = namespace(names='|', pick=-1) -%}
{%- for tool in tools -%}
{%- set name = tool.function.name if tool.function is defined else tool.name -%}
{%- set offered.names = offered.names + name + '|' -%}
{%- if offered.pick < 0 and name in example_index -%}
{%- set offered.pick = example_index[name] -%}
{%- endif -%}
{%- endfor -%}
{%- if offered.pick < 0 -%}
{%- for episode in example_sets[0].episodes -%}
{{- episode.text -}}
{%- endfor -%}
{%- else -%}
{%- set chosen = example_sets[offered.pick] -%}
{%- set shown = namespace(n=0) -%}
{%- for episode in chosen.episodes -%}
{%- set usable = namespace(ok=(shown.n < chosen.max_shown)) -%}
{%- for name in episode.tools -%}
{%- if ('|' + name + '|') not in offered.names -%}
{%- set usable.ok = false -%}
{%- endif -%}
{%- endfor -%}
{%- if usable.ok -%}
{{- episode.text -}}
{%- set shown.n = shown.n + 1 -%}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endif -%}
{%- for message in rest -%}
{%- if message.role == 'assistant' -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if message.weight is defined and message.weight == 0 -%}
{{- assistant_turn(message) -}}
{%- else -%}
{%- generation -%}
{{- assistant_turn(message) -}}
{%- endgeneration -%}
{%- endif -%}
{{- '\\n' -}}
{%- elif message.role == 'tool' -%}
{{- '<|im_start|>tool\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""

TEMPLATE_MARK = "dataengine-tool-chatml"


def _literal(text: str) -> str:
    """A Jinja string literal holding `text` (JSON escapes are valid Jinja/Python escapes)."""
    return json.dumps(text)


def render_episode(episode: Episode) -> str:
    """One example episode as the ChatML turns this template renders for the same messages."""
    parts = []
    for message in episode:
        role, content = message["role"], str(message["content"])
        if role not in ("user", "assistant", "tool"):
            raise ValueError(f"example messages must be user, assistant or tool turns, not {role!r}")
        if role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    return "".join(parts)


def episode_tools(episode: Episode) -> list[str]:
    """Names of the tools an episode's assistant turns call."""
    from dataengine.parsing import parse_action

    names: list[str] = []
    for message in episode:
        if message["role"] == "assistant":
            names += [c.name for c in parse_action(str(message["content"])).tool_calls if c.name not in names]
    return names


def tool_chat_template(
    *,
    system: str = DEFAULT_SYSTEM,
    fewshot: str | None = None,
    examples: Sequence[ExampleSet] | None = None,
    listing: Listing = "compact",
    instructions: str = INSTRUCTIONS,
) -> str:
    """The Jinja source of the tool-aware ChatML template.

    system: the system text used when the conversation has no system message.
    fewshot: text appended to the system turn when tools are given; None or "" for none.
    examples: example sets shown as chat turns after the system turn when tools are given. A
        set is picked by the first offered tool among its names; when none matches, all of the
        first set's episodes are shown as a format demonstration. None or [] for no examples.
    listing: "compact" (`- name(arg: type, ...): description`, enums spelled out) or "json"
        (each tool's JSON schema on a line).
    instructions: the tool-use instructions; `{tools}` is replaced by the tool listing.
    """
    if "{tools}" not in instructions:
        raise ValueError("instructions must contain the placeholder {tools} where the tool schemas go")
    if listing not in ("compact", "json"):
        raise ValueError(f"listing must be 'compact' or 'json', not {listing!r}")
    head, tail = instructions.split("{tools}", 1)
    sets: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    for example_set in examples or []:
        for name in example_set.tools:
            index.setdefault(name, len(sets))
        episodes = [{"text": render_episode(e), "tools": episode_tools(e)} for e in example_set.episodes]
        max_shown = len(episodes) if example_set.max_shown is None else example_set.max_shown
        sets.append({"episodes": episodes, "max_shown": max_shown})
    source = (
        _TEMPLATE.replace("__SYSTEM__", _literal(system))
        .replace("__FEWSHOT__", _literal(fewshot or ""))
        .replace("__EXAMPLE_SETS__", json.dumps(sets))
        .replace("__EXAMPLE_INDEX__", json.dumps(index))
        .replace("__COMPACT__", "true" if listing == "compact" else "false")
        .replace("__INSTRUCTIONS_HEAD__", _literal(head))
        .replace("__INSTRUCTIONS_TAIL__", _literal(tail))
    )
    return "{#- " + TEMPLATE_MARK + " -#}\n" + source


def default_examples(tools: Sequence[str] = ()) -> list[ExampleSet]:
    """The built-in suites' example episodes (dataengine.suites.fewshot), then those of the
    toolboxes the tools entries `tools` define (their `EXAMPLES`; registry.load_tools)."""
    from dataengine.suites.fewshot import example_sets, user_example_sets

    if not tools:
        return example_sets()
    from dataengine.tools.registry import load_tools

    return example_sets() + user_example_sets(load_tools(tools))


def prompt_fingerprint(few_shot: bool = True) -> str:
    """16 hex chars naming the default template (with or without the example episodes).

    Run ids include it, so a changed prompt starts a new run instead of resuming an old one.
    A tools file's own examples are not in it: the run id holds the tools file's hash.
    """
    from dataengine.types import stable_hash

    return stable_hash(tool_chat_template(examples=default_examples() if few_shot else None))[:16]


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's own chat template renders tools, tool calls and tool turns."""
    from trl.chat_template_utils import has_generation_markers, supports_tool_calling

    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return False
    # Our trainers need assistant-only loss, so a tool template without generation markers is not enough.
    return supports_tool_calling(tokenizer) and has_generation_markers(template)


def install_tool_template(
    tokenizer: Any,
    *,
    system: str = DEFAULT_SYSTEM,
    fewshot: str | None = None,
    examples: Sequence[ExampleSet] | None | Literal["default"] = "default",
    listing: Listing = "compact",
    instructions: str = INSTRUCTIONS,
    force: bool = False,
    tools: Sequence[str] = (),
) -> Any:
    """Put the tool-aware template on `tokenizer` unless its own template already supports tools.

    Also sets a response template for `tokenizer.parse_response` (TRL's GRPO tool loop uses it):
    our `<tool_call>{json}</tool_call>` form is the Hermes/Qwen form TRL already parses.
    `examples="default"` shows the built-in suites' example episodes, and those of the
    toolboxes of the tools entries `tools`; None shows none.
    `force=True` replaces even a tool-capable template (used to change the examples).
    Returns the same tokenizer.
    """
    current = getattr(tokenizer, "chat_template", None) or ""
    if force or TEMPLATE_MARK in current or not template_supports_tools(tokenizer):
        if examples == "default":
            examples = default_examples(tools)
        tokenizer.chat_template = tool_chat_template(
            system=system, fewshot=fewshot, examples=examples, listing=listing, instructions=instructions
        )
        _set_response_parser(tokenizer)
    return tokenizer


def install_prompt_options(
    tokenizer: Any, *, fewshot: str | bool | None = None, system: str | None = None, listing: Listing | None = None,
    tools: Sequence[str] = (),
) -> Any:
    """The prompt options every policy backend takes, applied to `tokenizer`'s template.

    fewshot: None keeps the installed template (the built-in example episodes); True shows the
    example episodes; False none; a string is shown as text in the system turn instead of the
    episodes. system: the default system text. listing: "compact" or "json" tool listing.
    tools: tools entries (config tools.modules) whose toolboxes' own example episodes are shown
    too, for conversations offering their tools (unless fewshot is False or a string).
    """
    if fewshot is None and system is None and listing is None and not tools:
        return tokenizer
    return install_tool_template(
        tokenizer,
        fewshot=fewshot if isinstance(fewshot, str) else None,
        examples="default" if fewshot is None or fewshot is True else None,
        listing=listing or "compact",
        system=DEFAULT_SYSTEM if system is None else system,
        force=True,
        tools=tools,
    )


def _set_response_parser(tokenizer: Any) -> None:
    from trl import chat_template_utils as ctu

    # The same attribute choice TRL's add_response_schema makes for the installed transformers.
    if getattr(ctu, "_SUPPORTS_RESPONSE_TEMPLATE", False):
        tokenizer.response_template = ctu.qwen3_template
    else:
        tokenizer.response_schema = ctu.qwen3_schema
