"""Playing whole episodes with a policy: greedy (temperature 0) or n sampled episodes per task.

A thin user of `dataengine.episodes.run_episodes`: all live episodes advance together, one
batched `policy.sample` call and one `ToolEnv.step_many` round per step; sample j of a task is
episode number j (its seeds), and episodes run until a final answer or the env's step limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dataengine.env import EnvState, ToolEnv
from dataengine.episodes import Sampler, run_episodes
from dataengine.policy.base import Policy
from dataengine.types import Task

# Tokens one assistant turn may take (a tool call or an answer is far shorter).
MAX_NEW_TOKENS = 96


@dataclass
class Rollout:
    """One played episode: its final state and what it cost.

    state: the final EnvState (done, or truncated at the env's step limit).
    sample_index: which of the task's n samples it is (0 for greedy).
    generated_tokens: tokens the policy generated over the episode.
    logprob: summed behaviour log-prob of every action.
    """

    task: Task
    state: EnvState
    sample_index: int
    generated_tokens: int = 0
    logprob: float = 0.0


def rollouts(
    policy: Policy,
    env: ToolEnv,
    tasks: Sequence[Task],
    *,
    n: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = MAX_NEW_TOKENS,
    seed: int = 0,
) -> list[list[Rollout]]:
    """`[len(tasks)][n]` finished episodes. temperature 0 is greedy (then use n=1: every copy
    would be the same episode). Same seed, model and tasks: same episodes; sample j of a task
    does not depend on the other tasks evaluated with it."""
    if n < 1:
        raise ValueError(f"n must be >= 1 episodes per task, got {n}")
    if temperature == 0 and n > 1:
        raise ValueError("greedy decoding (temperature 0) gives one episode per task; use n=1 or temperature > 0")
    roots = [env.reset(t) for t in tasks]
    runs = run_episodes(
        env,
        [root for root in roots for _ in range(n)],
        Sampler(policy, temperature, top_p, max_new_tokens, seed),
        numbers=[j for _ in roots for j in range(n)],
    )
    return [
        [Rollout(task=t, state=r.state, sample_index=r.number, generated_tokens=r.tokens, logprob=r.logprob)
         for r in runs[i * n : (i + 1) * n]]
        for i, t in enumerate(tasks)
    ]


def run_summary(rollout: Rollout) -> dict[str, Any]:
    """Counts of one episode: steps, tool calls, malformed steps, generated tokens."""
    steps = rollout.state.steps
    return {
        "num_steps": len(steps),
        "num_tool_calls": sum(len(s.action.tool_calls) for s in steps),
        "malformed_steps": sum(s.action.parse_error is not None for s in steps),
        "num_generated_tokens": rollout.generated_tokens,
    }
