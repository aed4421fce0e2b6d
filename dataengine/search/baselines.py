"""Sampling baselines with the search's budget accounting: best-of-N and greedy.

Both play whole episodes with the policy (no tree) through `dataengine.episodes.run_episodes`
(its seeds and truncation rule): every live episode of every task takes one batched policy
call per turn. Generated tokens are charged per task to the same `TokenBudget` the search
uses, so a run compares search and sampling at equal generated tokens.

best-of-N launches episodes in waves of `wave` per task until N episodes were played or the
task's token budget is spent; an episode still running when its task's budget runs out is cut
(truncated). After the first wave, a task's wave shrinks to what its remaining budget pays for
at its mean tokens per episode so far.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dataengine.budget import TokenBudget
from dataengine.env import EnvState, ToolEnv
from dataengine.episodes import EpisodeRun, Sampler, run_episodes
from dataengine.policy.base import Policy
from dataengine.types import Task, Verdict
from dataengine.verifiers.composite import CompositeReward


@dataclass
class PlayedEpisode:
    """One sampled episode: its last state, generated tokens, reward, success and verdicts."""

    task_index: int
    number: int
    state: EnvState
    tokens: int = 0
    reward: float = 0.0
    success: bool = False
    verdicts: list[Verdict] = field(default_factory=list)


def play_episodes(
    tasks: Sequence[Task],
    *,
    policy: Policy,
    env: ToolEnv,
    reward: CompositeReward,
    n: int,
    wave: int,
    max_steps: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    budget: TokenBudget,
    seed: int = 0,
    on_step: Callable[[list[PlayedEpisode]], None] | None = None,
) -> list[PlayedEpisode]:
    """Up to `n` episodes per task, `wave` at a time, each at most `max_steps` turns.

    Each wave is one `dataengine.episodes.run_episodes` call (its seeds and truncation rule):
    episode j of a task is sampled with episode number j, so it is the same episode whatever
    wave it falls in.
    on_step: called after each turn with every episode so far (finished waves scored).

    Returns the episodes in (task, number) order, each scored by `reward`.
    """
    if n < 1 or wave < 1 or max_steps < 1:
        raise ValueError(f"n, wave and max_steps must be >= 1, got {n}, {wave}, {max_steps}")
    sampler = Sampler(policy, temperature, top_p, max_new_tokens, seed)
    played: list[PlayedEpisode] = []
    launched = [0] * len(tasks)
    while True:
        ready = [t for t in range(len(tasks)) if launched[t] < n and not budget.exhausted(t)]
        if not ready:
            break
        starts, numbers, keys = [], [], []
        for t in ready:
            size = _wave_size(wave, n - launched[t], budget, t, launched[t])
            root = env.reset(tasks[t])
            starts += [root] * size
            numbers += range(launched[t], launched[t] + size)
            keys += [t] * size
            launched[t] += size

        def step_done(runs: list[EpisodeRun], keys: list[int] = keys) -> None:
            on_step(played + [_played(r, keys) for r in runs])  # type: ignore[misc]

        runs = run_episodes(env, starts, sampler, numbers=numbers, max_steps=max_steps, budget=budget,
                            budget_keys=keys, on_step=step_done if on_step is not None else None)
        for r in runs:
            e = _played(r, keys)
            result = reward.score(e.state.episode())
            e.reward, e.success, e.verdicts = result.reward, result.success, list(result.verdicts)
            played.append(e)
        if on_step is not None:
            on_step(played)
    played.sort(key=lambda e: (e.task_index, e.number))
    return played


def _played(run: EpisodeRun, keys: list[int]) -> PlayedEpisode:
    return PlayedEpisode(task_index=keys[run.index], number=run.number, state=run.state, tokens=run.tokens)


def _wave_size(wave: int, left: int, budget: TokenBudget, task: int, launched: int) -> int:
    """Episodes of the task's next wave: `wave`, at most the `left` still wanted, and after the
    first wave at most what the remaining budget pays for at the task's mean tokens per
    episode so far (so the last wave does not overshoot the budget by a whole wave)."""
    size = min(wave, left)
    if launched:
        mean = max(1.0, budget.used[task] / launched)
        size = min(size, max(1, math.ceil(budget.remaining(task) / mean)))
    return size


def best_of_n(tasks: Sequence[Task], *, n: int, wave: int, temperature: float, **kwargs) -> list[PlayedEpisode]:
    """N sampled episodes per task (waves of `wave`), within the task's token budget."""
    return play_episodes(tasks, n=n, wave=wave, temperature=temperature, **kwargs)


def greedy(tasks: Sequence[Task], **kwargs) -> list[PlayedEpisode]:
    """One greedy (temperature 0) episode per task."""
    return play_episodes(tasks, n=1, wave=1, temperature=0.0, **kwargs)
