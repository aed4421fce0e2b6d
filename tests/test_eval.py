"""Evaluation: estimators against hand-computed values; evaluate() on known-outcome policies."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from dataengine.env import ToolEnv
from dataengine.episodes import episode_seed
from dataengine.evaluation import (
    EvalConfig,
    bootstrap_interval,
    evaluate,
    pass_at_k,
    pass_at_k_task,
    wilson_interval,
    write_report,
)
from dataengine.policy.base import Policy, PolicyStats, Sample, conv_seeds
from dataengine.suites import generate_suite, gold_turns
from dataengine.tools.sandbox import Sandbox
from storage import Store


def test_wilson_known_values():
    low, high = wilson_interval(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_pass_at_k_matches_the_combinatorial_form():
    for n, c, k in [(10, 3, 1), (10, 3, 5), (5, 0, 2), (5, 5, 5), (20, 1, 10)]:
        expected = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k_task(n, c, k) == pytest.approx(expected)
    assert pass_at_k([4, 4], [0, 2], 1) == pytest.approx([0.0, 0.5])
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k_task(2, 1, 3)


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = [0, 1, 1, 0, 1, 1, 1, 0]
    a, b = bootstrap_interval(values, seed=3), bootstrap_interval(values, seed=3)
    assert a == b and a[0] < sum(values) / len(values) < a[1]


def odd_sample_seeds(tasks, seed=0, samples=8, steps=8):
    """Every `episode_seed` of the odd-numbered sampled episodes of `tasks` (their start state
    is the task's first conversation)."""
    from dataengine.env import EnvState

    starts = [EnvState(task=t, messages=tuple(t.messages), tool_state=None).prefix_hash for t in tasks]
    return {episode_seed(seed, h, j, s) for h in starts for j in range(1, samples, 2) for s in range(steps)}


class GoldOrWrong(Policy):
    """Plays each task's gold turns, except on the tasks in `wrong`, where it answers "0" at
    once; sampled episodes (temperature > 0) solve a task on every second sample index (the odd
    episode numbers of `dataengine.episodes` fail, recognised by their seeds)."""

    def __init__(self, tasks, wrong, flaky_samples=True):
        self.flaky_samples = flaky_samples
        self.odd = odd_sample_seeds(tasks)
        self.turns = {t.messages[-1].content: gold_turns(t) for t in tasks}
        self.wrong = {t.messages[-1].content for t in wrong}
        self.model_id = "gold-or-wrong"
        self.stats = PolicyStats()
        self.calls = 0

    def sample(self, convs, k, *, max_new_tokens=128, temperature=1.0, top_p=1.0, seed=0, prefix=""):
        out = []
        self.calls += 1
        seeds = conv_seeds(seed, len(convs))
        for conv, row_seed in zip(convs, seeds):
            question = next(m.content for m in conv.messages if m.role == "user")
            step = sum(m.role == "assistant" for m in conv.messages)
            if temperature == 0 or not self.flaky_samples:
                bad = question in self.wrong
            else:
                bad = row_seed in self.odd
            text = prefix + ("0" if bad else self.turns[question][step])
            out.append([Sample(text, (1, 2), (-0.5, -0.5), -1.0, 2, "stop")] * k)
        return out

    def score(self, convs, continuations, *, end_turn=True):
        raise NotImplementedError


@pytest.fixture(scope="module")
def env():
    with Sandbox(workers=1, preload=["arithmetic"]) as sandbox:
        yield ToolEnv(sandbox, max_steps=6)


def test_evaluate_counts_known_outcomes(env, tmp_path):
    tasks = generate_suite("arithmetic", n_train=0, n_heldout=6, seed=0)
    policy = GoldOrWrong(tasks, wrong=tasks[::2])
    report = evaluate(policy, env, tasks, EvalConfig(k=2, samples=4, seed=0))
    greedy = report.metric("greedy_success")
    assert (greedy.value, greedy.n) == (0.5, 6)
    assert greedy.ci_low < 0.5 < greedy.ci_high
    assert greedy.details["per_task"] == {t.id: i % 2 == 1 for i, t in enumerate(tasks)}
    # Sample indices 1 and 3 of 4 fail (their episode seeds), so c = 2 of n = 4 on every task.
    assert report.metric("pass@2").value == pytest.approx(1 - math.comb(2, 2) / math.comb(4, 2))
    assert report.metric("sample_success").value == pytest.approx(0.5)
    # A wrong immediate answer gets "when" wrong (a tool was needed); gold gets every axis right.
    assert report.metric("axis/when").value == pytest.approx(0.5)
    assert report.metric("axis/final").value == pytest.approx(0.5)
    assert greedy.details["tokens_per_solved"] > 0
    # Per difficulty level: the greedy outcomes of that level's tasks.
    for level in {t.metadata["level"] for t in tasks}:
        flags = [i % 2 == 1 for i, t in enumerate(tasks) if t.metadata["level"] == level]
        metric = report.metric(f"level/{level}")
        assert (metric.value, metric.n) == (pytest.approx(sum(flags) / len(flags)), len(flags))
    assert sum(report.metric(f"level/{lv}").n for lv in {t.metadata["level"] for t in tasks}) == 6

    store = Store(tmp_path / "store")
    version = write_report(store, report, run_id="eval-1", config={"k": 2})
    evals = store.evals(version).collect()
    assert set(evals["metric"]) >= {"greedy_success", "pass@2", "sample_success", "axis/how"}
    row = evals.filter(pl.col("metric") == "greedy_success").row(0, named=True)
    assert (row["value"], row["n"], row["model_id"]) == (0.5, 6, "gold-or-wrong")
    trajs = store.trajectories().collect()
    assert trajs.height == 6 + 24
    assert trajs.filter(pl.col("source") == "eval-greedy")["success"].sum() == 3
    assert json.loads(trajs["messages_json"][0])[0]["role"] == "user"


def test_evaluate_with_search_results(env):
    tasks = generate_suite("arithmetic", n_train=0, n_heldout=4, seed=1)
    policy = GoldOrWrong(tasks, wrong=tasks[:1])
    from dataengine.evaluation.rollout import rollouts

    def search(ts):
        played = rollouts(policy, env, ts, n=1, temperature=0.0)
        return [(r[0], True) for r in played]

    report = evaluate(policy, env, tasks, EvalConfig(greedy=False), search=search)
    assert report.metric("search_success").value == 0.75
    assert report.metric("search_found").value == 1.0


def test_eval_config_errors():
    with pytest.raises(ValueError, match="samples"):
        EvalConfig(k=4, samples=2).validate()
    with pytest.raises(ValueError, match="temperature"):
        EvalConfig(k=2, temperature=0).validate()


@pytest.mark.slow
def test_evaluate_tiny_model_runs(env):
    from dataengine.policy import make_policy

    tasks = generate_suite("arithmetic", n_train=0, n_heldout=2, seed=0)
    policy = make_policy("hf", "tiny")
    config = EvalConfig(k=2, max_new_tokens=8, seed=0)
    first = evaluate(policy, env, tasks, config)
    again = evaluate(policy, env, tasks, config)
    assert [m.value for m in first.metrics] == [m.value for m in again.metrics]
    texts = [o.rollout.state.messages[-1].content for o in first.outcomes]
    assert texts == [o.rollout.state.messages[-1].content for o in again.outcomes]


def test_search_at_inference_with_gold_policy(env):
    """With a policy that plays gold, the search's chosen path solves every task."""
    from dataengine.config import EngineConfig
    from dataengine.evaluation.search import search_at_inference

    tasks = generate_suite("arithmetic", n_train=0, n_heldout=2, seed=2)
    policy = GoldOrWrong(tasks, wrong=[], flaky_samples=False)
    config = EngineConfig(search={"num_simulations": 4, "num_actions": 2, "value": "zero", "trees_per_batch": 2})
    report = evaluate(policy, env, tasks, EvalConfig(greedy=False), search=search_at_inference(policy, env, config))
    assert report.metric("search_success").value == 1.0
    assert report.metric("search_found").value == 1.0


def test_deployable_search_never_sees_the_gold(env):
    """The deployable search grows its tree against tasks without gold (GoldFreeReward never
    reports a success) and only its returned episode is judged with the real gold."""
    from dataengine.config import EngineConfig
    from dataengine.evaluation.search import GoldFreeReward, search_at_inference, without_gold
    from dataengine.verifiers import CompositeReward

    tasks = generate_suite("arithmetic", n_train=0, n_heldout=2, seed=2)
    policy = GoldOrWrong(tasks, wrong=[], flaky_samples=False)
    config = EngineConfig(search={"num_simulations": 4, "num_actions": 2, "value": "zero", "trees_per_batch": 2})
    seen = []

    class Spy(CompositeReward):
        def score(self, episode):
            seen.append(episode.task.gold)
            return super().score(episode)

    guide = GoldFreeReward(Spy(replay=env.replay))
    assert without_gold(tasks[0]).gold.answer is None and without_gold(tasks[0]).gold.calls == []
    finder = search_at_inference(policy, env, config, reward=guide.inner, selection="deployable")
    report = evaluate(policy, env, tasks, EvalConfig(greedy=False), reward=CompositeReward(replay=env.replay),
                      deployable_search=finder)
    # Gold play is still found without the gold guiding the search; the search's own scoring
    # saw only gold-free tasks.
    assert report.metric("search_deployable_success").value == 1.0
    assert seen and all(g.answer is None and not g.calls for g in seen)
    with pytest.raises(ValueError, match="selection"):
        search_at_inference(policy, env, config, selection="peek")
