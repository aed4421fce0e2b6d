"""Playing whole episodes with a policy: greedy (temperature 0) or n sampled episodes per task.

All live episodes advance together, one batched `policy.sample` call per step (per sample index,
see `rollouts`), and their tool calls run through one `ToolEnv.step_many` round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dataengine.env import EnvState, ToolEnv
from dataengine.policy.base import Conversation, Policy
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


def _seed(seed: int, sample_index: int, step: int) -> int:
    # Distinct streams per sample index and step: the hf backend seeds each row by its prompt,
    # so two copies of one prompt sampled with one seed would be the same episode.
    return (seed * 1_000_003 + sample_index * 10_007 + step) % (2**31 - 1)


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
    would be the same episode). Same seed, model and tasks: same episodes."""
    if n < 1:
        raise ValueError(f"n must be >= 1 episodes per task, got {n}")
    if temperature == 0 and n > 1:
        raise ValueError("greedy decoding (temperature 0) gives one episode per task; use n=1 or temperature > 0")
    runs = [[Rollout(task=t, state=env.reset(t), sample_index=j) for j in range(n)] for t in tasks]
    step = 0
    while True:
        live = [r for per_task in runs for r in per_task if not r.state.terminal]
        if not live:
            return runs
        for j in range(n):
            batch = [r for r in live if r.sample_index == j]
            if not batch:
                continue
            convs = [Conversation(r.state.messages, r.task.tools) for r in batch]
            samples = policy.sample(convs, 1, max_new_tokens=max_new_tokens, temperature=temperature,
                                    top_p=top_p, seed=_seed(seed, j, step))
            outcomes = env.step_many([r.state for r in batch], [s[0].text for s in samples])
            for r, s, out in zip(batch, samples, outcomes):
                r.state = out.state
                r.generated_tokens += s[0].num_tokens
                r.logprob += s[0].logprob
        step += 1


def run_summary(rollout: Rollout) -> dict[str, Any]:
    """Counts of one episode: steps, tool calls, malformed steps, generated tokens."""
    steps = rollout.state.steps
    return {
        "num_steps": len(steps),
        "num_tool_calls": sum(len(s.action.tool_calls) for s in steps),
        "malformed_steps": sum(s.action.parse_error is not None for s in steps),
        "num_generated_tokens": rollout.generated_tokens,
    }
