"""A tool-aware ChatML chat template for models whose own template has no tool support.

SmolLM2's template is plain ChatML: it ignores `tools=` and `tool_calls`. `install_tool_template`
puts this template on the tokenizer so that transformers, TRL trainers and our policy render a
conversation identically (and checkpoints save it):

- with `tools`, the system turn lists every tool's JSON schema inside `<tools></tools>`, the
  instruction to answer with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` or a
  plain final answer, and an optional few-shot block (text baked into the template);
- assistant turns render their `content` verbatim (it holds the raw `<tool_call>` text); an
  assistant turn with empty content and structured `tool_calls` renders them in the same form;
- tool turns render as `<|im_start|>tool\\n<tool_response>\\n...\\n</tool_response><|im_end|>`;
- assistant content and its `<|im_end|>` sit inside `{% generation %}` markers, which is what
  TRL's `SFTConfig(assistant_only_loss=True)` needs.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_SYSTEM = "You are a helpful assistant that solves tasks step by step with the tools provided."

INSTRUCTIONS = (
    "You can call the tools below. The tool signatures are inside <tools></tools> XML tags:\n"
    "<tools>{tools}\n</tools>\n\n"
    "To call a tool, reply with only a JSON object inside <tool_call></tool_call> tags:\n"
    '<tool_call>{"name": <tool-name>, "arguments": <arguments-json-object>}</tool_call>\n'
    "The result comes back inside <tool_response></tool_response> tags. "
    "When you know the answer, reply with the final answer as plain text and no tool call."
)

# Two worked examples: FACTS.md measured 10/16 exact tool calls from SmolLM2 with a tool list plus
# two examples, and none without them. Names in the examples are illustrative, not real tools.
DEFAULT_FEWSHOT = (
    "Example 1\n"
    "user: What is 6 times 7?\n"
    'assistant: <tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>\n'
    "tool: <tool_response>42</tool_response>\n"
    "assistant: 42\n\n"
    "Example 2\n"
    "user: What is 120 plus 35?\n"
    'assistant: <tool_call>{"name": "add", "arguments": {"a": 120, "b": 35}}</tool_call>\n'
    "tool: <tool_response>155</tool_response>\n"
    "assistant: 155\n\n"
    "Only call tools that are listed in <tools></tools>."
)

_TEMPLATE = """\
{%- set default_system = __SYSTEM__ -%}
{%- set fewshot = __FEWSHOT__ -%}
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
{%- set ns.listing = ns.listing + '\\n' + (tool | tojson) -%}
{%- endfor -%}
{{- '\\n\\n' + __INSTRUCTIONS_HEAD__ + ns.listing + __INSTRUCTIONS_TAIL__ -}}
{%- if fewshot -%}
{{- '\\n\\n' + fewshot -}}
{%- endif -%}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for message in rest -%}
{%- if message.role == 'assistant' -%}
{{- '<|im_start|>assistant\\n' -}}
{%- generation -%}
{%- if message.content -%}
{{- message.content -}}
{%- elif message.tool_calls -%}
{%- for call in message.tool_calls -%}
{%- set call = call.function if call.function is defined else call -%}
{%- set arguments = call.arguments if call.arguments is string else (call.arguments | tojson) -%}
{{- '<tool_call>{"name": "' + call.name + '", "arguments": ' + arguments + '}</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>' -}}
{%- endgeneration -%}
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


def tool_chat_template(
    *, system: str = DEFAULT_SYSTEM, fewshot: str | None = DEFAULT_FEWSHOT, instructions: str = INSTRUCTIONS
) -> str:
    """The Jinja source of the tool-aware ChatML template.

    system: the system text used when the conversation has no system message.
    fewshot: text appended to the system turn when tools are given; None or "" for none.
    instructions: the tool-use instructions; `{tools}` is replaced by the JSON schemas, one a
        line.
    """
    if "{tools}" not in instructions:
        raise ValueError("instructions must contain the placeholder {tools} where the tool schemas go")
    head, tail = instructions.split("{tools}", 1)
    source = (
        _TEMPLATE.replace("__SYSTEM__", _literal(system))
        .replace("__FEWSHOT__", _literal(fewshot or ""))
        .replace("__INSTRUCTIONS_HEAD__", _literal(head))
        .replace("__INSTRUCTIONS_TAIL__", _literal(tail))
    )
    return "{#- " + TEMPLATE_MARK + " -#}\n" + source


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
    fewshot: str | None = DEFAULT_FEWSHOT,
    instructions: str = INSTRUCTIONS,
    force: bool = False,
) -> Any:
    """Put the tool-aware template on `tokenizer` unless its own template already supports tools.

    Also sets a response template for `tokenizer.parse_response` (TRL's GRPO tool loop uses it):
    our `<tool_call>{json}</tool_call>` form is the Hermes/Qwen form TRL already parses.
    `force=True` replaces even a tool-capable template (used to change the few-shot block).
    Returns the same tokenizer.
    """
    current = getattr(tokenizer, "chat_template", None) or ""
    if force or TEMPLATE_MARK in current or not template_supports_tools(tokenizer):
        tokenizer.chat_template = tool_chat_template(system=system, fewshot=fewshot, instructions=instructions)
        _set_response_parser(tokenizer)
    return tokenizer


def _set_response_parser(tokenizer: Any) -> None:
    from trl import chat_template_utils as ctu

    # The same attribute choice TRL's add_response_schema makes for the installed transformers.
    if getattr(ctu, "_SUPPORTS_RESPONSE_TEMPLATE", False):
        tokenizer.response_template = ctu.qwen3_template
    else:
        tokenizer.response_schema = ctu.qwen3_schema
