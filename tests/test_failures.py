"""Why episodes fail (dataengine.report.failures): each kind from the messages the real sandboxed
ToolEnv writes for scripted replies, so a changed error message breaks the test, and the
report's per-run table."""

from __future__ import annotations

import json

import pytest

from dataengine.report.failures import failure_kind, failure_kinds


@pytest.fixture(scope="module")
def env():
    from dataengine.env import ToolEnv
    from dataengine.tools.sandbox import Sandbox

    with Sandbox(workers=1, preload=["arithmetic", "units"]) as sandbox:
        yield ToolEnv(sandbox, max_steps=4)


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def play(env, suite: str, replies: list[str]) -> list[dict]:
    from dataengine.suites import generate_suite

    task = generate_suite(suite, 1, 0, seed=0)[0]
    state = env.reset(task)
    for reply in replies:
        state = env.step(state, reply).state
        if state.terminal:
            break
    return [m.model_dump(mode="json") for m in state.messages]


CASES = [
    ("arithmetic", ["12345"], "no call"),
    ("arithmetic", ['<tool_call>{"name": "add", "arguments": {"a": 1'], "call cut off (unclosed tag)"),
    ("arithmetic", ["", call("add", a=1, b=2), "3"], "empty reply"),
    ("arithmetic", [call("Sell", a=1), "3"], "unknown tool"),
    ("arithmetic", [call("add", a=1), "3"], "call missing a required argument"),
    ("units", [call("convert", value=1, from_unit="parsec", to_unit="km"), "3"], "argument outside the enum"),
    ("arithmetic", [call("add", a=1, b=2, c=3), "3"], "unexpected argument"),
    ("arithmetic", [call("divide", a=1, b=0), "3"], "tool raised"),
    ("arithmetic", [call("add", a=1, b=2), "-98765"], "call ran, then wrong"),
]


@pytest.mark.parametrize(("suite", "replies", "kind"), CASES, ids=[c[2] for c in CASES])
def test_each_kind_from_the_env_messages(env, suite, replies, kind):
    messages = play(env, suite, replies)
    assert failure_kind(messages) == kind
    assert failure_kind(messages, success=True) == "success"


def test_kinds_per_run_and_suite():
    import polars as pl

    no_call = json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": "7"}])
    frame = pl.DataFrame({"run_id": ["a", "a", "a", "b"], "suite": ["s"] * 4, "success": [True, False, False, None],
                          "messages_json": [no_call] * 4})
    table = failure_kinds(frame)
    assert table.select("run_id", "kind", "episodes", "share").rows() == [
        ("a", "no call", 2, pytest.approx(2 / 3)), ("a", "success", 1, pytest.approx(1 / 3)), ("b", "no call", 1, 1.0)]
