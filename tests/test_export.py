"""Exports: TRL formats with structured tool calls in parquet/jsonl/hf, `load_dataset(folder)`,
rendering by several model families' chat templates, filters, dedup counts, lineage inside the
export, exact rebuilds, and atomic writes (a SIGKILL mid-export leaves the old export)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import polars as pl
import pytest

from dataengine.derive.export import export, export_frame, reexport
from storage import MissingTableError, Store
from storage.export import ExportFilters, lineage_path, load_exported, read_lineage
from storage.formats import PAIRS, REPLAY, SFT, dataset_kind, features

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "Find an order.", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string", "enum": ["A1", "B2"]},
                                         "verbose": {"type": "boolean", "default": False}}, "required": ["order_id"]}}},
]
PROMPT = [{"role": "system", "content": "You can call tools."}, {"role": "user", "content": "What is 17 plus 25?"}]
CALL_TEXT = '<tool_call>{{"name": "add", "arguments": {{"a": 17, "b": {b}}}}}</tool_call>'


def stored_call(b: int, thought: str = "") -> dict:
    """An assistant turn as the engine stores it (dataengine.types.Message): raw text + parsed calls."""
    text = (thought + "\n" if thought else "") + CALL_TEXT.format(b=b)
    return {"role": "assistant", "content": text, "tool_calls": [{"name": "add", "arguments": {"a": 17, "b": b}}],
            "name": None}


def trl_call(b: int, thought: str = "") -> dict:
    """The same turn as the export writes it."""
    return {"role": "assistant", "content": thought,
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 17, "b": b}}}]}


def pair_rows() -> list[dict]:
    rows = []
    for i in range(8):
        rows.append({
            "pair_id": f"p{i}", "kind": "step" if i < 6 else "trajectory", "task_id": f"t{i % 2}",
            "suite": "arith" if i < 7 else "orders", "prompt_json": json.dumps(PROMPT),
            "chosen_json": json.dumps([stored_call(25, "I add them.")]),
            "rejected_json": json.dumps([stored_call(20 + i % 4)]),
            "tools_json": json.dumps(TOOLS), "margin": 0.1 * i, "chosen_logprob": -1.0 - i, "rejected_logprob": -3.0,
        })
    return rows


TOOL_TURNS = PROMPT + [stored_call(25), {"role": "tool", "name": "add", "content": "42", "tool_calls": []},
                       {"role": "assistant", "content": "The answer is 42.", "tool_calls": []}]


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store(tmp_path / "store")
    store.append("pairs", pair_rows(), run_id="derive-1", shard_id="0")
    store.append("sft", [
        {"example_id": "e0", "kind": "rs", "task_id": "t0", "suite": "arith", "messages_json": json.dumps(TOOL_TURNS),
         "tools_json": json.dumps(TOOLS), "score": 1.0},
        {"example_id": "e1", "kind": "recovery", "task_id": "t1", "suite": "arith",
         "messages_json": json.dumps(PROMPT + [{"role": "assistant", "content": "42"}]), "tools_json": None, "score": 0.5},
    ], run_id="derive-1", shard_id="0")
    store.append("replay", [
        {"prompt_id": f"q{i}", "task_id": f"t{i}", "suite": "arith", "prompt_json": json.dumps(PROMPT),
         "tools_json": json.dumps(TOOLS), "task_json": json.dumps({"id": f"t{i}"}), "p_success": i / 4}
        for i in range(5)
    ], run_id="derive-1", shard_id="0")
    return store


def plain(messages: list[dict]) -> list[dict]:
    """Messages without the fields Arrow fills with null for turns that lack them."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def out_path(tmp_path: Path, name: str, fmt: str) -> Path:
    """parquet: a file alone in its folder (so load_dataset(folder) reads it); else a folder."""
    return tmp_path / name / f"{name}.parquet" if fmt == "parquet" else tmp_path / name


def load_folder(out: Path, fmt: str, tmp_path: Path) -> datasets.Dataset:
    folder = out.parent if fmt == "parquet" else out
    return datasets.load_dataset(str(folder), split="train", cache_dir=str(tmp_path / "hf-cache"))


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "hf"])
def test_pairs_export_loads_with_load_dataset_folder_and_structured_calls(store, tmp_path, fmt):
    out = out_path(tmp_path, "pairs", fmt)
    result = export(store, "pairs", out, format=fmt)
    ds = load_folder(out, fmt, tmp_path)
    assert set(ds.column_names) == {"prompt", "chosen", "rejected", "tools"}
    assert ds.features == features("pairs")
    assert ds.num_rows == result.rows == 4  # 8 pairs, rejected side takes 4 distinct values
    assert result.dedup == {"rows_in": 8, "exact_removed": 4, "near_removed": 0, "rows_out": 4}
    row = ds[0]
    assert plain(row["prompt"]) == PROMPT  # the system turn is kept
    assert plain(row["chosen"]) == [trl_call(25, "I add them.")]
    assert plain(row["rejected"]) == [trl_call(20)]
    assert row["tools"] == TOOLS  # JSON schemas, heterogeneous across tools, as dicts
    # The lineage travels inside the export: nothing else beside the data and its card.
    lineage = read_lineage(out)
    assert lineage == read_lineage(lineage_path(out, fmt))
    assert lineage["source_versions"] == {"pairs": store.version("pairs")} and lineage["rows"] == 4
    if fmt == "parquet":
        assert [p.name for p in out.parent.iterdir()] == ["pairs.parquet"]
    else:
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
            "README.md", "data", f"data/train-00000-of-00001.{'jsonl' if fmt == 'jsonl' else 'parquet'}"]
    # load_exported is the same load.
    assert load_exported(out, fmt, cache_dir=str(tmp_path / "hf-cache"))[0] == row


def test_jsonl_lines_hold_plain_objects(store, tmp_path):
    out = tmp_path / "sft"
    export(store, "sft", out, format="jsonl")
    lines = (out / "data" / "train-00000-of-00001.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert first["tools"] == TOOLS
    assert first["messages"][2] == trl_call(25)  # arguments an object, unset fields left out
    assert first["messages"][3] == {"role": "tool", "name": "add", "content": "42"}


def test_parquet_export_is_what_load_dataset_parquet_reads(store, tmp_path):
    out = tmp_path / "p.parquet"
    export(store, "pairs", out, include_logprobs=True, dedup="none")
    ds = datasets.load_dataset("parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "c"))
    assert ds.num_rows == 8
    assert ds["ref_chosen_logps"][:2] == [-1.0, -2.0]
    assert plain(ds[0]["chosen"]) == [trl_call(25, "I add them.")]


def test_filters(store, tmp_path):
    def rows(**kw) -> int:
        return export(store, "pairs", tmp_path / "f.parquet", filters=ExportFilters(**kw), dedup="none").rows

    assert rows(min_margin=0.45) == 3
    assert rows(kinds=["trajectory"]) == 2
    assert rows(suites=["orders"]) == 1
    assert rows(task_ids=["t0"], run_ids=["derive-1"]) == 4
    assert rows(where="margin < 0.25 AND kind = 'step'") == 3
    assert rows(limit=2) == 2
    with pytest.raises(ValueError, match="applies to sft"):
        rows(min_score=0.5)
    with pytest.raises(ValueError, match="bad --where"):
        rows(where="margin <<< 2")


def test_sft_export_has_tool_turns_and_empty_tools(store, tmp_path):
    out = tmp_path / "sft"
    result = export(store, "sft", out, format="jsonl", filters=ExportFilters(min_score=0.0))
    ds = load_exported(out, "jsonl", cache_dir=str(tmp_path / "c"))
    assert result.rows == 2 and set(ds.column_names) == {"messages", "tools"}
    assert plain(ds[0]["messages"]) == PROMPT + [
        trl_call(25), {"role": "tool", "name": "add", "content": "42"},
        {"role": "assistant", "content": "The answer is 42."}]
    assert ds[1]["tools"] == []


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_sft_export_keeps_the_weight_of_a_failed_step(tmp_path, fmt):
    """A recovery row's failed step (weight 0) survives export and loading for training."""
    from dataengine.train.data import load_training_data

    store = Store(tmp_path / "store")
    failed = {**stored_call(99), "weight": 0}
    messages = PROMPT + [failed, {"role": "tool", "name": "add", "content": "116"}, *TOOL_TURNS[len(PROMPT):]]
    store.append("sft", [{"example_id": "e0", "kind": "recovery", "task_id": "t0", "suite": "arith",
                          "messages_json": json.dumps(messages), "tools_json": json.dumps(TOOLS), "score": 1.0}],
                 run_id="r", shard_id="0")
    out = tmp_path / ("sft.parquet" if fmt == "parquet" else "sft")
    export(store, "sft", out, format=fmt)
    rows = load_training_data("sft", out).rows[0]["messages"]
    assert [m.get("weight") for m in rows if m["role"] == "assistant"] == [0, None, None]
    assert load_training_data("sft", store=store).rows[0]["messages"] == rows


def test_replay_export_is_prompt_only_with_task(store, tmp_path):
    out = tmp_path / "replay.parquet"
    result = export(store, "replay", out, filters=ExportFilters(min_p_success=0.25, max_p_success=0.75))
    ds = load_exported(out, cache_dir=str(tmp_path / "c"))
    assert set(ds.column_names) == {"prompt", "tools", "task_id", "task_json"}
    assert ds["task_id"] == ["t1", "t2", "t3"] and result.rows == 3
    assert json.loads(ds[0]["task_json"]) == {"id": "t1"}


def test_turns_stored_without_parsed_calls_keep_their_raw_text(tmp_path):
    store = Store(tmp_path / "store")
    raw = [{"role": "assistant", "content": CALL_TEXT.format(b=25)}]
    store.append("pairs", [{**pair_rows()[0], "chosen_json": json.dumps(raw)}], run_id="r", shard_id="0")
    frame, _, _, _ = export_frame(store, "pairs")
    chosen = frame.to_dicts()[0]["chosen"]
    assert chosen == [{"role": "assistant", "content": CALL_TEXT.format(b=25), "name": None, "tool_calls": None}]


def test_exact_dedup_tells_calls_apart_even_without_text(tmp_path):
    store = Store(tmp_path / "store")
    silent = [{**pair_rows()[i], "chosen_json": json.dumps([{**stored_call(b), "content": ""}]),
               "rejected_json": json.dumps([stored_call(99)])} for i, b in enumerate((1, 2, 2))]
    store.append("pairs", silent, run_id="r", shard_id="0")
    assert export(store, "pairs", tmp_path / "d.parquet").dedup == {
        "rows_in": 3, "exact_removed": 1, "near_removed": 0, "rows_out": 2}


def test_near_dedup_is_reported(store, tmp_path):
    result = export(store, "pairs", tmp_path / "n.parquet", dedup="near", near_threshold=0.9)
    assert result.dedup["exact_removed"] == 4
    assert result.dedup["near_removed"] >= 1
    assert result.rows == 4 - result.dedup["near_removed"]


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_reexport_rebuilds_the_same_rows_after_more_appends(store, tmp_path, fmt):
    first = tmp_path / ("a.parquet" if fmt == "parquet" else "a")
    export(store, "pairs", first, format=fmt, filters=ExportFilters(min_margin=0.2), record_run_id="export-1")
    store.append("pairs", [{**pair_rows()[7], "pair_id": "new", "rejected_json": json.dumps([stored_call(99)])}],
                 run_id="derive-2", shard_id="0")
    assert export(store, "pairs", tmp_path / "b.parquet", filters=ExportFilters(min_margin=0.2)).rows == 5
    again = reexport(store, first, tmp_path / "c.parquet", format="parquet")
    assert again.rows == 4
    old = first if fmt == "parquet" else first / "data" / "train-00000-of-00001.parquet"
    assert pl.read_parquet(old).equals(pl.read_parquet(tmp_path / "c.parquet"))
    run = store.runs().collect().row(0, named=True)
    assert run["kind"] == "export" and json.loads(run["source_versions_json"]) == {"pairs": 1}


def test_export_reads_committed_shards_only_and_rebuilds_the_same_shards(tmp_path):
    store = Store(tmp_path / "store")
    store.append("tasks", [{"task_id": "t0"}], run_id="r", shard_id="0")
    rows = _sft_rows(2).to_dicts()
    store.append("sft", rows[:1], run_id="r", shard_id="0", marker="tasks")
    store.append("sft", rows[1:], run_id="r", shard_id="1", marker="tasks")  # its tasks marker is missing
    first = export(store, "sft", tmp_path / "a.parquet", dedup="none")
    assert first.rows == 1
    assert first.source_versions == {"sft": store.version("sft"), "tasks": store.version("tasks")}
    store.append("tasks", [{"task_id": "t1"}], run_id="r", shard_id="1")  # now the shard is committed
    assert export(store, "sft", tmp_path / "b.parquet", dedup="none").rows == 2
    assert reexport(store, tmp_path / "a.parquet", tmp_path / "c.parquet").rows == 1


def test_balance_by_oversamples_each_task_level_to_the_largest(tmp_path):
    store = Store(tmp_path / "store")
    store.append("tasks", [{"task_id": f"t{i}", "task_json": json.dumps({"id": f"t{i}", "metadata": {"level": 1 + i % 2}})}
                           for i in range(3)], run_id="r", shard_id="0")
    # Five level-1 pairs (t0, t2), two level-2 pairs (t1): distinct rejected sides, so no dedup.
    rows = [{**pair_rows()[0], "pair_id": f"p{i}", "task_id": task, "rejected_json": json.dumps([stored_call(30 + i)])}
            for i, task in enumerate(["t0", "t1", "t2", "t0", "t1", "t2", "t0"])]
    store.append("pairs", rows, run_id="r", shard_id="0")
    out = tmp_path / "bal.parquet"
    result = export(store, "pairs", out, balance_by="level")
    assert result.balance == {"by": "level", "rows_before": {"1": 5, "2": 2}}
    assert result.rows == 10 and result.source_versions["tasks"] == store.version("tasks")
    written = pl.read_parquet(out)
    rejected_b = [json.loads(r[0]["tool_calls"][0]["function"]["arguments"])["b"] for r in written["rejected"].to_list()]
    # Level 1 in order, then level 2's two pairs three times over, cut at five rows.
    assert rejected_b == [30, 32, 33, 35, 36, 31, 34, 31, 34, 31]
    assert read_lineage(out)["balance"] == result.balance
    assert reexport(store, out, tmp_path / "again.parquet").rows == 10
    assert export(store, "pairs", tmp_path / "plain.parquet").rows == 7  # off by default
    with pytest.raises(ValueError, match="no task of these rows has metadata.levle"):
        export(store, "pairs", tmp_path / "x.parquet", balance_by="levle")
    with pytest.raises(ValueError, match="must name task metadata fields"):
        export(store, "pairs", tmp_path / "x.parquet", balance_by="level') or true")
    with pytest.raises(ValueError, match="not 'level,'"):
        export(store, "pairs", tmp_path / "x.parquet", balance_by="level,")
    assert not (tmp_path / "x.parquet").exists()


def test_balance_by_level_and_decision_evens_out_what_the_pairs_prefer(tmp_path):
    """Pairs of two levels whose chosen side answers or calls again: balancing by level alone
    keeps each level's lean; by level and decision every (level, direction) cell gets as many
    rows as the largest. SFT rows leave `decision` out (it is a property of pairs)."""
    store = Store(tmp_path / "store")
    store.append("tasks", [{"task_id": f"t{i}", "task_json": json.dumps({"id": f"t{i}", "metadata": {"level": i}})}
                           for i in (1, 2)], run_id="r", shard_id="0")
    answer = json.dumps([{"role": "assistant", "content": "42"}])
    call = json.dumps([stored_call(7)])
    broken = json.dumps([{"role": "assistant", "content": '<tool_call>{"name": "add", "arguments": {'}])
    # level 1: three "answer over call", one "call over answer"; level 2: one "answer over a malformed call"
    sides = [("t1", answer, call), ("t1", answer, call), ("t1", answer, call), ("t1", call, answer), ("t2", answer, broken)]
    rows = [{**pair_rows()[0], "pair_id": f"p{i}", "task_id": task, "chosen_json": chosen,
             "rejected_json": rejected, "prompt_json": json.dumps([{"role": "user", "content": f"q{i}"}])}
            for i, (task, chosen, rejected) in enumerate(sides)]
    store.append("pairs", rows, run_id="r", shard_id="0")
    by_level = export(store, "pairs", tmp_path / "a.parquet", balance_by="level")
    assert by_level.balance["rows_before"] == {"1": 4, "2": 1} and by_level.rows == 8
    both = export(store, "pairs", tmp_path / "b.parquet", balance_by="level,decision")
    assert both.balance == {"by": "level,decision",
                            "rows_before": {"1|answer>call": 3, "1|call>answer": 1, "2|answer>call": 1}}
    assert both.rows == 9
    written = pl.read_parquet(tmp_path / "b.parquet")
    firsts = [("call" if r[0]["tool_calls"] else "answer") for r in written["chosen"].to_list()]
    assert firsts.count("call") == 3 and firsts.count("answer") == 6
    assert reexport(store, tmp_path / "b.parquet", tmp_path / "c.parquet").balance == both.balance
    only = export(store, "pairs", tmp_path / "d.parquet", balance_by="decision")
    assert only.balance["rows_before"] == {"answer>call": 4, "call>answer": 1} and only.rows == 8
    assert "tasks" not in only.source_versions  # decision alone needs no task metadata
    deep = {**rows[0], "pair_id": "deep", "prompt_json": json.dumps(
        [{"role": "user", "content": "q"}, stored_call(1), {"role": "tool", "name": "add", "content": "18"}])}
    store.append("pairs", [deep], run_id="r", shard_id="1")
    by_depth = export(store, "pairs", tmp_path / "e.parquet", balance_by="depth,decision")
    assert by_depth.balance["rows_before"] == {"0|answer>call": 4, "0|call>answer": 1, "1|answer>call": 1}
    sft = _sft_rows(3).with_columns(task_id=pl.Series(["t1", "t1", "t2"]))
    store.append("sft", sft.to_dicts(), run_id="r", shard_id="0")
    balanced = export(store, "sft", tmp_path / "sft.parquet", balance_by="level,depth,decision")
    assert balanced.balance["rows_before"] == {"1": 2, "2": 1} and balanced.rows == 4


def test_bad_rows_missing_tables_and_paths_are_named(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(MissingTableError, match="'pairs'"):
        export(store, "pairs", tmp_path / "x.parquet")
    store.append("pairs", [{**pair_rows()[0], "chosen_json": "{not json"}], run_id="r", shard_id="0")
    with pytest.raises(ValueError, match="row p0: chosen_json is not JSON"):
        export(store, "pairs", tmp_path / "x.parquet")
    store.append("pairs", [{**pair_rows()[0], "chosen_json": json.dumps([{"role": "robot", "content": "x"}])}],
                 run_id="r", shard_id="0")
    with pytest.raises(ValueError, match="row p0: chosen_json message 0 has unknown role 'robot'"):
        export(store, "pairs", tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="unknown export"):
        export(store, "dpo", tmp_path / "x.parquet")
    (tmp_path / "file").write_text("x")
    store.append("pairs", pair_rows()[:1], run_id="r", shard_id="0")
    with pytest.raises(ValueError, match="is a file; jsonl exports write a dataset folder"):
        export(store, "pairs", tmp_path / "file", format="jsonl")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_one_name_per_kind():
    assert dataset_kind("preference") is PAIRS and dataset_kind("prompt") is REPLAY and dataset_kind("sft") is SFT
    assert PAIRS.store_message_columns == ("prompt_json", "chosen_json", "rejected_json")
    with pytest.raises(ValueError, match="unknown dataset kind 'dpo'"):
        dataset_kind("dpo")


# ---- rendering with several model families' chat templates -----------------------------------


def _tokenizer(template: str):
    """SmolLM2's tokenizer (the tiny model's) with our tool-aware template, or with a chat
    template TRL ships (other model families)."""
    from transformers import AutoTokenizer

    from dataengine.chat_template import install_tool_template
    from dataengine.models import model_folder

    tokenizer = AutoTokenizer.from_pretrained(model_folder("tiny"))
    if template == "dataengine":
        return install_tool_template(tokenizer, examples=None)
    from trl import chat_template_utils

    tokenizer.chat_template = getattr(chat_template_utils, f"{template}_chat_template")
    return tokenizer


@pytest.mark.parametrize("template", ["dataengine", "qwen3", "llama3_1"])
def test_exports_render_with_several_model_families_templates(store, tmp_path, template, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from trl.data_utils import apply_chat_template, is_conversational

    tokenizer = _tokenizer(template)
    cache = str(tmp_path / "c")
    export(store, "pairs", tmp_path / "p.parquet")
    export(store, "sft", tmp_path / "s", format="jsonl")
    export(store, "replay", tmp_path / "r", format="hf")
    pair = load_exported(tmp_path / "p.parquet", cache_dir=cache)[0]
    sft = load_exported(tmp_path / "s", "jsonl", cache_dir=cache)[0]
    replay = load_exported(tmp_path / "r", "hf", cache_dir=cache)[0]

    # The rows go to the tokenizer as they are: tools= takes the column.
    text = tokenizer.apply_chat_template(sft["messages"], tools=sft["tools"], tokenize=False)
    assert "What is 17 plus 25?" in text and "The answer is 42." in text and "42" in text
    assert '"add"' in text and "25" in text.split("What is 17 plus 25?")[1]  # the call, after the question
    assert "lookup" in text.split("What is 17 plus 25?")[0]  # the tool list, before it
    assert is_conversational(pair)
    rendered = apply_chat_template({k: pair[k] for k in ("prompt", "chosen", "rejected")}, tokenizer, tools=pair["tools"])
    assert "What is 17 plus 25?" in rendered["prompt"] and "lookup" in rendered["prompt"]
    assert '"add"' in rendered["chosen"] and "25" in rendered["chosen"] and "25" not in rendered["rejected"]
    prompt = apply_chat_template({"prompt": replay["prompt"]}, tokenizer, tools=replay["tools"])["prompt"]
    assert prompt.rstrip().endswith(("assistant", "<|start_header_id|>assistant<|end_header_id|>"))
    if template == "dataengine":  # our template renders the call the way the policy writes it
        assert '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>' in text
        assert rendered["chosen"].startswith('I add them.\n<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}')


# ---- atomic writes ----------------------------------------------------------------------------

_CHILD = """
import sys
from storage import Store
from dataengine.derive.export import export
export(Store(sys.argv[1]), "sft", sys.argv[2], format=sys.argv[3], dedup="none")
"""


def _digest(path: Path) -> str:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


def _sft_rows(n: int, start: int = 0) -> pl.DataFrame:
    ids = [f"e{i}" for i in range(start, start + n)]
    messages = [json.dumps(PROMPT + [stored_call(i), {"role": "assistant", "content": f"It is {i}."}]) for i in ids]
    return pl.DataFrame({"example_id": ids, "kind": "rs", "task_id": "t0", "suite": "arith",
                         "messages_json": messages, "tools_json": json.dumps(TOOLS), "score": 1.0})


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_sigkill_mid_export_leaves_the_old_export_intact(tmp_path, fmt):
    store = Store(tmp_path / "store")
    store.append("sft", _sft_rows(50), run_id="r", shard_id="0")
    folder = tmp_path / "exports"
    out = folder / "sft.parquet" if fmt == "parquet" else folder / "sft"
    export(store, "sft", out, format=fmt, dedup="none")
    before, lineage = _digest(out), read_lineage(out)
    store.append("sft", _sft_rows(20_000, start=50), run_id="r", shard_id="1")

    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(store.root), str(out), fmt],
                             cwd=Path(__file__).resolve().parents[1], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    partial = None
    while partial is None and child.poll() is None and time.monotonic() < deadline:
        # The hidden temporary holds written data: kill the export in the middle of writing it.
        for entry in folder.iterdir():
            if entry.name.startswith(".") and (entry.is_file() or (entry / "data").is_dir()):
                partial = entry
        time.sleep(0.001)
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    assert partial is not None, f"the export ended (rc {child.returncode}) before it was killed: {child.stderr.read()[-2000:]!r}"
    assert child.returncode == -signal.SIGKILL

    assert _digest(out) == before and read_lineage(out) == lineage  # old data, old lineage
    visible = [p.name for p in folder.iterdir() if not p.name.startswith(".")]
    assert visible == [out.name]
    ds = load_folder(out, fmt, tmp_path)  # the leftover temporary is hidden from load_dataset too
    assert ds.num_rows == lineage["rows"] == 50
    # The next export replaces the old one whole.
    export(store, "sft", out, format=fmt, filters=ExportFilters(limit=70), dedup="none")
    assert read_lineage(out)["rows"] == 70 and load_folder(out, fmt, tmp_path).num_rows == 70


def test_storage_imports_nothing_from_the_engine_and_export_renders_no_messages():
    """storage/ imports nothing from dataengine/; storage/export.py writes rows it is given and
    knows neither message roles nor `<tool_call>` markup (dataengine/derive/export.py renders them)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "storage"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "dataengine" or n.startswith("dataengine.") for n in names), (path.name, names)
    text = (root / "export.py").read_text(encoding="utf-8")
    assert "<tool_call>" not in text and "CALL_TAG" not in text and '"role"' not in text
