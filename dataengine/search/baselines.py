"""Sampling baselines with the search's budget accounting: best-of-N and greedy.

Both play whole episodes with the policy (no tree): every live episode of every task takes one
batched policy call per turn. Generated tokens are charged per task to the same `TokenBudget`
the search uses, so a run compares search and sampling at equal generated tokens.

best-of-N launches episodes in waves of `wave` per task (all of a wave start from the task's
prompt in one K-sample call) until N episodes were played or the task's token budget is
spent; an episode still running when its task's budget runs out is cut (truncated). After the
first wave, a task's wave shrinks to what its remaining budget pays for at its mean tokens per
episode so far.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dataengine.env import EnvState, ToolEnv
from dataengine.policy.base import Conversation, Policy
from dataengine.search.budget import TokenBudget
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


def _conv(state: EnvState) -> Conversation:
    return Conversation(state.messages, state.task.tools)


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

    on_step: called after each turn with every episode so far (finished ones scored).

    Returns the episodes in (task, number) order, each scored by `reward`.
    """
    if n < 1 or wave < 1 or max_steps < 1:
        raise ValueError(f"n, wave and max_steps must be >= 1, got {n}, {wave}, {max_steps}")
    played: list[PlayedEpisode] = []
    launched = [0] * len(tasks)
    wave_index = 0
    while True:
        ready = [t for t in range(len(tasks)) if launched[t] < n and not budget.exhausted(t)]
        if not ready:
            break
        sizes = {t: _wave_size(wave, n - launched[t], budget, t, launched[t]) for t in ready}
        current: list[PlayedEpisode] = []
        texts: list[str] = []
        # One K-sample call per distinct wave size (at most `wave` calls, usually one).
        for size in sorted(set(sizes.values()), reverse=True):
            group = [t for t in ready if sizes[t] == size]
            roots = [env.reset(tasks[t]) for t in group]
            first = policy.sample(
                [_conv(r) for r in roots],
                size,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed + 7919 * wave_index,
            )
            for t, root, row in zip(group, roots, first):
                for s in row:
                    current.append(PlayedEpisode(task_index=t, number=launched[t], state=root, tokens=s.num_tokens))
                    texts.append(s.text)
                    launched[t] += 1
                budget.charge(t, sum(s.num_tokens for s in row))
        _step(env, current, texts)
        for depth in range(1, max_steps):
            live = [e for e in current if not e.state.terminal and not budget.exhausted(e.task_index)]
            if not live:
                break
            texts_by_episode = _sample_turn(policy, live, max_new_tokens, temperature, top_p, seed + 7919 * wave_index + 104729 * depth, budget)
            _step(env, live, [texts_by_episode[id(e)] for e in live])
            if on_step is not None:
                on_step(played + current)
        for e in current:
            if not e.state.terminal:
                # Cut by the step limit or the token budget: an unfinished, truncated episode.
                e.state = dataclasses.replace(e.state, truncated=True)
            result = reward.score(e.state.episode())
            e.reward, e.success, e.verdicts = result.reward, result.success, list(result.verdicts)
        played.extend(current)
        if on_step is not None:
            on_step(played)
        wave_index += 1
    played.sort(key=lambda e: (e.task_index, e.number))
    return played


def _wave_size(wave: int, left: int, budget: TokenBudget, task: int, launched: int) -> int:
    """Episodes of the task's next wave: `wave`, at most the `left` still wanted, and after the
    first wave at most what the remaining budget pays for at the task's mean tokens per
    episode so far (so the last wave does not overshoot the budget by a whole wave)."""
    size = min(wave, left)
    if launched:
        mean = max(1.0, budget.used[task] / launched)
        size = min(size, max(1, math.ceil(budget.remaining(task) / mean)))
    return size


def _step(env: ToolEnv, episodes: list[PlayedEpisode], texts: list[str]) -> None:
    outcomes = env.step_many([e.state for e in episodes], texts)
    for e, out in zip(episodes, outcomes):
        e.state = out.state


def _sample_turn(
    policy: Policy,
    live: list[PlayedEpisode],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
    budget: TokenBudget,
) -> dict[int, str]:
    """One turn for each live episode. Episodes in the same state (same conversation) must get
    independent samples, but the policy seeds each row by (seed, prompt, sample index): the
    r-th episode of each distinct conversation is sampled in call r with its own seed."""
    seen: dict[str, int] = {}
    ranks: list[int] = []
    for e in live:
        key = e.state.prefix_hash
        ranks.append(seen.get(key, 0))
        seen[key] = ranks[-1] + 1
    out: dict[int, str] = {}
    for r in range(max(ranks) + 1):
        group = [e for e, rank in zip(live, ranks) if rank == r]
        samples = policy.sample(
            [_conv(e.state) for e in group], 1, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed + r
        )
        for e, row in zip(group, samples):
            out[id(e)] = row[0].text
            e.tokens += row[0].num_tokens
            budget.charge(e.task_index, row[0].num_tokens)
    return out


def best_of_n(tasks: Sequence[Task], *, n: int, wave: int, temperature: float, **kwargs) -> list[PlayedEpisode]:
    """N sampled episodes per task (waves of `wave`), within the task's token budget."""
    return play_episodes(tasks, n=n, wave=wave, temperature=temperature, **kwargs)


def greedy(tasks: Sequence[Task], **kwargs) -> list[PlayedEpisode]:
    """One greedy (temperature 0) episode per task."""
    return play_episodes(tasks, n=1, wave=1, temperature=0.0, **kwargs)
