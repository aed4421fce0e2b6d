"""MCP servers as toolboxes: real SDK servers (tests/mcp_servers) started as stdio processes and
on 127.0.0.1 over streamable HTTP; listing, calls, branch isolation (replay and snapshots),
servers that crash, hang or answer garbage, and generate runs over an MCP toolbox."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_configs import tiny_engine_config

from dataengine.config import MCPServerConfig, SandboxConfig
from dataengine.env import ToolEnv
from dataengine.tools.mcp import MCPServerError, register_servers
from dataengine.tools.registry import get_toolbox
from dataengine.tools.sandbox import Sandbox
from dataengine.types import Action, Message, Task, ToolCall

ROOT = Path(__file__).resolve().parents[1]


def stdio(name: str, module: str, *args: str, **fields) -> MCPServerConfig:
    return MCPServerConfig(name=name, command=[sys.executable, "-m", f"tests.mcp_servers.{module}", *args],
                           cwd=str(ROOT), **fields)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_server():
    """Start a server module on a free 127.0.0.1 port: yields a function (module, *args) -> URL."""
    procs = []

    def start(module: str, *args: str) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", f"tests.mcp_servers.{module}", "--http", str(port), *args],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{module} exited with {proc.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return f"http://127.0.0.1:{port}/mcp"
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{module} did not listen on {port}")

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def env():
    """A ToolEnv whose sandbox is never used by the MCP toolboxes (their calls run here)."""
    register_servers([
        stdio("calc", "calculator", "--misbehave", stateful=False),
        stdio("mcp_bank", "bank"),
    ], SandboxConfig(timeout_s=3.0, max_output_bytes=4096))
    with Sandbox(workers=1) as sandbox:
        yield ToolEnv(sandbox, max_steps=6)


def task(toolbox: str, question: str = "go") -> Task:
    return Task(id=f"{toolbox}-t", suite="mcp", messages=[Message(role="user", content=question)], toolbox=toolbox)


def call(name: str, **arguments) -> Action:
    return Action(text=f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>",
                  tool_calls=[ToolCall(name=name, arguments=arguments)])


def test_tools_and_schemas_are_listed_from_the_server(env):
    box = get_toolbox("calc")
    assert {"add", "multiply", "divide"} <= set(box.tools)
    add = box.tools["add"].spec
    assert add.description == "Add two numbers."
    assert add.parameters["properties"] == {"a": {"title": "A", "type": "number"}, "b": {"title": "B", "type": "number"}}
    assert add.parameters["required"] == ["a", "b"]
    # A task that lists no tools is offered the server's tools as listed.
    state = env.reset(task("calc"))
    assert [t.name for t in state.task.tools] == [s.name for s in box.specs()]
    assert state.tool_state is None


def test_stateless_calls_and_argument_errors(env):
    state = env.reset(task("calc"))
    out = env.step(state, call("multiply", a=6, b=7))
    assert out.info["statuses"] == ["ok"] and json.loads(out.observations[0].content) == {"result": 42.0}
    out = env.step(state, call("add", a="six", b=1))
    assert out.info["statuses"] == ["bad_arguments"] and "'a'" in out.observations[0].content
    out = env.step(state, call("subtract", a=1, b=1))
    assert out.info["statuses"] == ["unknown_tool"] and "known tools: add" in out.observations[0].content
    out = env.step(state, call("divide", a=1, b=0))  # the tool raised: the server's error result
    assert out.info["statuses"] == ["exception"] and out.observations[0].content.startswith("Error: exception:")


def test_two_branches_of_a_stateful_server_see_only_their_own_effects(env):
    client = get_toolbox("mcp_bank").client
    root = env.reset(task("mcp_bank"))
    assert root.tool_state == {"calls": []}
    s1 = env.step(root, call("deposit", account="a", amount=5)).state
    replayed = client.stats["replayed_calls"]
    left, right = env.step_many([s1, s1], [call("deposit", account="a", amount=7), call("withdraw", account="a", amount=2)])
    # One branch continues the session left at s1; the other replays s1's deposit on a fresh one.
    assert client.stats["replayed_calls"] - replayed == 1
    assert left.state.state_hash != right.state.state_hash
    checks = env.step_many([left.state, right.state, s1, root], [call("balance", account="a")] * 4)
    assert [json.loads(c.observations[0].content)["result"] for c in checks] == [12, 3, 5, 0]
    # A withdrawal the server refuses still happened there: it joins the branch's log.
    refused = env.step(root, call("withdraw", account="a", amount=1))
    assert refused.info["statuses"] == ["exception"] and "insufficient funds" in refused.observations[0].content


def test_a_branch_extended_in_a_line_never_replays(env):
    client = get_toolbox("mcp_bank").client
    state = env.reset(task("mcp_bank"))
    state = env.step(state, call("deposit", account="b", amount=1)).state
    before = dict(client.stats)
    for _ in range(4):
        state = env.step(state, call("deposit", account="b", amount=1)).state
    assert client.stats["replayed_calls"] == before["replayed_calls"]
    assert client.stats["reused"] - before["reused"] == 4
    assert json.loads(env.step(state, call("balance", account="b")).observations[0].content) == {"result": 5}


@pytest.mark.parametrize("tool, status, words", [
    ("crash", "crash", "the server exited or dropped the connection"),
    ("hang", "timeout", "gave no answer to 'hang' within 3 s"),
    ("garbage", "crash", "not an MCP message"),
    ("malformed", "crash", "not a tool result"),
])
def test_a_failing_server_is_an_error_on_that_call_and_the_next_call_works(env, tool, status, words):
    state = env.reset(task("calc"))
    out = env.step(state, call(tool))
    assert out.info["statuses"] == [status]
    assert out.observations[0].content.startswith(f"Error: {status}: MCP server 'calc'") and words in out.observations[0].content
    assert not out.done  # the episode goes on
    again = env.step(out.state, call("add", a=1, b=2))
    assert again.info["statuses"] == ["ok"]


def test_a_replay_that_fails_names_the_call_and_the_next_branch_works():
    """A log the server cannot replay (here: a call that kills it) fails that call only."""
    register_servers([stdio("calc_replay", "calculator", "--misbehave")], SandboxConfig(timeout_s=3.0))
    client = get_toolbox("calc_replay").client
    add = ToolCall(name="add", arguments={"a": 1, "b": 2})
    (result, state), = client.call_many([(add, {"calls": [{"name": "add", "arguments": {"a": 1, "b": 1}},
                                                          {"name": "crash", "arguments": {}}]})])
    assert result.status == "crash" and "replaying this branch's 2 earlier calls" in result.error
    assert "failed at call 2" in result.error and state["calls"][-1]["name"] == "crash"  # state unchanged
    (result, state), = client.call_many([(add, client.initial_state)])
    assert result.ok and state == {"calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}


def test_the_sandbox_output_limit_applies(env):
    out = env.step(env.reset(task("calc")), call("huge", n=10_000))
    assert out.info["statuses"] == ["output_too_large"] and "over the limit of 4096" in out.observations[0].content


def test_streamable_http_server(http_server):
    register_servers([MCPServerConfig(name="calc_http", url=http_server("calculator"), stateful=False)])
    client = get_toolbox("calc_http").client
    (result, state), = client.call_many([(ToolCall(name="add", arguments={"a": 2, "b": 3}), None)])
    assert result.ok and result.output == {"result": 5.0} and state is None


def test_snapshot_tools_isolate_branches_on_one_shared_server(http_server):
    """One HTTP server shared by every branch: restore, call, snapshot keep them apart."""
    register_servers([MCPServerConfig(name="bank_http", url=http_server("bank", "--snapshots"),
                                      snapshot_tool="snapshot", restore_tool="restore")])
    box = get_toolbox("bank_http")
    assert "snapshot" not in box.tools and "restore" not in box.tools  # not offered to the model
    client = box.client
    root = box.initial_state(None)
    assert root == {"snapshot": "{}"}
    (r, s1), = client.call_many([(ToolCall(name="deposit", arguments={"account": "a", "amount": 5}), root)])
    (_, left), (_, right) = client.call_many([
        (ToolCall(name="deposit", arguments={"account": "a", "amount": 7}), s1),
        (ToolCall(name="withdraw", arguments={"account": "a", "amount": 2}), s1),
    ])
    balances = client.call_many([(ToolCall(name="balance", arguments={"account": "a"}), s) for s in (left, right, s1, root)])
    assert [r.output["result"] for r, _ in balances] == [12, 3, 5, 0]
    assert client.stats["replayed_calls"] == 0 and client.stats["sessions"] == 1


def test_a_server_that_cannot_start_is_a_clear_error():
    bad = MCPServerConfig(name="broken", command=[sys.executable, "-c", "import sys; print('no such server', file=sys.stderr)"],
                          startup_timeout_s=20)
    with pytest.raises(MCPServerError, match="MCP server 'broken' could not be started.*no such server"):
        register_servers([bad])
    with pytest.raises(ValueError, match="give both snapshot_tool and restore_tool"):
        MCPServerConfig(name="x", command=["x"], snapshot_tool="snapshot")


def mcp_task_file(path: Path, toolbox: str, questions: list[tuple[str, str]]) -> Path:
    rows = [Task(id=f"{toolbox}-{i}", suite="mcp", toolbox=toolbox, messages=[Message(role="user", content=q)],
                 gold={"answer": a}) for i, (q, a) in enumerate(questions)]
    path.write_text("".join(t.model_dump_json() + "\n" for t in rows))
    return path


def test_generate_with_the_tiny_model_over_an_mcp_toolbox(tmp_path, tiny):
    from dataengine.stages.generate import generate
    from storage import Store

    tasks = mcp_task_file(tmp_path / "tasks.jsonl", "bank_gen", [("Deposit 5 into a; what is a's balance?", "5"),
                                                                 ("Deposit 2 into b twice; what is b's balance?", "4")])
    servers = [stdio("bank_gen", "bank").model_dump()]
    cfg = tiny_engine_config(tmp_path / "store", task_file=str(tasks), tools__mcp=servers, sandbox__workers=1)
    summary = generate(cfg, run_id="mcp-tiny", policy=tiny, progress=False)
    assert summary.trees == 2
    store = Store(tmp_path / "store")
    assert store.committed_shards("tasks", "mcp-tiny") == {"tasks-000000-000001"}
    stored = store.tasks().collect()
    assert sorted(stored["task_id"]) == ["bank_gen-0", "bank_gen-1"]


@pytest.mark.slow
def test_generate_with_smollm2_over_an_mcp_toolbox(tmp_path):
    from dataengine.parsing import parse_action
    from dataengine.stages.generate import generate
    from storage import Store

    tasks = mcp_task_file(tmp_path / "tasks.jsonl", "bank_smol", [("Deposit 25 into account alice with the deposit "
                                                                   "tool, then tell me her balance.", "25")])
    servers = [stdio("bank_smol", "bank").model_dump()]
    cfg = tiny_engine_config(tmp_path / "store", task_file=str(tasks), tools__mcp=servers, sandbox__workers=1,
                             policy__model="smollm2", policy__max_new_tokens=64, search__num_simulations=2)
    summary = generate(cfg, run_id="mcp-smol", progress=False)
    assert summary.trees == 1
    nodes = Store(tmp_path / "store").nodes().collect()
    assert set(nodes["tree_id"]) == {"bank_smol-0"}
    # Every call the model made went to the server and came back as a tool message.
    made = [c for text in nodes["action_text"].drop_nulls() for c in parse_action(text).tool_calls]
    results = [m for raw in nodes["messages_json"] for m in json.loads(raw) if m["role"] == "tool"]
    assert get_toolbox("bank_smol").client.stats["calls"] >= (1 if made else 0)
    assert not any(m["content"].startswith(("Error: crash", "Error: timeout")) for m in results)
