"""ToolEnv: functional steps, branches that never share state, batched execution."""

from __future__ import annotations

import pytest

from dataengine.env import EnvState, ToolEnv
from dataengine.parsing import render_tool_calls
from dataengine.tools.registry import Toolbox, register_toolbox, tool_from_callable
from dataengine.tools.sandbox import Sandbox
from dataengine.types import Message, Task, ToolCall

# A stateful toolbox defined here; workers import this module through Sandbox(modules=...).


def deposit(state: dict, account: str, amount: int) -> int:
    """Deposit money into an account and return the new balance.

    Args:
        state: The bank (injected).
        account: The account name.
        amount: How much to deposit.
    """
    if amount <= 0:
        raise ValueError("amount must be positive")
    balances = state.setdefault("balances", {})
    balances[account] = balances.get(account, 0) + amount
    return balances[account]


def balance(state: dict, account: str) -> int:
    """Read an account's balance.

    Args:
        state: The bank (injected).
        account: The account name.
    """
    return state.get("balances", {}).get(account, 0)


register_toolbox(
    Toolbox(
        name="env-test-bank",
        tools={t.name: t for t in map(tool_from_callable, [deposit, balance])},
        make_initial_state=lambda task: {"balances": {"alice": 10}},
    )
)


def call(name: str, **arguments) -> str:
    return render_tool_calls([ToolCall(name=name, arguments=arguments)])


@pytest.fixture(scope="module")
def env():
    with Sandbox(workers=2, timeout_s=5.0, modules=[__name__]) as sb:
        yield ToolEnv(sb, max_steps=4)


@pytest.fixture()
def task():
    return Task(id="bank-1", suite="bank", messages=[Message(role="user", content="Give bob 5.")], toolbox="env-test-bank")


def strip_seconds(state: EnvState):
    return [(s.action, s.observations, [r.model_dump(exclude={"seconds"}) for r in s.results]) for s in state.steps]


def test_reset_copies_the_initial_state(env, task):
    s0 = env.reset(task)
    assert s0.messages == tuple(task.messages) and s0.tool_state == {"balances": {"alice": 10}}
    assert s0.num_steps == 0 and not s0.done and not s0.truncated
    s0.tool_state["balances"]["alice"] = 99
    assert env.reset(task).tool_state == {"balances": {"alice": 10}}


def test_tool_call_step(env, task):
    s0 = env.reset(task)
    out = env.step(s0, "Depositing.\n" + call("deposit", account="bob", amount=5))
    assert not out.done and out.info == {"parse_error": None, "statuses": ["ok"], "truncated": False}
    assert out.state.tool_state == {"balances": {"alice": 10, "bob": 5}}
    assert [m.role for m in out.state.messages] == ["user", "assistant", "tool"]
    assert out.observations == [Message(role="tool", name="deposit", content="5")]
    assert s0.tool_state == {"balances": {"alice": 10}} and s0.num_steps == 0  # the old state is untouched
    assert out.state.state_hash != s0.state_hash and out.state.prefix_hash != s0.prefix_hash


def test_calls_of_one_action_run_in_order_on_the_previous_state(env, task):
    text = call("deposit", account="bob", amount=5) + "\n" + call("balance", account="bob")
    out = env.step(env.reset(task), text)
    assert [m.content for m in out.observations] == ["5", "5"]


def test_tool_error_becomes_an_error_observation(env, task):
    s0 = env.reset(task)
    out = env.step(s0, call("deposit", account="bob", amount=-1))
    assert out.info["statuses"] == ["exception"]
    assert out.observations[0].content.startswith("Error: exception: ValueError: amount must be positive")
    assert out.state.tool_state == s0.tool_state and not out.done
    out = env.step(s0, call("withdraw", account="bob", amount=1))
    assert out.observations[0].content.startswith("Error: unknown_tool: unknown tool 'withdraw'")


def test_parse_error_is_an_observation_and_the_episode_goes_on(env, task):
    out = env.step(env.reset(task), '<tool_call>{"name": "deposit"')
    assert not out.done and "unclosed" in out.info["parse_error"]
    (obs,) = out.observations
    assert obs.role == "tool" and obs.name == "parser" and obs.content.startswith("Error: unclosed")
    assert "expected <tool_call>" in obs.content
    assert out.state.steps[0].action.parse_error


def test_final_answer_ends_the_episode(env, task):
    out = env.step(env.reset(task), "Final answer: done")
    assert out.done and out.state.done and not out.state.truncated and out.observations == []
    with pytest.raises(ValueError, match="terminal"):
        env.step(out.state, "again")
    ep = out.state.episode()
    assert ep.done and ep.final_answer == "done" and ep.final_state == {"balances": {"alice": 10}}


def test_max_steps_truncates(env, task):
    state = env.reset(task)
    for i in range(4):
        out = env.step(state, call("balance", account="alice"))
        state = out.state
    assert out.done and state.truncated and not state.done and out.info["truncated"]
    assert state.num_steps == 4 and state.episode().truncated


def test_same_state_and_action_give_the_same_outcome(env, task):
    s0 = env.reset(task)
    text = call("deposit", account="bob", amount=3)
    a, b = env.step(s0, text), env.step(s0, text)
    assert a.state.messages == b.state.messages and a.state.tool_state == b.state.tool_state
    assert strip_seconds(a.state) == strip_seconds(b.state)
    assert a.state.state_hash == b.state.state_hash and a.state.prefix_hash == b.state.prefix_hash


def test_branches_never_see_each_other(env, task):
    s0 = env.reset(task)
    left = env.step(s0, call("deposit", account="bob", amount=1)).state
    right = env.step(s0, call("deposit", account="carol", amount=2)).state
    left2 = env.step(left, call("deposit", account="bob", amount=1)).state
    assert right.tool_state == {"balances": {"alice": 10, "carol": 2}}
    assert left2.tool_state == {"balances": {"alice": 10, "bob": 2}}
    assert left.tool_state == {"balances": {"alice": 10, "bob": 1}}
    assert s0.tool_state == {"balances": {"alice": 10}}


def test_step_many_matches_step(env, task):
    s0 = env.reset(task)
    s1 = env.step(s0, call("deposit", account="bob", amount=1)).state
    actions = [
        call("deposit", account="bob", amount=2) + call("balance", account="bob"),
        "Final answer: 1",
        "<tool_call>oops</tool_call>",
        call("balance", account="alice"),
    ]
    states = [s0, s1, s0, s1]
    many = env.step_many(states, actions)
    single = [env.step(s, a) for s, a in zip(states, actions)]
    for m, s in zip(many, single):
        assert m.state.messages == s.state.messages and m.state.tool_state == s.state.tool_state
        assert m.done == s.done and m.info == s.info
    assert many[0].state.tool_state == {"balances": {"alice": 10, "bob": 2}}
    assert many[0].info["statuses"] == ["ok", "ok"]


def test_step_many_checks_its_input(env, task):
    with pytest.raises(ValueError, match="2 states but 1 actions"):
        env.step_many([env.reset(task)] * 2, ["x"])
    with pytest.raises(TypeError, match="Action or model text"):
        env.step(env.reset(task), 42)  # type: ignore[arg-type]


def test_replay_gives_the_end_state(env, task):
    calls = [ToolCall(name="deposit", arguments={"account": "bob", "amount": 4}),
             ToolCall(name="deposit", arguments={"account": "bob", "amount": -1}),
             ToolCall(name="deposit", arguments={"account": "alice", "amount": 1})]
    assert env.replay(task, calls) == {"balances": {"alice": 11, "bob": 4}}


def test_stateless_tool_keeps_the_same_state_object(env):
    task = Task(id="t", suite="testing", messages=[Message(role="user", content="1+2")], toolbox="testing",
                initial_state=None)
    s0 = env.reset(task)
    assert s0.tool_state == {"items": []}  # the testing toolbox builds one
    out = env.step(s0, call("add", a=1, b=2))
    assert out.observations[0].content == "3" and out.state.tool_state is s0.tool_state
