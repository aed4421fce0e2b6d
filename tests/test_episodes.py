"""The one episode runner: scripted and sampled turns, seeds, the truncation rule (answer, env
limit, max steps, token budget, script end), error observations of malformed output, and
determinism with the tiny model."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dataengine.budget import TokenBudget
from dataengine.env import ToolEnv
from dataengine.episodes import Sampler, Script, episode_seed, run_episodes
from dataengine.policy import Conversation, Policy, PolicyStats, Sample, make_policy
from dataengine.policy.base import conv_seeds
from dataengine.suites import generate_suite, gold_turns
from dataengine.tools.sandbox import Sandbox
from dataengine.verifiers.composite import CompositeReward

BROKEN_CALL = '<tool_call>{"name": "add", "arguments": {"a": 1'


class FixedTextPolicy(Policy):
    """Answers every conversation with `text` costing `tokens` tokens; keeps the seeds it got."""

    def __init__(self, text: str, tokens: int = 5):
        self.text, self.tokens = text, tokens
        self.model_id = "fixed@0"
        self.stats = PolicyStats()
        self.seeds: list[list[int]] = []

    def sample(self, convs: Sequence[Conversation], k: int, *, max_new_tokens=128, temperature=1.0, top_p=1.0, seed=0):
        self.stats.calls += 1
        self.seeds.append(conv_seeds(seed, len(convs)))
        self.stats.generated_tokens += len(convs) * k * self.tokens
        ids, lps = tuple(range(self.tokens)), (-0.5,) * self.tokens
        return [[Sample(self.text, ids, lps, sum(lps), self.tokens, "stop")] * k for _ in convs]

    def score(self, convs, continuations, *, end_turn=True):
        raise NotImplementedError("only samples")


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1, preload=["arithmetic"]) as box:
        yield box


@pytest.fixture(scope="module")
def env(sandbox):
    return ToolEnv(sandbox, max_steps=8)


@pytest.fixture(scope="module")
def tasks():
    return generate_suite("arithmetic", n_train=3, n_heldout=0, seed=0)


@pytest.fixture(scope="module")
def tiny():
    return make_policy("hf", "tiny")


def test_episode_seed_is_one_documented_function():
    a = episode_seed(0, "abc", 1, 2)
    assert a == episode_seed(0, "abc", 1, 2) and 0 <= a < 2**31 - 1
    others = {episode_seed(1, "abc", 1, 2), episode_seed(0, "abd", 1, 2), episode_seed(0, "abc", 0, 2), episode_seed(0, "abc", 1, 3)}
    assert a not in others and len(others) == 4


def test_scripted_gold_answers_and_script_end_truncates(env, tasks):
    gold = [gold_turns(t) for t in tasks]
    runs = run_episodes(env, [env.reset(t) for t in tasks], Script(gold))
    reward = CompositeReward(replay=env.replay)
    for r, turns in zip(runs, gold):
        assert r.end == "answer" and r.state.done and not r.state.truncated
        assert r.turns == len(turns) and r.samples == [] and r.tokens == 0
        assert reward.score(r.state.episode()).success
    # Texts that stop before the answer: the episode is returned truncated, not done.
    short = run_episodes(env, [env.reset(tasks[0])], Script([gold[0][:2]]))[0]
    assert short.end == "script" and short.turns == 2 and short.state.truncated and not short.state.done
    with pytest.raises(ValueError, match="Script has 1 turn lists for 2 start states"):
        run_episodes(env, [env.reset(tasks[0])] * 2, Script([gold[0]]))


def test_malformed_turns_are_error_observations_and_the_episode_goes_on(env, tasks):
    run = run_episodes(env, [env.reset(tasks[1])], Script([[BROKEN_CALL, "not json <tool_call>", gold_turns(tasks[1])[0], "1337492"]]))[0]
    assert run.end == "answer" and run.turns == 4
    for step in run.state.steps[:2]:
        assert step.action.parse_error is not None
        assert step.observations[0].role == "tool" and step.observations[0].name == "parser"
        assert step.observations[0].content.startswith("Error:")
    assert run.state.steps[2].results[0].ok


def test_max_steps_and_env_limit(env, sandbox, tasks):
    policy = FixedTextPolicy(BROKEN_CALL)
    runs = run_episodes(env, [env.reset(t) for t in tasks], Sampler(policy), max_steps=3)
    assert [r.end for r in runs] == ["max_steps"] * 3
    assert all(r.turns == 3 and r.state.truncated and r.tokens == 15 for r in runs)
    assert policy.stats.calls == 3  # one call per step for all live episodes
    # The env's own limit (counted from the task's first turn) ends it first when lower.
    short_env = ToolEnv(sandbox, max_steps=2)
    run = run_episodes(short_env, [short_env.reset(tasks[0])], Sampler(policy), max_steps=5)[0]
    assert run.end == "env_limit" and run.turns == 2 and run.state.truncated
    with pytest.raises(ValueError, match="max_steps"):
        run_episodes(env, [env.reset(tasks[0])], Sampler(policy), max_steps=0)


def test_token_budget_stops_episodes_per_key(env, tasks):
    policy = FixedTextPolicy(BROKEN_CALL, tokens=5)
    budget = TokenBudget.for_tasks(2, 12)
    starts = [env.reset(tasks[0])] * 2 + [env.reset(tasks[1])]
    runs = run_episodes(env, starts, Sampler(policy), numbers=[0, 1, 0], max_steps=6, budget=budget, budget_keys=[0, 0, 1])
    # Key 0 (two episodes): 10 tokens after turn 1 (< 12), 20 after turn 2: exhausted. Key 1
    # (one episode): 5, 10, 15: exhausted after turn 3. The turn that crosses the limit is
    # played, so a key overshoots by less than one turn of each of its live episodes.
    assert [(r.end, r.turns) for r in runs] == [("budget", 2), ("budget", 2), ("budget", 3)]
    assert budget.used == [20, 15] and budget.used[0] - budget.limit < 2 * 5 and budget.used[1] - budget.limit < 5
    assert all(r.state.truncated for r in runs)
    with pytest.raises(ValueError, match="budget_keys"):
        run_episodes(env, starts, Sampler(policy), budget=budget)


def test_each_row_gets_its_episode_seed(env, tasks):
    policy = FixedTextPolicy(BROKEN_CALL)
    starts = [env.reset(tasks[0])] * 2 + [env.reset(tasks[1])]
    run_episodes(env, starts, Sampler(policy, seed=7), numbers=[0, 3, 0], max_steps=2)
    h0, h1 = starts[0].prefix_hash, starts[2].prefix_hash
    assert policy.seeds == [[episode_seed(7, h, j, s) for h, j in [(h0, 0), (h0, 3), (h1, 0)]] for s in range(2)]


def test_tiny_model_episodes_are_deterministic_and_independent_of_the_batch(env, tasks, tiny):
    sampler = Sampler(tiny, temperature=1.0, max_new_tokens=6, seed=3)
    root = env.reset(tasks[0])
    starts = [root, root, env.reset(tasks[1])]
    first = run_episodes(env, starts, sampler, numbers=[0, 1, 0], max_steps=2)
    again = run_episodes(env, starts, sampler, numbers=[0, 1, 0], max_steps=2)
    key = lambda runs: [(r.end, [s.token_ids for s in r.samples], r.state.messages) for r in runs]
    assert key(first) == key(again)
    for r in first:
        assert 1 <= r.turns <= 2 and r.tokens == sum(s.num_tokens for s in r.samples) <= 6 * r.turns
        assert r.logprob == pytest.approx(sum(sum(s.logprobs) for s in r.samples)) and r.logprob < 0
        assert r.state.steps[0].action.text == r.samples[0].text  # a cut turn is played as written
    # Two episode numbers from one start state are different samples.
    assert first[0].samples[0].token_ids != first[1].samples[0].token_ids
    # Episode 1 of the root alone is the same episode as inside the batch.
    alone = run_episodes(env, [root], sampler, numbers=[1], max_steps=2)
    assert key(alone) == key(first[1:2])
    other = run_episodes(env, [root], Sampler(tiny, temperature=1.0, max_new_tokens=6, seed=4), numbers=[1], max_steps=2)
    assert other[0].samples[0].token_ids != first[1].samples[0].token_ids
