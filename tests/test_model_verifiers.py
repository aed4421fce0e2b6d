"""LLM judge and reward-model verifiers with the tiny model (TRL RewardTrainer for real)."""

from __future__ import annotations

import pytest

from dataengine.parsing import parse_action
from dataengine.policy import make_policy
from dataengine.suites.arithmetic import SUITE
from dataengine.suites.base import generate
from dataengine.types import Episode, Message, Step, Verdict
from dataengine.verifiers.composite import Cascade
from dataengine.verifiers.model_based import LLMJudge, RewardModelVerifier, episode_messages, train_reward_model


@pytest.fixture(scope="module")
def task():
    return generate(SUITE, 1, 0, seed=0)[0]


@pytest.fixture(scope="module")
def policy():
    return make_policy("hf", "tiny")


def episode(task, answer: str) -> Episode:
    return Episode(task=task, steps=[Step(action=parse_action(answer))], done=True)


def test_judge_reads_yes_no_probabilities(task, policy):
    # A random model spreads its mass over the vocabulary: accept any answer mass.
    judge = LLMJudge(policy, min_answer_mass=0.0)
    verdicts = judge.verify_many([episode(task, task.gold.answer or "1"), episode(task, "no idea")])
    for v in verdicts:
        assert isinstance(v, Verdict) and v.name == "llm_judge"
        assert 0.0 <= v.score <= 1.0 and v.passed == (v.score >= 0.5)
        assert v.confidence == pytest.approx(abs(2 * v.score - 1))
        assert v.details["p_yes"] > 0 and v.details["p_no"] > 0
    # The two transcripts differ, so the judge's probabilities differ.
    assert verdicts[0].details["p_yes"] != verdicts[1].details["p_yes"]
    assert "Reference answer" in judge.prompt(episode(task, "x")).messages[1].content
    abstain = LLMJudge(judge.policy, min_answer_mass=2.0).verify(episode(task, "x"))
    assert abstain.passed is None and abstain.confidence == 0.0


class _Unsure:
    name, version = "answer", "1"

    def verify(self, ep):
        return Verdict(name="answer", version="1", score=0.5, passed=True, confidence=0.1)


def test_judge_is_a_cascade_tier(task, policy):
    judge = LLMJudge(policy, min_answer_mass=0.0)
    v = Cascade([_Unsure(), judge], min_confidence=0.8).verify(episode(task, "42"))
    assert v.details["tiers"][-1]["name"] == "llm_judge" and v.details["decided_by"] == "llm_judge"


def test_reward_model_trains_and_verifies(task, tmp_path):
    prompt = [m.to_chat() for m in task.messages]
    good = [{"role": "assistant", "content": f"The answer is {task.gold.answer}."}]
    bad = [{"role": "assistant", "content": "banana banana banana"}]
    pairs = [{"prompt": prompt, "chosen": good, "rejected": bad}] * 16
    out = train_reward_model(pairs, tmp_path / "rm", base="tiny", epochs=3, learning_rate=5e-3, batch_size=8, max_length=512)
    rm = RewardModelVerifier(out)
    ep_good = Episode(task=task, steps=[Step(action=parse_action(good[0]["content"]))], done=True)
    ep_bad = Episode(task=task, steps=[Step(action=parse_action(bad[0]["content"]))], done=True)
    v_good, v_bad = rm.verify_many([ep_good, ep_bad])
    assert v_good.details["reward"] > v_bad.details["reward"]
    assert v_good.score > v_bad.score and 0 <= v_bad.score <= 1
    assert v_good.version == rm.version and len(rm.version) == 16
    assert episode_messages(ep_good)[-1] == Message(role="assistant", content=good[0]["content"])
    with pytest.raises(ValueError, match="lack column"):
        train_reward_model([{"prompt": prompt, "chosen": good}], tmp_path / "x", base="tiny")
    with pytest.raises(FileNotFoundError, match="train_reward_model"):
        RewardModelVerifier(tmp_path / "missing")
