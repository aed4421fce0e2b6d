"""The user simulator (dataengine.policy.user) with the tiny random policy."""

from __future__ import annotations

import pytest

from dataengine.policy.user import GREETING, STOP, UserSimulator, read_reply, stop_token
from dataengine.types import Message, ToolCall

SCENARIO = "Reason for call: you want to cancel order #W0000001. Known info: you are Ann Lee, zip 10001."


def _agent_side() -> list[Message]:
    return [
        Message(role="system", content="You are a retail agent. Policy: ..."),
        Message(role="assistant", content=GREETING),
        Message(role="user", content="I want to cancel an order."),
        Message(role="assistant", content="", tool_calls=[ToolCall(name="get_order_details", arguments={"order_id": "#W0000001"})]),
        Message(role="tool", name="get_order_details", content='{"status": "pending"}'),
        Message(role="assistant", content="Your order is pending."),
        Message(role="assistant", content="Shall I cancel it?"),
    ]


def test_user_view_flips_roles_and_hides_tools():
    view = UserSimulator.user_view(_agent_side())
    assert [(m.role, m.content) for m in view] == [
        ("user", GREETING),
        ("assistant", "I want to cancel an order."),
        ("user", "Your order is pending.\n\nShall I cancel it?"),
    ]
    # the agent has not spoken yet: tau2's greeting opens the user's side
    assert [(m.role, m.content) for m in UserSimulator.user_view([])] == [("user", GREETING)]


def test_read_reply_stop_tokens_and_empty():
    assert read_reply("  Yes please, cancel it.  ").text == "Yes please, cancel it."
    done = read_reply(f"Thanks, that is all. {STOP}")
    assert done.text is None and done.stopped and not done.truncated and STOP in done.reason
    assert stop_token("I'll wait. ###TRANSFER###") == "###TRANSFER###"
    assert read_reply("###OUT-OF-SCOPE###").stopped
    empty = read_reply("   \n")
    assert empty.text is None and empty.truncated and "empty message" in empty.reason


def test_tiny_model_writes_the_next_user_message(tiny):
    sim = UserSimulator(tiny, SCENARIO, max_new_tokens=12, guidelines="You are a customer.")
    conv = sim.conversation(_agent_side(), SCENARIO)
    assert conv.messages[0].role == "system" and SCENARIO in conv.messages[0].content and not conv.tools
    assert "<scenario>" in tiny.render(conv)
    reply = sim.reply(_agent_side())
    assert reply.text and reply.text == reply.raw.strip() and not reply.stopped and not reply.truncated
    # seeded from the conversation: the same conversation gets the same message
    assert sim.next_message(_agent_side()) == reply.text


def test_turn_cap_truncates_without_sampling(tiny):
    sim = UserSimulator(tiny, SCENARIO, max_turns=1, max_new_tokens=4)
    calls = tiny.stats.calls
    reply = sim.reply(_agent_side())  # the conversation already holds one user message
    assert reply.text is None and reply.truncated and not reply.stopped
    assert "cap of 1 messages without ###STOP###" in reply.reason
    assert sim.next_message(_agent_side()) is None and tiny.stats.calls == calls


def test_missing_instructions_and_bad_cap_are_clear_errors(tiny):
    with pytest.raises(ValueError, match="no instructions"):
        UserSimulator(tiny).reply(_agent_side())
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        UserSimulator(tiny, SCENARIO, max_turns=0)


def test_simulator_drives_toolenv_user_turns_until_its_cap(tiny, env):
    """The simulator as ToolEnv's next_user_turn hook: each reply of the agent gets a user
    message as a new turn; at the cap the hook ends the episode."""
    from dataengine.env import ToolEnv
    from dataengine.suites.arithmetic import SUITE
    from dataengine.suites.base import generate

    task = generate(SUITE, 1, 0, seed=0)[0]
    task = task.model_copy(update={"messages": [Message(role="system", content="Help the customer."), Message(role="assistant", content=GREETING)]})
    sim = UserSimulator(tiny, SCENARIO, max_turns=2, max_new_tokens=8)
    started = sim.start(task)
    assert [m.role for m in started.messages] == ["system", "assistant", "user"] and started.messages[-1].content
    multi = ToolEnv(env.sandbox, max_steps=3, next_user_turn=sim)
    state = multi.reset(started)
    out = multi.step(state, "Sure, what is the order number?")
    assert not out.done and out.state.turn == 1
    (said,) = out.observations
    assert said.role == "user" and said.content == sim.next_message(state.messages + (Message(role="assistant", content="Sure, what is the order number?"),))
    end = multi.step(out.state, "Thanks, anything else?")
    # two user messages said: the cap ends the conversation
    assert end.done and end.state.done and not end.state.truncated and end.state.turn == 1
