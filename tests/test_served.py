"""The `openai` backend against a real `vllm serve` of SmolLM2 on 127.0.0.1, and the in-process
`vllm` backend on the same prompts.

The server tests need vLLM, so they run in `.venv-vllm` (`make test-vllm`, which `make test`
runs) and are skipped where vLLM is not installed; the settings and error tests at the top run in
either environment. One server per module (about 45 s to start); the last test kills it mid-run
and starts another.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataengine.config import EngineConfig, PolicyConfig
from dataengine.models import model_folder
from dataengine.policy import Conversation, make_policy
from dataengine.policy.openai import EndpointError, route, vllm_server_command, wait_until_served
from dataengine.suites import generate_suite

# A vllm server and engine: .venv-vllm only, and slow (about 45 s per server start).
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is installed in .venv-vllm only")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log: Path) -> subprocess.Popen:
    cmd = vllm_server_command(str(model_folder("smollm2")), port=port, python=sys.executable)
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_until_served(f"http://127.0.0.1:{port}/v1", proc, timeout_s=600)
    except RuntimeError:
        stop_server(proc)
        raise RuntimeError(f"vllm server did not start; log tail: {log.read_text()[-2000:]}") from None
    return proc


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the API server and its engine process
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("served") / "server.log"
    state = {"port": port, "log": log, "proc": start_server(port, log)}
    yield state
    stop_server(state["proc"])


@pytest.fixture(scope="module")
def served(server):
    return make_policy("openai", "smollm2", base_url=f"http://127.0.0.1:{server['port']}/v1", max_retries=1, timeout_s=300)


@pytest.fixture(scope="module")
def engine():
    return make_policy("vllm", "smollm2", dtype="float32")


@pytest.fixture(scope="module")
def convs():
    tasks = generate_suite("arithmetic", 4, 0, seed=0) + generate_suite("units", 4, 0, seed=0)
    return [Conversation.from_task(t) for t in tasks]


@pytest.mark.slow
@needs_vllm
def test_greedy_tokens_equal_in_process_vllm(served, engine, convs):
    assert [served.encode(c) for c in convs] == [engine.encode(c) for c in convs]
    got = served.sample(convs, 1, max_new_tokens=40, temperature=0.0)
    want = engine.sample(convs, 1, max_new_tokens=40, temperature=0.0)
    assert len(got) == len(want) == 8
    for g, w in zip(got, want):
        g, w = g[0], w[0]
        assert g.token_ids == w.token_ids, (g.text, w.text)
        assert (g.text, g.finish_reason, g.dropped_tokens) == (w.text, w.finish_reason, w.dropped_tokens)
        assert g.logprobs == pytest.approx(w.logprobs, abs=2e-3)
    assert served.model_id == engine.model_id


@pytest.mark.slow
@needs_vllm
def test_k_samples_are_seeded_and_scored_like_in_process(served, engine, convs):
    rows = served.sample(convs[:4], 4, max_new_tokens=24, temperature=0.7, seed=3)
    again = served.sample(convs[:4], 4, max_new_tokens=24, temperature=0.7, seed=3)
    assert [len(r) for r in rows] == [4] * 4
    assert [[s.token_ids for s in r] for r in rows] == [[s.token_ids for s in r] for r in again]
    assert len({s.token_ids for r in rows for s in r}) > 4  # n=K gives distinct samples, not K copies
    texts = [rows[i][0].text for i in range(4)]
    for got, want in zip(served.score(convs[:4], texts), engine.score(convs[:4], texts)):
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=2e-3)


@pytest.mark.slow
@needs_vllm
def test_forced_prefix_and_counters(served, convs):
    forced = served.score(convs[:2], ["<tool_call>"] * 2, end_turn=False)
    before = served.stats.as_dict()
    rows = served.sample(convs[:2], 2, max_new_tokens=12, temperature=0.7, seed=5, prefix="<tool_call>")
    after = served.stats.as_dict()
    assert all(s.text.startswith("<tool_call>") for r in rows for s in r)
    assert all(s.token_ids[: f.num_tokens] == f.token_ids for r, f in zip(rows, forced) for s in r)
    # Samples carry the prefix's tokens too (budgets charge Sample.generated_tokens); the policy's
    # counter holds what the server generated.
    sampled = sum(s.generated_tokens - f.num_tokens for r, f in zip(rows, forced) for s in r)
    assert after["generated_tokens"] - before["generated_tokens"] == sampled > 0
    # These prompts were sent before: the server's prefix cache served part of them.
    assert after["cached_tokens"] > before["cached_tokens"]


@pytest.mark.slow
@needs_vllm
def test_chat_fallback_samples_k_turns(server, convs):
    chat = make_policy("openai", "smollm2", base_url=f"http://127.0.0.1:{server['port']}/v1", endpoint="chat")
    rows = chat.sample(convs[:2], 2, max_new_tokens=12, temperature=0.7, seed=1)
    assert [len(r) for r in rows] == [2, 2]
    assert all(s.num_tokens >= 1 and s.logprob < 0 for r in rows for s in r)
    again = chat.sample(convs[:2], 2, max_new_tokens=12, temperature=0.7, seed=1)
    assert [[s.token_ids for s in r] for r in rows] == [[s.token_ids for s in r] for r in again]
    for r, a in zip(rows, again):  # log-probs up to the float noise of other batch compositions
        assert [s.logprobs for s in r] == [pytest.approx(s.logprobs, abs=2e-3) for s in a]
    with pytest.raises(ValueError, match="cannot score"):
        chat.score(convs[:1], ["x"])
    with pytest.raises(ValueError, match="forced prefix"):
        chat.sample(convs[:1], 1, prefix="<tool_call>")


def test_unreachable_endpoint_is_one_clear_error(convs):
    dead = make_policy("openai", "tiny", base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=1, timeout_s=5)
    with pytest.raises(EndpointError, match=r"^served policy at http://127\.0\.0\.1:\d+/v1/: cannot connect after 1 retries"):
        dead.sample(convs[:2], 2, max_new_tokens=4)
    assert isinstance(EndpointError("x"), ConnectionError)  # the flows retry it as transient


def test_served_settings_are_checked_and_stay_out_of_the_run_id():
    with pytest.raises(ValueError, match="backend 'openai' needs base_url"):
        PolicyConfig(backend="openai")
    assert PolicyConfig(backend="openai", base_url="http://127.0.0.1:8000/v1").base_url == ["http://127.0.0.1:8000/v1"]
    with pytest.raises(ValueError, match="is not an http"):
        make_policy("openai", "tiny", base_url="127.0.0.1:8000")
    with pytest.raises(ValueError, match="no local tokenizer folder; set policy.tokenizer"):
        make_policy("openai", "some-org/served-name", base_url="http://127.0.0.1:8000/v1")
    a = EngineConfig.model_validate({"policy": {"backend": "openai", "base_url": ["http://a:1/v1"], "concurrency": 2}})
    b = EngineConfig.model_validate({"policy": {"backend": "openai", "base_url": ["http://b:2/v1", "http://c:3/v1"]}})
    assert a.output_settings() == b.output_settings()
    c = EngineConfig.model_validate({"policy": {"backend": "openai", "base_url": ["http://a:1/v1"], "endpoint": "chat"}})
    assert c.output_settings() != a.output_settings()


def test_route_keeps_a_task_on_one_server_and_spreads_tasks(convs):
    tasks = generate_suite("arithmetic", 40, 0, seed=1)
    picks = [route(Conversation.from_task(t), 3) for t in tasks]
    assert set(picks) == {0, 1, 2}
    conv = convs[0]
    later = conv.extend(*conv.messages[-1:])  # a deeper state of the same task
    assert route(later, 3) == route(conv, 3)
    assert route(conv, 1) == 0


def test_generate_without_base_url_is_one_line(tmp_path):
    cli = Path(sys.executable).with_name("dataengine")
    done = subprocess.run([str(cli), "generate", "--backend", "openai", "--tasks", "1", "--store", str(tmp_path / "s"), "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "needs base_url (--base-url URL)" in done.stderr


def generate_cmd(store: Path, config: Path) -> list[str]:
    cli = Path(sys.executable).with_name("dataengine")
    return [str(cli), "generate", "--config", str(config), "--suite", "arithmetic", "--tasks", "4", "--level", "1",
            "--method", "best_of_n", "--n", "2", "--shard-size", "1", "--max-new-tokens", "24", "--max-tokens", "120",
            "--max-depth", "2", "--temperature", "0.7", "--store", str(store), "--no-progress", "--run-id", "served-run"]


def write_config(path: Path, port: int) -> Path:
    path.write_text(
        f"policy:\n  backend: openai\n  base_url: http://127.0.0.1:{port}/v1\n  max_retries: 1\n  timeout_s: 300\n"
    )
    return path


def committed(store: Path, run_id: str):
    import polars as pl

    from storage import Store

    if not store.exists() or not Store(store).has_table("tasks"):
        return None
    return Store(store).read("tasks").filter(pl.col("run_id") == run_id).collect()


@pytest.mark.slow
@needs_vllm
def test_generate_through_the_server_survives_a_killed_server(server, tmp_path):
    import polars as pl

    from storage import Store

    store, config = tmp_path / "store", write_config(tmp_path / "served.yaml", server["port"])
    run = subprocess.Popen(generate_cmd(store, config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and run.poll() is None:
        rows = committed(store, "served-run")
        if rows is not None and rows.height >= 1:
            break
        time.sleep(0.5)
    assert run.poll() is None, f"generate ended before a shard was committed: {run.communicate()[1][-2000:]}"
    stop_server(server["proc"])  # mid-run: later shards are sampling or about to
    out, err = run.communicate(timeout=600)
    assert run.returncode != 0
    assert "served policy at http://127.0.0.1" in err, err[-2000:]
    done = committed(store, "served-run")
    assert 1 <= done.height < 4
    first = set(done["task_id"].to_list())
    # Nothing partial is visible: every committed task has both of its episodes.
    trajs = Store(store).trajectories().filter(pl.col("run_id") == "served-run").collect()
    assert trajs.height == 2 * done.height and set(trajs["task_id"].to_list()) == first

    server["proc"] = start_server(server["port"], server["log"])
    again = subprocess.run(generate_cmd(store, config), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout)
    assert summary["run_id"] == "served-run" and summary["shards_skipped"] == done.height
    tasks = committed(store, "served-run")
    assert tasks.height == 4 and tasks["task_id"].n_unique() == 4
    trajs = Store(store).trajectories().filter(pl.col("run_id") == "served-run").collect()
    assert trajs.height == 8 and trajs["traj_id"].n_unique() == 8
    runs = Store(store).read("runs").filter(pl.col("run_id") == "served-run").collect()
    assert json.loads(runs["config_json"][0])["engine"]["policy"]["backend"] == "openai"
