"""Scripted gold episodes: run each task's reference solution through the sandboxed ToolEnv.

This is the smoke test of the foundation (suites -> sandbox -> ToolEnv -> verifiers) that the
demo starts with: every gold episode must succeed, and the same episode with its last tool
call dropped must not (the verifiers see the difference).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dataengine.env import EnvState, ToolEnv
from dataengine.episodes import Script, run_episodes
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
