"""Slow training runs: GRPO rollouts that execute tools through the ToolEnv, LoRA merging, the
CLI chain DPO -> GRPO registered in the store, a DPO smoke run on SmolLM2, and the behaviour
reference on SmolLM2 against TRL's own reference computation."""

from __future__ import annotations

import json
import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dataengine.suites import generate_suite
from dataengine.suites.gold import gold_turns

pytestmark = pytest.mark.slow

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number", "description": "x"}, "b": {"type": "number", "description": "y"}},
            "required": ["a", "b"],
        },
    },
}


def _one_call_task():
    return next(t for t in generate_suite("arithmetic", 8, 0, seed=3) if len(t.gold.calls) == 1)


def _prompt_row(task):
    return {"prompt": [m.to_chat() for m in task.messages], "tools": json.dumps([s.to_openai() for s in task.tools]),
            "task_id": task.id, "task_json": task.model_dump_json()}


def scripted_bias(task, skip: int = 0) -> list:
    """transformers `sequence_bias` that makes any model write the task's gold turns: each key is
    the turn's context (the end of the prompt, or the end of a tool turn) plus a prefix of the
    turn, with a bias growing with the prefix, so the longest matching prefix wins. It scripts
    the policy's sampling only; parsing, tool execution and scoring are the real ones."""
    from dataengine.models import load_model
    from dataengine.tools.registry import get_toolbox
    from dataengine.train.environment import environment_class

    _, tok = load_model("tiny")
    toolbox = get_toolbox(task.toolbox)
    env = environment_class(toolbox)(None)
    tools = [getattr(env, name) for name in toolbox.tools]
    prompt = tok.apply_chat_template([m.to_chat() for m in task.messages], tools=tools, add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    after_tool = tok("\n</tool_response><|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    turns = gold_turns(task)[skip:]  # skip: turns already in a mid-episode prompt
    contexts = [prompt[-12:]] + [after_tool] * (len(turns) - 1)
    if skip:
        # The prompt ends after a tool turn too: its own (longer) context must win the first turn.
        prompt = tok.apply_chat_template(skip_prompt(task, skip), tools=tools, add_generation_prompt=True,
                                         tokenize=True, return_dict=False)
        contexts[0] = prompt[-16:]
    bias = []
    for n, (context, text) in enumerate(zip(contexts, turns)):
        ids = tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        bias += [[context + ids[:k], (100.0 if n == 0 else 50.0) + 10.0 * k] for k in range(1, len(ids) + 1)]
    return bias


def skip_prompt(task, skip: int) -> list:
    """The TRL-form conversation after the task's first `skip` gold calls ran (a tree node's)."""
    from dataengine.env import ToolEnv
    from dataengine.parsing import render_tool_calls
    from dataengine.tools.sandbox import Sandbox
    from storage.formats import chat_messages

    with Sandbox(workers=1) as sandbox:
        tool_env = ToolEnv(sandbox, max_steps=6)
        state = tool_env.reset(task)
        for call in task.gold.calls[:skip]:
            state = tool_env.step(state, render_tool_calls([call])).state
    return chat_messages([m.model_dump() for m in state.messages], "node")


def test_grpo_rollouts_execute_tools_and_are_scored_by_the_verifiers(tmp_path):
    from dataengine.models import load_model
    from dataengine.train.data import load_training_data
    from dataengine.train.grpo import GRPOTrainConfig, train_grpo
    from storage.store import Store

    task = _one_call_task()
    store = Store(tmp_path / "store")
    store.append("replay", [{"prompt_id": "q0", "task_id": task.id, "suite": task.suite,
                             "prompt_json": json.dumps([m.to_chat() for m in task.messages]),
                             "tools_json": "[]", "task_json": task.model_dump_json(), "p_success": 0.5}],
                 run_id="r", shard_id="s")
    config = GRPOTrainConfig(init="tiny", out_dir=str(tmp_path / "grpo"), max_steps=1, batch_size=4,
                             num_generations=4, max_completion_length=96,
                             generation_kwargs={"sequence_bias": scripted_bias(task)})
    info = train_grpo(config, load_training_data("prompt", store=store), store=store)
    log = info.metrics["last_log"]
    # Every rollout called the gold tool (executed in the sandbox via ToolEnv) and answered right.
    assert log["tools/call_frequency"] == pytest.approx(1.0)
    assert log["tools/failure_frequency"] == pytest.approx(0.0)
    assert log["verifier/success_rate"] == pytest.approx(1.0)
    assert log["reward"] >= 1.0
    rows = store.models().collect().to_dicts()
    assert rows[0]["kind"] == "grpo" and json.loads(rows[0]["dataset_versions_json"]) == {"replay": store.version("replay")}
    load_model(info.path)


def test_grpo_from_a_tree_prefix_continues_the_episode(tmp_path):
    """GRPO from tree prefixes: a replay row whose prompt is a mid-episode node (the
    task's first tool call and its result) is replayed into ToolEnv, the rollouts make the second
    call (executed in the sandbox) and answer, and the verifiers score the whole two-call episode."""
    from dataengine.train.data import load_training_data
    from dataengine.train.grpo import GRPOTrainConfig, train_grpo
    from storage.store import Store

    task = next(t for t in generate_suite("arithmetic", 20, 0, seed=1) if len(t.gold.calls) == 2)
    store = Store(tmp_path / "store")
    store.append("replay", [{"prompt_id": "node/r/t/1", "task_id": task.id, "suite": task.suite,
                             "prompt_json": json.dumps(skip_prompt(task, 1)),
                             "tools_json": "[]", "task_json": task.model_dump_json(), "p_success": 0.5}],
                 run_id="r", shard_id="s")
    config = GRPOTrainConfig(init="tiny", out_dir=str(tmp_path / "grpo"), max_steps=1, batch_size=4,
                             num_generations=4, max_completion_length=96,
                             generation_kwargs={"sequence_bias": scripted_bias(task, skip=1)})
    info = train_grpo(config, load_training_data("prompt", store=store), store=store)
    log = info.metrics["last_log"]
    assert log["tools/call_frequency"] == pytest.approx(1.0)
    assert log["tools/failure_frequency"] == pytest.approx(0.0)
    # The verifiers judge the episode with both calls: the replayed one and the rollout's.
    assert log["verifier/tool_calls_per_rollout"] == pytest.approx(2.0)
    assert log["verifier/success_rate"] == pytest.approx(1.0)


def test_lora_sft_checkpoint_is_merged_and_changed(tmp_path):
    import torch

    from dataengine.models import load_model
    from dataengine.train.sft import SFTTrainConfig, train_sft

    task = _one_call_task()
    call, answer = gold_turns(task)
    rows = [{"messages": [m.to_chat() for m in task.messages] + [
        {"role": "assistant", "content": call}, {"role": "tool", "name": task.gold.calls[0].name, "content": answer},
        {"role": "assistant", "content": answer}], "tools": [s.to_openai() for s in task.tools]}]
    config = SFTTrainConfig(init="tiny", out_dir=str(tmp_path / "sft"), max_steps=2, batch_size=1, lora=True,
                            lora_rank=4, learning_rate=1e-2)
    info = train_sft(config, rows)
    trained, _ = load_model(info.path)
    base, _ = load_model("tiny")
    assert not any("lora" in name for name in trained.state_dict())
    diffs = [float((a - b).abs().max()) for a, b in zip(trained.state_dict().values(), base.state_dict().values())]
    assert max(diffs) > 0  # the merged adapters changed the weights
    assert info.parent_id.startswith("tiny-llama@") and info.model_id != info.parent_id
    assert torch.isfinite(torch.tensor(info.metrics["train_loss"]))


def test_cli_chain_dpo_then_grpo_registers_both_with_parents(tmp_path):
    from typer.testing import CliRunner

    from dataengine.cli import app
    from storage.store import Store

    task = _one_call_task()
    call = gold_turns(task)[0]
    store = Store(tmp_path / "store")
    prompt = json.dumps([m.to_chat() for m in task.messages])
    store.append("pairs", [{"pair_id": "p0", "kind": "step", "task_id": task.id, "suite": task.suite,
                            "prompt_json": prompt, "chosen_json": json.dumps([{"role": "assistant", "content": call}]),
                            "rejected_json": json.dumps([{"role": "assistant", "content": "12"}]),
                            "tools_json": json.dumps([s.to_openai() for s in task.tools]), "margin": 1.0}],
                 run_id="r", shard_id="s")
    store.append("replay", [{"prompt_id": "q0", "task_id": task.id, "suite": task.suite, "prompt_json": prompt,
                             "tools_json": "[]", "task_json": task.model_dump_json(), "p_success": 0.5}],
                 run_id="r", shard_id="s")
    result = CliRunner().invoke(app, ["train", "chain", "--store", str(tmp_path / "store"), "--init", "tiny",
                                      "--out", str(tmp_path / "ckpt"), "--stages", "dpo,grpo", "--steps", "1",
                                      "--max-completion-length", "16"])
    assert result.exit_code == 0, result.output
    store = Store(tmp_path / "store")
    models = {r["kind"]: r for r in store.models().collect().to_dicts()}
    assert set(models) == {"dpo", "grpo"}
    assert models["grpo"]["parent_id"] == models["dpo"]["model_id"]
    assert models["dpo"]["parent_id"].startswith("tiny-llama@")
    assert json.loads(models["dpo"]["dataset_versions_json"]) == {"pairs": store.version("pairs")}


def test_dpo_smoke_on_smollm2(tmp_path):
    from dataengine.models import load_model
    from dataengine.train.dpo import DPOTrainConfig, train_dpo

    rows = [{"prompt": [{"role": "user", "content": f"What is {17 + i} plus 25?"}],
             "chosen": [{"role": "assistant",
                         "content": f'<tool_call>{{"name": "add", "arguments": {{"a": {17 + i}, "b": 25}}}}</tool_call>'}],
             "rejected": [{"role": "assistant", "content": "32"}], "tools": [ADD_TOOL]} for i in range(2)]
    config = DPOTrainConfig(init="smollm2", out_dir=str(tmp_path / "dpo"), max_steps=2, batch_size=1,
                            learning_rate=1e-5)
    info = train_dpo(config, rows)
    assert info.metrics["steps"] == 2 and math.isfinite(info.metrics["train_loss"])
    assert info.parent_id.startswith("smollm2-135m-instruct@")
    load_model(info.path)


def test_seeded_dpo_runs_give_the_same_checkpoint(tmp_path):
    from dataengine.train.dpo import DPOTrainConfig, train_dpo

    rows = [{"prompt": [{"role": "user", "content": f"What is {17 + i} plus 25?"}],
             "chosen": [{"role": "assistant", "content": "42"}], "rejected": [{"role": "assistant", "content": "32"}],
             "tools": [ADD_TOOL], "ref_chosen_logps": -30.0, "ref_rejected_logps": -30.0} for i in range(4)]
    ids = []
    for run in ("a", "b"):
        config = DPOTrainConfig(init="tiny", out_dir=str(tmp_path / run), max_steps=2, batch_size=2,
                                behaviour_ref=True, behaviour_model="tiny", learning_rate=1e-3, seed=7)
        ids.append(train_dpo(config, rows).model_id)
    assert ids[0] == ids[1]  # same seed and data: bit-identical weights (the id hashes the weight file)
    assert ids[0].split("@")[1] != "" and ids[0].startswith("dpo-tiny@")


def smollm2_pairs() -> list[dict]:
    """Step and trajectory pairs on a real suite task (its tool list and prompt, ~700 tokens with
    SmolLM2's template): a first-step pair, a second-step pair after a tool turn, a thought+call
    against wrong arguments, and two whole episodes against failed ones."""
    task = _one_call_task()
    prompt = [m.to_chat() for m in task.messages]
    tools = [s.to_openai() for s in task.tools]
    call = task.gold.calls[0]
    good = {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    wrong = {"type": "function", "function": {"name": call.name, "arguments": {**call.arguments, "b": 98}}}
    answer = task.gold.answer

    def calls(c, thought=""):
        return {"role": "assistant", "content": thought, "tool_calls": [c]}

    def tool(text):
        return {"role": "tool", "name": call.name, "content": text}

    def say(text):
        return {"role": "assistant", "content": text}

    after_call = prompt + [calls(good), tool(answer)]
    return [
        {"prompt": prompt, "chosen": [calls(good)], "rejected": [say(answer)], "tools": tools},
        {"prompt": after_call, "chosen": [say(answer)], "rejected": [say(f"The answer is {answer}1.")], "tools": tools},
        {"prompt": prompt, "chosen": [calls(good, "I divide.")], "rejected": [calls(wrong)], "tools": tools},
        {"prompt": prompt, "chosen": [calls(good), tool(answer), say(answer)],
         "rejected": [calls(wrong), tool("66.2959"), say("66")], "tools": tools},
        {"prompt": prompt, "chosen": [calls(good), tool(answer), say(f"It is {answer}.")],
         "rejected": [say("70")], "tools": tools},
    ]


def test_behaviour_reference_equals_trls_reference_on_smollm2():
    """behaviour_reference_logps with SmolLM2 = TRL's DPOTrainer(ref_model=SmolLM2,
    precompute_ref_log_probs=True) reference, per row and side, within 1e-3."""
    from test_train import trl_reference

    from dataengine.models import load_model
    from dataengine.train.data import as_training_data
    from dataengine.train.dpo import behaviour_reference_logps

    rows = as_training_data("preference", smollm2_pairs()).rows
    _, tokenizer = load_model("smollm2")
    ours = behaviour_reference_logps("smollm2", rows, tokenizer=tokenizer, max_length=1024)
    trl = trl_reference("smollm2", "smollm2", rows, max_length=1024)
    assert len(ours) == len(trl) == 5
    for (chosen, rejected), (trl_chosen, trl_rejected) in zip(ours, trl):
        assert chosen == pytest.approx(trl_chosen, abs=1e-3) and rejected == pytest.approx(trl_rejected, abs=1e-3)
    assert all(math.isfinite(c) and c < 0 for pair in ours for c in pair)
