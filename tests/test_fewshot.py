"""Example episodes for the chat template: real tool outputs, deterministic, not evaluation tasks."""

from __future__ import annotations

import json

from dataengine.suites import generate_suite
from dataengine.suites.fewshot import EXAMPLE_PLAN, episode_messages, example_sets
from dataengine.suites.gold import replay
from dataengine.tools.registry import get_toolbox


def test_every_builtin_toolbox_has_episodes_with_real_outputs():
    sets = example_sets()
    assert [set(s.tools) for s in sets] == [set(get_toolbox(name).tools) for name in ["arithmetic", *[n for n in EXAMPLE_PLAN if n != "arithmetic"]]]
    for example_set in sets:
        episodes = example_set.episodes
        assert len(episodes) >= 2
        for episode in episodes:
            roles = [m["role"] for m in episode]
            assert roles[0] == "user" and roles[-1] == "assistant"
            assert roles[1:-1] == ["assistant", "tool"] * ((len(roles) - 2) // 2)
    # Arithmetic shows answering directly next to calling tools.
    arithmetic = sets[0].episodes
    assert [len(e) for e in arithmetic][0] == 2 and all(len(e) > 2 for e in arithmetic[1:])


def test_tool_turns_are_what_the_tools_return():
    task = next(t for t in generate_suite("shop", 30, 0, seed=3) if len(t.gold.calls) == 2)
    messages = episode_messages(task)
    outputs, _ = replay(task.toolbox, task.gold.calls, task.initial_state)
    tool_turns = [m["content"] for m in messages if m["role"] == "tool"]
    assert [json.loads(t) for t in tool_turns] == json.loads(json.dumps(outputs))
    calls = [json.loads(m["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")) for m in messages[1:-1:2]]
    assert calls == [{"name": c.name, "arguments": c.arguments} for c in task.gold.calls]


def test_examples_are_deterministic_and_not_default_split_tasks():
    first = example_sets()
    example_sets.__globals__["_examples"].cache_clear()
    assert example_sets() == first
    prompts = {e[0]["content"] for s in first for e in s.episodes}
    for suite in ["arithmetic", "units", "shop", "chains", "notool"]:
        assert not prompts & {t.messages[-1].content for t in generate_suite(suite, 200, 50, seed=0)}


def test_chains_show_only_episodes_whose_tools_are_offered():
    from dataengine.models import load_model

    _, tokenizer = load_model("tiny")
    for task in generate_suite("chains", 6, 0, seed=1):
        text = tokenizer.apply_chat_template([m.to_chat() for m in task.messages], tools=[t.to_openai() for t in task.tools], tokenize=False)
        examples = text[text.index("<|im_end|>") : text.rindex("<|im_start|>user")]
        offered = {t.name for t in task.tools}
        called = {json.loads(body.split("</tool_call>")[0])["name"] for body in examples.split("<tool_call>")[1:]}
        assert called <= offered and examples.count("<|im_start|>user") <= 2
