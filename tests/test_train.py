"""Training: dataset loading, the SFT label mask, DPO with behaviour log-probs as reference,
checkpoint registration, and the GRPO environment/reward that run tools through the ToolEnv.

Models are the tiny random Llama (dataengine.models "tiny"); trainer runs here are one step.
"""

from __future__ import annotations

import json
import os

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dataengine.suites import generate_suite
from dataengine.suites.gold import gold_turns
from dataengine.train.data import (
    TrainingDataError,
    as_training_data,
    load_training_data,
)

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
CALL = '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'
ADD_CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 17, "b": 25}}}


def pair(i: int = 0, **extra):
    """A preference row in the export format (storage.formats): structured call, tools as a list."""
    return {
        "prompt": [{"role": "user", "content": f"What is {17 + i} plus 25?"}],
        "chosen": [{"role": "assistant", "content": "", "tool_calls": [ADD_CALL]}],
        "rejected": [{"role": "assistant", "content": "32"}],
        "tools": [ADD_TOOL],
        **extra,
    }


SFT_ROW = {
    "messages": [
        {"role": "user", "content": "What is 17 plus 25?"},
        {"role": "assistant", "content": "", "tool_calls": [ADD_CALL]},
        {"role": "tool", "name": "add", "content": "42"},
        {"role": "assistant", "content": "The answer is 42."},
    ],
    "tools": [ADD_TOOL],
}
TEXT_CALL = {"type": "function", "function": {"name": "add", "arguments": '{"a": 17, "b": 25}'}}


# ---- dataset loading ----------------------------------------------------------------------


def test_hand_written_parquet_in_trl_form_loads():
    """A parquet file someone wrote with pyarrow: tools as a JSON string, calls structured."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "pairs.parquet"
        rows = [dict(pair(i), tools=json.dumps([ADD_TOOL])) for i in range(3)]
        for r in rows:
            r["chosen"] = [{**r["chosen"][0], "tool_calls": [TEXT_CALL]}]
        pq.write_table(pa.Table.from_pylist(rows), path)
        data = load_training_data("preference", path)
    assert len(data) == 3 and data.kind == "pairs"
    assert any(k.startswith("file:") for k in data.versions)
    assert json.loads(data.rows[0]["tools"])[0]["function"]["name"] == "add"
    assert data.rows[0]["chosen"] == [{"role": "assistant", "content": "", "tool_calls": [TEXT_CALL]}]


def test_trainer_rows_hold_arguments_and_tools_as_json_text():
    data = as_training_data("sft", [SFT_ROW])
    assert isinstance(data.rows[0]["tools"], str) and json.loads(data.rows[0]["tools"]) == [ADD_TOOL]
    assert data.rows[0]["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [TEXT_CALL]}
    assert data.rows[0]["messages"][2] == {"role": "tool", "name": "add", "content": "42"}
    # Rows whose arguments and tool schemas differ still make one Dataset, without null-filled keys.
    other = {"type": "function", "function": {"name": "lookup", "arguments": {"order_id": "A1", "verbose": True}}}
    mixed = as_training_data("sft", [SFT_ROW, {"messages": [
        {"role": "user", "content": "Order?"}, {"role": "assistant", "content": "Looking.", "tool_calls": [other]}]}])
    dataset = mixed.to_dataset()
    assert json.loads(dataset[1]["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"order_id": "A1", "verbose": True}
    assert json.loads(dataset[0]["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"a": 17, "b": 25}
    # The old names of the kinds still work and name the same kind.
    assert as_training_data("preference", [pair(0)]).kind == as_training_data("pairs", [pair(0)]).kind == "pairs"


def test_raw_tool_call_text_is_still_accepted():
    raw = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": CALL}]}
    assert as_training_data("sft", [raw]).rows[0]["messages"][1] == {"role": "assistant", "content": CALL}


def test_bad_datasets_get_errors_naming_the_problem(tmp_path):
    with pytest.raises(TrainingDataError, match=r"row 1 lacks column\(s\) \['rejected'\]"):
        as_training_data("preference", [pair(0), {k: v for k, v in pair(1).items() if k != "rejected"}])
    bad = tmp_path / "sft.jsonl"
    bad.write_text(json.dumps({"messages": SFT_ROW["messages"]}) + "\n{not json\n")
    with pytest.raises(TrainingDataError, match="line 2: invalid JSON"):
        load_training_data("sft", bad)
    with pytest.raises(TrainingDataError, match="message 0 has unknown role 'robot'"):
        as_training_data("sft", [{"messages": [{"role": "robot", "content": "x"}]}])
    with pytest.raises(TrainingDataError, match="no assistant message"):
        as_training_data("sft", [{"messages": [{"role": "user", "content": "x"}]}])
    broken_call = {"type": "function", "function": {"name": "add", "arguments": "{oops"}}
    with pytest.raises(TrainingDataError, match=r"row 0 column 'messages' message 1 tool call 0 arguments is not valid JSON"):
        as_training_data("sft", [{"messages": [{"role": "user", "content": "x"},
                                               {"role": "assistant", "content": "", "tool_calls": [broken_call]}]}])
    with pytest.raises(TrainingDataError, match="column 'tools' item 0 has no function name"):
        as_training_data("sft", [{**SFT_ROW, "tools": [{"type": "function", "function": {}}]}])
    with pytest.raises(TrainingDataError, match="unknown dataset kind 'dpo'"):
        as_training_data("dpo", [pair(0)])
    with pytest.raises(TrainingDataError, match="does not exist"):
        load_training_data("sft", tmp_path / "missing.parquet")
    good = tmp_path / "pairs.jsonl"
    good.write_text(json.dumps(pair(0)) + "\n")
    # Logged sampling log-probs are optional: the behaviour reference re-scores TRL's tokens.
    assert "ref_chosen_logps" not in load_training_data("preference", good, behaviour_ref=True).rows[0]
    with pytest.raises(TrainingDataError, match="apply to the store's tables"):
        load_training_data("preference", good, pair_kind="step")


def _store_with_pairs_and_replay(root):
    """Pairs and replay prompts stored the way the engine stores them (dataengine.types.Message:
    raw call text plus parsed calls)."""
    from dataengine.types import Message, ToolCall
    from storage.store import Store

    store = Store(root)
    rows = []
    for i, kind in enumerate(["step", "trajectory", "step"]):
        chosen = Message(role="assistant", content=CALL, tool_calls=[ToolCall(name="add", arguments={"a": 17, "b": 25})])
        rows.append({
            "pair_id": f"p{i}", "kind": kind, "task_id": f"t{i}", "suite": "arithmetic",
            "prompt_json": json.dumps(pair(i)["prompt"]), "chosen_json": json.dumps([chosen.model_dump(mode="json")]),
            "rejected_json": json.dumps(pair(i)["rejected"]), "tools_json": json.dumps([ADD_TOOL]),
            "margin": 0.5 + i, "chosen_logprob": -20.0, "rejected_logprob": -5.0 - i,
        })
    store.append("pairs", rows, run_id="r1", shard_id="s0")
    tasks = [t for t in generate_suite("arithmetic", 4, 0, seed=0)]
    replay = [{
        "prompt_id": f"q{i}", "task_id": t.id, "suite": t.suite,
        "prompt_json": json.dumps([m.to_chat() for m in t.messages]),
        "tools_json": json.dumps([s.to_openai() for s in t.tools]), "task_json": t.model_dump_json(),
        "p_success": p,
    } for i, (t, p) in enumerate(zip(tasks, [0.0, 0.5, 1.0, None]))]
    store.append("replay", replay, run_id="r1", shard_id="s0")
    return store


def test_store_pairs_with_behaviour_logprobs_and_filters(tmp_path):
    store = _store_with_pairs_and_replay(tmp_path / "store")
    data = load_training_data("preference", store=store, pair_kind="step", behaviour_ref=True)
    assert len(data) == 2
    assert data.versions == {"pairs": store.version("pairs")}
    assert sorted(r["ref_rejected_logps"] for r in data.rows) == [-7.0, -5.0]
    assert all(r["ref_chosen_logps"] == -20.0 for r in data.rows)
    assert data.rows[0]["chosen"] == [{"role": "assistant", "content": "", "tool_calls": [TEXT_CALL]}]
    assert len(load_training_data("preference", store=store, min_margin=1.0)) == 2


def test_store_training_data_filters_runs_and_suites(tmp_path):
    """`dataengine train dpo --store S --run R --suite X` trains on those rows, not the whole store."""
    from typer.testing import CliRunner

    from dataengine.cli import app

    store = _store_with_pairs_and_replay(tmp_path / "store")
    other = [dict(r) for r in store.pairs().filter(pl.col("pair_id") == "p0").collect().drop("run_id", "shard_id").to_dicts()]
    unit_prompt = json.dumps([{"role": "user", "content": "Convert 3 km to miles."}])
    store.append("pairs", [{**other[0], "pair_id": "o0", "suite": "units", "prompt_json": unit_prompt}], run_id="r2",
                 shard_id="s0")
    assert len(load_training_data("preference", store=store)) == 4
    assert len(load_training_data("preference", store=store, run_ids=["r1"])) == 3
    assert len(load_training_data("preference", store=store, suites=["units"])) == 1
    with pytest.raises(TrainingDataError, match="no pairs rows left"):
        load_training_data("preference", store=store, run_ids=["r2"], suites=["arithmetic"])
    with pytest.raises(TrainingDataError, match="run and suite filters"):
        load_training_data("preference", tmp_path / "x.parquet", run_ids=["r1"])
    bad = CliRunner().invoke(app, ["train", "dpo", "--store", str(tmp_path / "nowhere"), "--out", str(tmp_path / "c")])
    assert bad.exit_code == 2 and "Traceback" not in bad.output and "nowhere" in bad.output


def test_store_replay_drops_zero_variance_prompts(tmp_path):
    store = _store_with_pairs_and_replay(tmp_path / "store")
    assert len(load_training_data("prompt", store=store)) == 4
    kept = load_training_data("prompt", store=store, drop_zero_variance=True)
    # p_success 0.0 and 1.0 go; 0.5 and unknown (null) stay.
    assert len(kept) == 2
    assert {json.loads(r["task_json"])["id"] for r in kept.rows} == {r["task_id"] for r in kept.rows}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "hf"])
def test_store_exports_load_with_their_lineage(tmp_path, fmt):
    from dataengine.derive.export import export

    store = _store_with_pairs_and_replay(tmp_path / "store")
    out = tmp_path / ("pairs.parquet" if fmt == "parquet" else "pairs")
    export(store, "pairs", out, format=fmt, include_logprobs=True)
    data = load_training_data("preference", out, behaviour_ref=True)
    assert len(data) == 3 and data.versions["pairs"] == store.version("pairs")
    assert {r["ref_chosen_logps"] for r in data.rows} == {-20.0}
    assert {json.dumps(r["chosen"]) for r in data.rows} == {json.dumps(
        [{"role": "assistant", "content": "", "tool_calls": [TEXT_CALL]}])}
    assert json.loads(data.rows[0]["tools"]) == [ADD_TOOL]
    out = tmp_path / ("replay.parquet" if fmt == "parquet" else "replay")
    export(store, "replay", out, format=fmt)
    prompts = load_training_data("prompt", out)
    assert len(prompts) == 4 and prompts.versions["replay"] == store.version("replay")
    assert prompts.rows[0]["prompt"][0]["role"] == "user"


def test_our_template_renders_export_rows_and_trainer_rows_alike(tmp_path):
    """dataengine's chat template renders structured calls; the trainer rows (arguments as
    text) render exactly like the exported rows (arguments as objects)."""
    from transformers import AutoTokenizer

    from dataengine.chat_template import install_tool_template
    from dataengine.models import model_folder

    tokenizer = install_tool_template(AutoTokenizer.from_pretrained(model_folder("tiny")), examples=None)
    thought = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "I add.", "tool_calls": [ADD_CALL]}]
    row = as_training_data("sft", [{"messages": thought, "tools": [ADD_TOOL]}]).rows[0]
    exported = tokenizer.apply_chat_template(thought, tools=[ADD_TOOL], tokenize=False)
    trained = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), tokenize=False)
    assert exported == trained
    assert "<|im_start|>assistant\nI add.\n" + CALL + "<|im_end|>" in exported


# ---- SFT label mask -----------------------------------------------------------------------


def test_sft_labels_cover_assistant_tokens_only(tmp_path):
    from dataengine.train.sft import SFTTrainConfig, build_sft_trainer

    config = SFTTrainConfig(init="tiny", out_dir=str(tmp_path / "sft"), max_steps=1)
    trainer, _model, tokenizer = build_sft_trainer(config, as_training_data("sft", [SFT_ROW]))
    batch = trainer.data_collator([trainer.train_dataset[0]])
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    trained = [i for i, label in zip(ids, labels) if label != -100]
    assert all(label in (-100, token) for token, label in zip(ids, labels))
    # Exactly the two assistant turns with their end-of-turn token: no prompt, no tool output.
    assert tokenizer.decode(trained) == CALL + "<|im_end|>" + "The answer is 42.<|im_end|>"
    masked = tokenizer.decode([i for i, label in zip(ids, labels) if label == -100])
    assert "<tool_response>\n42\n</tool_response>" in masked and "What is 17 plus 25?" in masked
    assert "<tools>" in masked  # the tool list in the system block is never trained on


def test_sft_turns_of_weight_zero_are_context_not_labels(tmp_path):
    """A recovery example's failed step (weight 0) is shown to the model but not trained on;
    a row mixing weighted and plain rows trains every other assistant turn as before."""
    from dataengine.train.sft import SFTTrainConfig, build_sft_trainer

    wrong = {"type": "function", "function": {"name": "add", "arguments": {"a": 17}}}
    recovery = {"messages": [
        {"role": "user", "content": "What is 17 plus 25?"},
        {"role": "assistant", "content": "", "tool_calls": [wrong], "weight": 0},
        {"role": "tool", "name": "add", "content": "Error: 'b' is a required property"},
        *SFT_ROW["messages"][1:],
    ], "tools": [ADD_TOOL]}
    data = as_training_data("sft", [recovery, SFT_ROW])
    assert data.rows[0]["messages"][1]["weight"] == 0 and "weight" not in data.rows[1]["messages"][1]
    config = SFTTrainConfig(init="tiny", out_dir=str(tmp_path / "sft"), max_steps=1)
    trainer, _model, tokenizer = build_sft_trainer(config, data)
    for index in (1, 0):  # the plain row, then the recovery row (its labels stay in `labels`)
        batch = trainer.data_collator([trainer.train_dataset[index]])
        ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
        trained = tokenizer.decode([i for i, label in zip(ids, labels) if label != -100])
        assert trained == CALL + "<|im_end|>" + "The answer is 42.<|im_end|>"
    masked = tokenizer.decode([i for i, label in zip(ids, labels) if label == -100])
    assert '{"a": 17}}</tool_call><|im_end|>' in masked  # the failed call is in the context
    with pytest.raises(TrainingDataError, match="weight must be 0"):
        as_training_data("sft", [{**recovery, "messages": [*recovery["messages"][:1], {**recovery["messages"][1], "weight": 2}]}])


# ---- DPO with behaviour log-probs, registration, loading ----------------------------------


def test_dpo_behaviour_reference_is_used_and_checkpoint_registered(tmp_path, behaviour_folder):
    from dataengine.models import load_model
    from dataengine.train.checkpoint import read_checkpoint_info
    from dataengine.train.dpo import DPOTrainConfig, behaviour_reference_logps, train_dpo
    from storage.store import Store

    store = Store(tmp_path / "store")
    # Logged log-probs (-20 / -5) are replaced by the behaviour model's scores of TRL's completions.
    rows = [pair(i, ref_chosen_logps=-20.0, ref_rejected_logps=-5.0) for i in range(2)]
    data = as_training_data("preference", rows)
    data.versions = {"pairs": 3}
    config = DPOTrainConfig(init="tiny", out_dir=str(tmp_path / "dpo"), max_steps=1, batch_size=2, device="cpu",
                            behaviour_ref=True, behaviour_model=str(behaviour_folder), beta=0.1, learning_rate=1e-4,
                            run_id="train-test")
    info = train_dpo(config, data, store=store)
    log = info.metrics["last_log"]
    refs = behaviour_reference_logps(str(behaviour_folder), data.rows, tokenizer=load_model("tiny")[1])
    ref_chosen, ref_rejected = (sum(side) / len(refs) for side in zip(*refs))
    # DPO's implicit reward is beta * (policy logp - reference logp), batch means in the log.
    assert log["rewards/chosen"] == pytest.approx(0.1 * (log["logps/chosen"] - ref_chosen), abs=1e-4)
    assert log["rewards/rejected"] == pytest.approx(0.1 * (log["logps/rejected"] - ref_rejected), abs=1e-4)
    assert abs(log["rewards/chosen"]) > 0.01  # a reference other than the policy, and not the logged -20
    assert info.metrics["reference"] == "behaviour" and info.metrics["behaviour_model"] == str(behaviour_folder)

    row = store.models().collect().to_dicts()
    assert len(row) == 1 and row[0]["model_id"] == info.model_id
    assert row[0]["parent_id"].startswith("tiny-llama@") and row[0]["kind"] == "dpo"
    assert json.loads(row[0]["dataset_versions_json"]) == {"pairs": 3}
    run = store.runs().collect().to_dicts()
    assert run[0]["run_id"] == "train-test" and run[0]["kind"] == "train_dpo" and run[0]["seed"] == 0
    assert run[0]["model_id"] == info.model_id and json.loads(run[0]["source_versions_json"]) == {"pairs": 3}
    assert read_checkpoint_info(info.path) == info
    model, tokenizer = load_model(info.path)
    assert "<tools>" in tokenizer.apply_chat_template(rows[0]["prompt"], tools=[ADD_TOOL], tokenize=False)
    # Training from this checkpoint names it as parent.
    from dataengine.train.checkpoint import parent_model_id

    assert parent_model_id(info.path, model) == info.model_id


def test_dpo_behaviour_ref_needs_a_known_behaviour_model(tmp_path):
    from dataengine.train.dpo import BehaviourModelError, DPOTrainConfig, build_dpo_trainer

    config = DPOTrainConfig(init="tiny", out_dir=str(tmp_path / "dpo"), max_steps=1, behaviour_ref=True, device="cpu")
    with pytest.raises(BehaviourModelError, match="set behaviour_model"):
        build_dpo_trainer(config, as_training_data("preference", [pair(0)]))
    with pytest.raises(BehaviourModelError, match="'nowhere'.*config.json"):
        build_dpo_trainer(config.replace(behaviour_model="nowhere"), as_training_data("preference", [pair(0)]))


# ---- behaviour reference: TRL's completion tokens, scored by the behaviour model ---------------

CALL_2 = {"type": "function", "function": {"name": "add", "arguments": {"a": 17, "b": 20}}}


def reference_pairs() -> list[dict]:
    """Step pairs (one assistant turn a side, one with a system turn and a thought) and
    trajectory pairs (whole episodes: calls, tool turns, final answers) in export form."""
    steps = [pair(0), pair(1), {
        "prompt": [{"role": "system", "content": "You can call tools."}, {"role": "user", "content": "Add 17 and 25."}],
        "chosen": [{"role": "assistant", "content": "I add them.", "tool_calls": [ADD_CALL]}],
        "rejected": [{"role": "assistant", "content": "", "tool_calls": [CALL_2]}], "tools": [ADD_TOOL]}]

    def episode(call, result, answer):
        return [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "name": "add", "content": result},
                {"role": "assistant", "content": answer}]

    trajectories = [{"prompt": [{"role": "user", "content": f"What is 17 plus {25 + i}?"}],
                     "chosen": episode(ADD_CALL, "42", "The answer is 42."),
                     "rejected": episode(CALL_2, "37", f"It is {37 + i}."), "tools": [ADD_TOOL]} for i in range(2)]
    return steps + trajectories


@pytest.fixture(scope="module")
def behaviour_folder(tmp_path_factory):
    """A second model with the tiny model's tokenizer and other weights: the behaviour policy."""
    import torch

    from dataengine.models import load_model

    model, tokenizer = load_model("tiny")
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.05)
    folder = tmp_path_factory.mktemp("models") / "tiny-behaviour"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def trl_reference(init: str, reference: str, rows: list[dict], max_length: int) -> list[tuple[float, float]]:
    """TRL's own reference log-probs: a plain DPOTrainer with `reference` as ref_model and
    precompute_ref_log_probs=True, on our trainer's settings (dataengine.train.base.trl_kwargs)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from dataengine.models import load_model
    from dataengine.train.base import trl_kwargs
    from dataengine.train.dpo import DPOTrainConfig

    model, tokenizer = load_model(init)
    ref_model, _ = load_model(reference)
    config = DPOTrainConfig(init=init, out_dir="unused", max_steps=1, device="cpu", max_length=max_length)
    args = DPOConfig(**trl_kwargs(config), max_length=max_length, precompute_ref_log_probs=True)
    rows = [{k: v for k, v in r.items() if not k.startswith("ref_")} for r in rows]  # TRL adds these itself
    trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer)
    assert len(trainer.train_dataset) == len(rows)  # no row dropped, so rows align
    return list(zip(trainer.train_dataset["ref_chosen_logps"], trainer.train_dataset["ref_rejected_logps"]))


def test_behaviour_reference_logps_equal_trls_reference_on_step_and_trajectory_pairs():
    """Our reference = TRL's: same completion tokens (end-of-turn and tool turns included, cut at
    max_length), same scores. 250 tokens cuts the trajectory rows and keeps the step rows whole."""
    from dataengine.models import load_model
    from dataengine.train.dpo import behaviour_reference_logps
    from dataengine.train.reference import trl_tokenized

    rows = as_training_data("preference", reference_pairs()).rows
    _, tokenizer = load_model("tiny")
    tokens = trl_tokenized(rows, tokenizer)
    assert tokenizer.decode(tokens[0]["chosen_ids"]) == CALL + "<|im_end|>\n"
    episode = tokenizer.decode(tokens[3]["chosen_ids"])
    assert "<tool_response>\n42\n</tool_response>" in episode and episode.endswith("The answer is 42.<|im_end|>\n")
    lengths = [len(t["prompt_ids"]) + max(len(t["chosen_ids"]), len(t["rejected_ids"])) for t in tokens]
    assert max(lengths[:3]) <= 250 < min(lengths[3:])

    ours = behaviour_reference_logps("tiny", rows, tokenizer=tokenizer, max_length=250)
    trl = trl_reference("tiny", "tiny", rows, max_length=250)
    assert len(ours) == len(trl) == 5
    for (chosen, rejected), (trl_chosen, trl_rejected) in zip(ours, trl):
        assert chosen == pytest.approx(trl_chosen, abs=1e-3) and rejected == pytest.approx(trl_rejected, abs=1e-3)
    # Cut at 250 tokens, the trajectory rows score fewer tokens than whole.
    whole = behaviour_reference_logps("tiny", rows[3:], tokenizer=tokenizer)
    assert all(w[0] < o[0] - 1.0 for w, o in zip(whole, ours[3:]))


def _store_with_behaviour_run(root, model_id: str, *, path: str | None):
    """A search run "gen1" whose nodes record `model_id`, its step pairs derived into it (the
    derive default), and, when `path` is given, the model registered in `models`."""
    from storage.store import Store

    store = Store(root)
    store.append("nodes", [{"task_id": "t0", "tree_id": "tr0", "node_id": 0, "model_id": model_id}], run_id="gen1",
                 shard_id="s0")
    pairs = [{"pair_id": f"p{i}", "kind": "step", "task_id": "t0", "suite": "arithmetic",
              "prompt_json": json.dumps(row["prompt"]), "chosen_json": json.dumps(row["chosen"]),
              "rejected_json": json.dumps(row["rejected"]), "tools_json": json.dumps(row["tools"]), "margin": 1.0,
              "chosen_logprob": -20.0, "rejected_logprob": -5.0} for i, row in enumerate(reference_pairs())]
    store.append("pairs", pairs, run_id="gen1", shard_id="derive/step-pairs")
    store.record_run("gen1", kind="derive/step-pairs", config={"run_ids": ["gen1"]}, shard_id="derive/step-pairs")
    if path is not None:
        store.append("models", [{"model_id": model_id, "path": path, "kind": "base"}], run_id="m", shard_id=model_id)
    return store


def test_dpo_behaviour_reference_scores_the_model_the_store_records(tmp_path, behaviour_folder):
    """build_dpo_trainer finds the pairs' behaviour model in the store (nodes.model_id -> the
    registered checkpoint with that weight hash) and its ref columns equal TRL's reference
    computed with that model; the policy (tiny) as reference gives other values."""
    from dataengine.models import checkpoint_hash
    from dataengine.train.dpo import DPOTrainConfig, build_dpo_trainer

    model_id = f"tiny-behaviour@{checkpoint_hash(behaviour_folder)}"
    store = _store_with_behaviour_run(tmp_path / "store", model_id, path=str(behaviour_folder))
    data = load_training_data("preference", store=store, behaviour_ref=True)
    config = DPOTrainConfig(init="tiny", out_dir=str(tmp_path / "dpo"), max_steps=1, device="cpu", max_length=512,
                            behaviour_ref=True)
    trainer, _, _ = build_dpo_trainer(config, data, store=store)
    assert trainer.behaviour_model == model_id
    ours = list(zip(trainer.train_dataset["ref_chosen_logps"], trainer.train_dataset["ref_rejected_logps"]))
    trl = trl_reference("tiny", str(behaviour_folder), data.rows, max_length=512)
    assert len(ours) == len(trl) == len(data) == 5
    for (chosen, rejected), (trl_chosen, trl_rejected) in zip(ours, trl):
        assert chosen == pytest.approx(trl_chosen, abs=1e-3) and rejected == pytest.approx(trl_rejected, abs=1e-3)
    policy = trl_reference("tiny", "tiny", data.rows, max_length=512)
    assert all(abs(o[0] - p[0]) > 0.1 for o, p in zip(ours, policy))
    assert all(o[0] != -20.0 for o in ours)  # the logged log-probs are not the reference


def test_behaviour_model_errors_say_what_is_missing(tmp_path, behaviour_folder):
    from dataengine.models import checkpoint_hash
    from dataengine.train.reference import BehaviourModelError, recorded_behaviour_model

    known = f"tiny-behaviour@{checkpoint_hash(behaviour_folder)}"
    store = _store_with_behaviour_run(tmp_path / "a", known, path=None)  # not registered: nowhere to load it from
    versions = {"pairs": store.version("pairs")}
    with pytest.raises(BehaviourModelError, match="not available locally.*set behaviour_model"):
        recorded_behaviour_model(store, versions)
    store.append("models", [{"model_id": known, "path": str(behaviour_folder), "kind": "base"}], run_id="m", shard_id="m")
    assert recorded_behaviour_model(store, versions) == (known, str(behaviour_folder))
    stale = _store_with_behaviour_run(tmp_path / "b", "tiny-behaviour@0000000000000000", path=str(behaviour_folder))
    with pytest.raises(BehaviourModelError, match="none exists with that weight hash"):
        recorded_behaviour_model(stale, {"pairs": stale.version("pairs")})
    store.append("nodes", [{"task_id": "t0", "tree_id": "tr1", "node_id": 0, "model_id": "other@1"}], run_id="gen1",
                 shard_id="s1")
    with pytest.raises(BehaviourModelError, match="several models"):
        recorded_behaviour_model(store, versions)
    with pytest.raises(BehaviourModelError, match="names no version"):
        recorded_behaviour_model(store, {"file:/x.parquet": "abc"})


def test_config_errors_name_the_field():
    from dataengine.train.dpo import DPOTrainConfig
    from dataengine.train.grpo import GRPOTrainConfig

    # Validated when built (pydantic sections of the one config tree), naming the field.
    with pytest.raises(ValueError, match="beta"):
        DPOTrainConfig(beta=0)
    with pytest.raises(ValueError, match="multiple of num_generations"):
        GRPOTrainConfig(batch_size=6, num_generations=4)
    with pytest.raises(ValueError, match="num_generations"):
        GRPOTrainConfig(batch_size=2, num_generations=1)
    with pytest.raises(ValueError, match="max_steps > 0 or num_train_epochs > 0"):
        DPOTrainConfig(max_steps=0)
    with pytest.raises(ValueError, match="device"):
        DPOTrainConfig(device="tpu")


# ---- GRPO: environment and reward over the real ToolEnv -------------------------------------


@pytest.fixture(scope="module")
def tool_env():
    from dataengine.env import ToolEnv
    from dataengine.tools.sandbox import Sandbox

    with Sandbox(workers=1, timeout_s=5.0) as sandbox:
        yield ToolEnv(sandbox, max_steps=6)


def test_environment_tool_schemas_match_the_task_specs():
    from transformers.utils import get_json_schema

    from dataengine.tools.registry import get_toolbox
    from dataengine.train.environment import environment_class

    for name in ("arithmetic", "units", "shop", "chains", "notool"):
        toolbox = get_toolbox(name)
        cls = environment_class(toolbox)
        for tool in toolbox.tools.values():
            schema = get_json_schema(getattr(cls, tool.name))
            assert schema.get("function", schema)["parameters"] == tool.spec.parameters, (name, tool.name)


def _trl_completion(task):
    """A rollout as TRL's tool loop records it: parsed assistant turns and tool turns."""
    from dataengine.parsing import parse_action

    messages = []
    for text in gold_turns(task)[:-1]:
        action = parse_action(text)
        calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in action.tool_calls]
        messages += [{"role": "assistant", "content": "", "tool_calls": calls}, {"role": "tool", "content": "?"}]
    return messages + [{"role": "assistant", "content": gold_turns(task)[-1]}]


def test_environment_runs_tools_in_the_sandbox_and_reward_scores_episodes(tool_env):
    from dataengine.tools.registry import get_toolbox
    from dataengine.train.environment import environment_class
    from dataengine.train.grpo import verifier_reward
    from dataengine.verifiers import CompositeReward

    task = next(t for t in generate_suite("arithmetic", 6, 0, seed=1) if t.gold.calls)
    cls = environment_class(get_toolbox(task.toolbox))
    reward = verifier_reward(CompositeReward(replay=tool_env.replay))

    envs = [cls(tool_env) for _ in range(3)]
    for env in envs:
        env.reset(task_json=task.model_dump_json(), task_id=task.id, prompt=[])
        for call in task.gold.calls:  # what TRL does for each parsed <tool_call>
            observation = getattr(env, call.name)(**call.arguments)
            assert not observation.startswith("Error"), observation
    assert envs[0]._state.steps[0].results[0].status == "ok"
    bad = cls(tool_env)
    bad.reset(task_json=task.model_dump_json())
    assert bad.add(a="x", b=1).startswith("Error")  # bad arguments are an observation, not a crash

    good = _trl_completion(task)
    wrong = good[:-1] + [{"role": "assistant", "content": "-1"}]
    cut = good[:-1]  # the rollout ran out of budget after its last tool call
    metrics = {}
    scores = reward(prompts=[[]] * 3, completions=[good, wrong, cut], environments=envs,
                    log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert scores[0] >= 1.0 > scores[1]
    assert scores[2] < 1.0
    assert metrics["verifier/success_rate"] == pytest.approx(1 / 3)


def test_parallel_calls_of_one_reply_become_one_step(tool_env):
    from dataengine.tools.registry import get_toolbox
    from dataengine.train.environment import environment_class, final_reply, regroup_turns

    task = next(t for t in generate_suite("arithmetic", 6, 0, seed=1) if len(t.gold.calls) == 1)
    call = task.gold.calls[0]
    env = environment_class(get_toolbox(task.toolbox))(tool_env)
    env.reset(task_json=task.model_dump_json())
    for _ in range(2):  # TRL runs the two calls of one reply one after the other
        getattr(env, call.name)(**call.arguments)
    trl_call = {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    completion = [
        {"role": "assistant", "content": "Let me compute it twice.", "tool_calls": [trl_call, trl_call]},
        {"role": "tool", "content": "?"}, {"role": "tool", "content": "?"},
        {"role": "assistant", "content": task.gold.answer},
    ]
    raw = env._episode(final_reply(completion))
    assert len(raw.steps) == 3
    episode = regroup_turns(raw, completion)
    assert [len(s.action.tool_calls) for s in episode.steps] == [2, 0]
    assert episode.steps[0].action.thought == "Let me compute it twice."
    assert len(episode.steps[0].results) == 2 and episode.final_answer == task.gold.answer
    assert episode.done


def test_mid_episode_prompt_is_replayed_and_scored_as_one_episode(tool_env):
    """GRPO from tree prefixes: a prompt holding the task and the first tool call
    with its result (a tree node's conversation, in TRL's form) is replayed through ToolEnv at
    reset, the rollout's second call executes on that state, and the reward judges the whole
    episode. A prompt whose recorded tool result the tools do not reproduce is refused."""
    from dataengine.parsing import render_tool_calls
    from dataengine.tools.registry import get_toolbox
    from dataengine.train.environment import environment_class
    from dataengine.train.grpo import verifier_reward
    from dataengine.verifiers import CompositeReward
    from storage.formats import chat_messages

    task = next(t for t in generate_suite("arithmetic", 20, 0, seed=1) if len(t.gold.calls) == 2)
    first, second = task.gold.calls
    node = tool_env.step(tool_env.reset(task), render_tool_calls([first])).state
    prompt = chat_messages([m.model_dump() for m in node.messages], "node")
    assert [m["role"] for m in prompt][-2:] == ["assistant", "tool"]
    cls = environment_class(get_toolbox(task.toolbox))
    reward = verifier_reward(CompositeReward(replay=tool_env.replay))

    def rollout(answer: str):
        env = cls(tool_env)
        env.reset(task_json=task.model_dump_json(), prompt=prompt)
        assert env._prefix_steps == 1 and env._state.steps[0].results[0].status == "ok"
        observation = getattr(env, second.name)(**second.arguments)  # TRL executes the rollout's call
        assert not observation.startswith("Error"), observation
        call = {"type": "function", "function": {"name": second.name, "arguments": second.arguments}}
        completion = [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": observation},
                      {"role": "assistant", "content": answer}]
        return env, completion

    (good_env, good), (bad_env, bad) = rollout(task.gold.answer), rollout("-1")
    scores = reward(prompts=[prompt] * 2, completions=[good, bad], environments=[good_env, bad_env])
    assert scores[0] >= 1.0 > scores[1]
    episode = good_env._episode(task.gold.answer)
    assert [c.name for c in episode.calls] == [first.name, second.name]

    tampered = [dict(m) for m in prompt]
    tampered[-1]["content"] = "999999"
    with pytest.raises(ValueError, match="replaying step 1 gives tool turns"):
        cls(tool_env).reset(task_json=task.model_dump_json(), prompt=tampered)
    other = [{"role": "user", "content": "What is 1 + 1?"}] + prompt[1:]
    with pytest.raises(ValueError, match="does not start with the task's messages"):
        cls(tool_env).reset(task_json=task.model_dump_json(), prompt=other)


def test_environment_refuses_a_task_of_another_toolbox(tool_env):
    from dataengine.tools.registry import get_toolbox
    from dataengine.train.environment import environment_class

    task = generate_suite("units", 1, 0, seed=0)[0]
    env = environment_class(get_toolbox("arithmetic"))(tool_env)
    with pytest.raises(ValueError, match="routed to the 'arithmetic' environment"):
        env.reset(task_json=task.model_dump_json())


def test_cli_lists_the_train_commands():
    from typer.testing import CliRunner

    from dataengine.cli import app

    result = CliRunner().invoke(app, ["train", "--help"])
    assert result.exit_code == 0, result.output
    for name in ("dpo", "sft", "grpo", "chain"):
        assert name in result.output
    result = CliRunner().invoke(app, ["train", "dpo", "--out", "x", "--init", "tiny"])
    assert result.exit_code != 0 and "--data" in result.output


# ---- TRL's fused LM head on CPU ------------------------------------------------------------


def test_cpu_fused_head_scores_labelled_positions_only_with_the_same_log_probs(monkeypatch):
    """fit_fused_head_to_cpu makes TRL score only labelled positions, in small tiles; the
    log-probs equal a plain log_softmax over the model's logits."""
    import torch
    from trl.kernels import chunked_logprob
    from trl.trainer.utils import add_fused_lm_head

    from dataengine.models import load_model
    from dataengine.train.base import CPU_LOGPROB_TILE, fit_fused_head_to_cpu

    model, _ = load_model("tiny")
    ids = torch.randint(0, model.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :25] = -100  # a prompt
    labels[1, 30:] = -100  # padding
    with torch.no_grad():
        expected = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    expected = expected.masked_fill(labels[:, 1:] == -100, 0)

    scored = []
    real_apply = chunked_logprob.ChunkedLogProbFunction.apply

    def counting_apply(hidden, *args):
        scored.append(hidden.shape[0])
        return real_apply(hidden, *args)

    fit_fused_head_to_cpu("cpu")
    assert chunked_logprob.TOKEN_CHUNK_SIZE == CPU_LOGPROB_TILE
    add_fused_lm_head(model)
    monkeypatch.setattr(chunked_logprob.ChunkedLogProbFunction, "apply", counting_apply)
    with torch.no_grad():
        got = model(ids, labels=labels, fused_lm_head=True).log_probs
    assert scored == [int((labels[:, 1:] != -100).sum())]  # 15 + 5 + 15, not 3 x 39
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
