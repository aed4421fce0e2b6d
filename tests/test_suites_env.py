"""Gold episodes of every suite run through the real ToolEnv and Sandbox reach the gold answer
and the gold end state."""

from __future__ import annotations

import pytest

from dataengine.env import ToolEnv
from dataengine.suites import generate_suite, gold_turns
from dataengine.tools.sandbox import Sandbox
from dataengine.types import stable_hash

NAMES = ["arithmetic", "units", "shop", "chains", "notool"]


@pytest.fixture(scope="module")
def env():
    with Sandbox(workers=2, preload=NAMES) as sandbox:
        yield ToolEnv(sandbox, max_steps=8)


def _run_gold(env, task):
    state = env.reset(task)
    for text in gold_turns(task):
        outcome = env.step(state, text)
        assert outcome.info["parse_error"] is None, outcome.info
        assert all(s == "ok" for s in outcome.info["statuses"]), outcome.observations
        state = outcome.state
    return state


@pytest.mark.parametrize("name", NAMES)
def test_gold_turns_solve_tasks_in_the_env(env, name):
    for task in generate_suite(name, n_train=3, n_heldout=1, seed=11):
        state = _run_gold(env, task)
        episode = state.episode()
        assert state.done and not state.truncated
        assert episode.calls == task.gold.calls
        assert episode.final_answer == gold_turns(task)[-1]
        if task.gold.end_state_hash is not None:
            assert stable_hash(episode.final_state) == task.gold.end_state_hash
        else:
            assert episode.final_state is None


def test_tool_outputs_seen_by_the_agent_feed_the_next_gold_call(env):
    """The observation after gold call i holds the value gold call i+1 uses (chains compose)."""
    for task in generate_suite("chains", n_train=3, n_heldout=0, seed=2):
        state = env.reset(task)
        for text, nxt in zip(gold_turns(task), task.gold.calls[1:]):
            outcome = env.step(state, text)
            (arg,) = nxt.arguments.values()
            assert outcome.observations[0].content == f'"{arg}"' or outcome.observations[0].content == str(arg)
            state = outcome.state


def test_shop_tool_error_reaches_the_agent_as_an_observation(env):
    task = next(t for t in generate_suite("shop", 40, 0, seed=0)
                if any(o["status"] == "delivered" for o in t.initial_state["orders"].values()))
    oid = next(k for k, o in task.initial_state["orders"].items() if o["status"] == "delivered")
    state = env.reset(task)
    outcome = env.step(state, f'<tool_call>{{"name": "cancel_order", "arguments": {{"order_id": "{oid}"}}}}</tool_call>')
    assert outcome.info["statuses"] == ["exception"]
    assert "cannot be cancelled: its status is delivered" in outcome.observations[0].content
    assert outcome.state.tool_state == task.initial_state
