"""Scripted gold episodes: run each task's reference solution through the sandboxed ToolEnv.

This is the smoke test of the foundation (suites -> sandbox -> ToolEnv -> verifiers) that the
demo starts with: every gold episode must succeed, and the same episode with its last tool
call dropped must not (the verifiers see the difference).

`gold_step_probabilities` scores the same episodes under a policy: the probability of each gold
turn given the gold turns before it, per difficulty level and step. It says where a policy's
path to a solution breaks, so where search (which samples from that policy) runs out of data.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from dataengine.env import EnvState, ToolEnv
from dataengine.episodes import Script, run_episodes
from dataengine.policy.base import Conversation, Policy
from dataengine.suites import generate_suite
from dataengine.suites.gold import gold_turns
from dataengine.types import Task
from dataengine.verifiers.composite import CompositeReward

GIVE_UP = "I could not finish this task."


@dataclass
class GoldSummary:
    """One suite's gold run: counts, success of gold and of corrupted episodes, time."""

    suite: str
    tasks: int
    tool_calls: int
    tool_errors: int
    gold_success: int
    corrupted: int
    corrupted_success: int
    seconds: float


def run_turns(env: ToolEnv, tasks: list[Task], turns: list[list[str]]) -> list[EnvState]:
    """Play the given assistant texts for every task, all tasks stepped together per turn
    (`dataengine.episodes.run_episodes` with a Script). An episode whose texts run out before a
    final answer is returned truncated."""
    return [r.state for r in run_episodes(env, [env.reset(t) for t in tasks], Script(turns))]


def run_gold(env: ToolEnv, suite: str, n: int, seed: int = 0, reward: CompositeReward | None = None) -> GoldSummary:
    """Run `n` held-out tasks of `suite` with their gold turns, then corrupted (last call dropped, no answer)."""
    reward = reward or CompositeReward(replay=env.replay)
    tasks = generate_suite(suite, n_train=0, n_heldout=n, seed=seed)
    start = time.perf_counter()
    gold = [gold_turns(t) for t in tasks]
    finals = run_turns(env, tasks, gold)
    scores = [reward.score(s.episode()) for s in finals]
    # Corrupt: drop the last tool call and give no answer; the episode must now fail.
    needs = [i for i, t in enumerate(tasks) if t.gold.calls]
    bad_turns = [gold[i][:-2] + [GIVE_UP] for i in needs]
    bad = run_turns(env, [tasks[i] for i in needs], bad_turns)
    bad_scores = [reward.score(s.episode()) for s in bad]
    results = [r for s in finals for step in s.steps for r in step.results]
    return GoldSummary(
        suite=suite,
        tasks=len(tasks),
        tool_calls=len(results),
        tool_errors=sum(not r.ok for r in results),
        gold_success=sum(r.success for r in scores),
        corrupted=len(needs),
        corrupted_success=sum(r.success for r in bad_scores),
        seconds=time.perf_counter() - start,
    )


def gold_step_probabilities(policy: Policy, env: ToolEnv, tasks: list[Task]) -> dict[str, Any]:
    """The policy's probability of every gold turn given the gold episode before it (the
    policy's own prompt; calls written name first, as the template shows them), summarised per
    (level, step) and per level for the whole path.

    steps: {"<level>/<step>": {n, mean_p, median_logprob}}; paths: {"<level>": {n, mean_p,
    reachable}} where reachable counts tasks whose whole gold path has probability >= 0.01
    (about 1 in 100 sampled episodes would follow it). A path far below that is rarely sampled
    whole; search reaches it only where its widening resamples the weak step (docs/experiments.md, "Learning
    rounds": 3 of 39 level-2 trees reached a second call of p ~ 1e-3).
    """
    if not tasks:
        raise ValueError("gold_step_probabilities needs at least one task")
    turns = [gold_turns(t, sort_keys=False) for t in tasks]
    finals = run_turns(env, tasks, turns)
    convs, texts, keys = [], [], []
    for task, state, texts_of_task in zip(tasks, finals, turns):
        messages = list(state.messages)
        at = [i for i, m in enumerate(messages) if m.role == "assistant"]
        if len(at) != len(texts_of_task):
            raise ValueError(f"task {task.id}: the gold episode played {len(at)} of {len(texts_of_task)} turns")
        for step, (i, text) in enumerate(zip(at, texts_of_task)):
            convs.append(Conversation(messages[:i], task.tools))
            texts.append(text)
            keys.append((task.metadata.get("level"), step, task.id))
    scored = policy.score(convs, texts)
    steps: dict[str, list[float]] = defaultdict(list)
    paths: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (level, step, task_id), sample in zip(keys, scored):
        steps[f"{level}/{step}"].append(sample.logprob)
        paths[str(level)][task_id] += sample.logprob

    def mean_p(logprobs: list[float]) -> float:
        return sum(math.exp(x) for x in logprobs) / len(logprobs)

    return {
        "tasks": len(tasks),
        "steps": {k: {"n": len(v), "mean_p": mean_p(v), "median_logprob": sorted(v)[len(v) // 2]}
                  for k, v in sorted(steps.items())},
        "paths": {k: {"n": len(v), "mean_p": mean_p(list(v.values())),
                      "reachable": sum(math.exp(x) >= 0.01 for x in v.values())}
                  for k, v in sorted(paths.items())},
    }
