"""Value estimators with the tiny model: rollouts, the AI critic, the value head, the Q mix."""

from __future__ import annotations

import pytest

from dataengine.env import ToolEnv
from dataengine.policy import Conversation, make_policy
from dataengine.suites.arithmetic import SUITE
from dataengine.suites.base import generate
from dataengine.tools.sandbox import Sandbox
from dataengine.types import Message
from dataengine.values import AICritic, RolloutValue, ValueModel, mix_q, q_targets_from_nodes, rank_scores


@pytest.fixture(scope="module")
def policy():
    return make_policy("hf", "tiny")


@pytest.fixture(scope="module")
def tasks():
    return generate(SUITE, 3, 0, seed=0)


def test_mix_q():
    assert mix_q(1.0, 0.0, 0.25) == 0.25
    assert mix_q(0.2, 0.6, 1.0) == 0.2
    with pytest.raises(ValueError, match="mix weight"):
        mix_q(0.0, 0.0, 1.5)


def test_rank_scores():
    assert rank_scores([0.1, 0.7, 0.2]) == [0.0, 1.0, 0.5]
    assert rank_scores([0.5, 0.5]) == [0.5, 0.5]
    assert rank_scores([0.3]) == [1.0]


def test_rollouts_batched_with_budget(policy, tasks):
    calls = {"n": 0}

    def reward(episode):
        calls["n"] += 1
        # A reward that depends on the rollout: steps taken, so it is not constant.
        return 1.0 / (1 + len(episode.steps))

    with Sandbox(workers=1) as sandbox:
        env = ToolEnv(sandbox, max_steps=8)
        states = [env.reset(t) for t in tasks]
        before = policy.stats.calls
        est = RolloutValue(policy, env, reward, rollouts=3, max_steps=2, max_new_tokens=8, seed=1).estimate(states)
        # The tiny model writes no tool call, so every rollout ends after one step (a final
        # answer): one policy call for all 9 rollouts, reward 1/2 each.
        assert policy.stats.calls - before == 1
        assert [e.n for e in est] == [3, 3, 3]
        for e in est:
            assert e.details["rewards"] == [0.5, 0.5, 0.5] and e.details["unfinished"] == 0
            assert e.value == 0.5
        assert calls["n"] == 9
        terminal = env.step(states[0], "42").state
        assert RolloutValue(policy, env, reward).estimate([terminal])[0].details == {"terminal": True}


def test_critic_scores_candidates(policy, tasks):
    # A random model spreads its mass over the whole vocabulary: accept any label mass.
    critic = AICritic(policy, min_label_mass=0.0)
    state = Conversation.from_task(tasks[0])
    cands = ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "The answer is 3.", "I do not know."]
    out = critic.rank([state, state], [cands, cands[:2]])
    assert len(out[0].scores) == 3 and len(out[1].scores) == 2
    for r in out:
        assert not r.fallback
        assert sorted(r.scores)[0] == 0.0 and sorted(r.scores)[-1] == 1.0
        assert sum(r.probs) == pytest.approx(1.0)
    # Debiased: scoring the reversed list gives the same ranking of the same candidates.
    rev = critic.rank([state], [list(reversed(cands))])[0]
    assert rev.probs == pytest.approx(list(reversed(out[0].probs)), abs=1e-6)
    text = critic.prompt(state, cands).messages[1].content
    assert "A) <tool_call>" in text and "C) I do not know." in text


def test_critic_falls_back_when_labels_get_no_mass(policy, tasks):
    critic = AICritic(policy, min_label_mass=1.1)  # unreachable: forces the fallback
    out = critic.rank([Conversation.from_task(tasks[0])], [["x", "y"]])[0]
    assert out.fallback and out.scores == [0.5, 0.5]
    with pytest.raises(ValueError, match="one candidate list per state"):
        critic.rank([Conversation.from_task(tasks[0])], [])


def test_value_model_fits_q_targets(policy, tmp_path):
    import json

    rows = []
    for i in range(12):
        good = i % 2 == 0
        msgs = [{"role": "user", "content": f"What is {i} plus {i + 1}?"}, {"role": "assistant", "content": "ok" if good else "nonsense " * 5}]
        rows.append({"messages_json": json.dumps(msgs), "q": 1.0 if good else 0.0})
    rows.append({"messages_json": None, "q": 0.3})
    states, targets = q_targets_from_nodes(rows)
    assert len(states) == 12
    vm = ValueModel(policy.model, policy.tokenizer, l2=1e-3)
    fit = vm.fit(states, targets)
    assert fit["mse"] < 0.05
    preds = vm.predict(states)
    assert all(0.0 <= p <= 1.0 for p in preds)
    assert sum((p > 0.5) == (t > 0.5) for p, t in zip(preds, targets)) >= 11
    vm.save(tmp_path / "head.pt")
    loaded = ValueModel(policy.model, policy.tokenizer).load(tmp_path / "head.pt")
    assert loaded.predict(states[:2]) == pytest.approx(preds[:2])
    with pytest.raises(RuntimeError, match="not fitted"):
        ValueModel(policy.model, policy.tokenizer).predict(states)
    assert Message(role="user", content="x")  # the contract type round-trips through the rows
