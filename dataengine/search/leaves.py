"""Leaf values: what a finished episode is worth to the search (`search_return`), value
estimates of open states (`LeafValue`), their mix with the critic score of the edge into the
node (`leaf_values`, with transpositions reusing an equal node's estimate) and the capped
process reward of a step (`process_reward`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from dataengine.budget import TokenBudget
from dataengine.config import SearchConfig
from dataengine.env import EnvState, ToolEnv
from dataengine.policy.base import Conversation, Policy
from dataengine.search.counters import ExpandCounters
from dataengine.search.nodes import NodeTable, SearchNode
from dataengine.types import Episode
from dataengine.values import RolloutValue, mix_q, reference_progress
from dataengine.verifiers.composite import CompositeReward
from dataengine.verifiers.efficiency import efficiency_score

# Rollouts use another seed than expansions of the same state, so rollout i is not candidate i.
ROLLOUT_SEED_OFFSET = 1_000_003


def search_return(reward: CompositeReward, result: Any, objective: str, episode: Episode | None = None) -> float:
    """What a finished episode (`result`: its RewardResult or terminal node) is worth to the
    search: its composite reward; under objective "success" the success weight if it succeeded
    and 0 if not; under "efficient_success" that success weight times the episode's
    `efficiency_score` (1 / (1 + steps beyond the reference + repeated calls)), so a success
    with one repeated call is worth 1/3 of a clean one and still more than any failure."""
    if objective == "composite":
        return result.reward
    if not result.success:
        return 0.0
    if objective == "efficient_success":
        if episode is None:
            raise ValueError("objective 'efficient_success' needs the episode to count its steps")
        return reward.weights.success * efficiency_score(episode)
    return reward.weights.success


class LeafValue:
    """Value estimates of non-terminal states: `estimate(states) -> [len(states)]` floats.

    kind: "zero", "rollout" (mean composite reward of `rollouts` policy rollouts of at most
    `rollout_steps` turns; their mean success under objective "success") or "value_model"
    (`value_model.predict`) or "reference" (oracle-assisted: `reference_progress` along the
    task's reference calls, in units of the success weight). "critic" estimates 0 here: the
    critic score of the edge is mixed in by the adapter (with weight 1 - a, or fully when the
    value kind is "critic").
    """

    def __init__(
        self,
        kind: str,
        *,
        policy: Policy,
        env: ToolEnv,
        reward: CompositeReward,
        max_new_tokens: int,
        temperature: float,
        rollouts: int = 2,
        rollout_steps: int = 4,
        value_model: Any = None,
        seed: int = 0,
        objective: str = "composite",
    ) -> None:
        if kind not in ("zero", "rollout", "critic", "value_model", "reference"):
            raise ValueError(f"unknown value estimate {kind!r}; choose zero, rollout, critic, value_model or reference")
        if kind == "value_model" and value_model is None:
            raise ValueError("value estimate 'value_model' needs a fitted ValueModel (value_model=...)")
        self.kind = kind
        self.value_model = value_model
        self.success = reward.weights.success
        self.rollout = None
        if kind == "rollout":
            self.rollout = RolloutValue(
                policy,
                env,
                lambda episode: search_return(reward, reward.score(episode), objective, episode),
                rollouts=rollouts,
                max_steps=rollout_steps,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed + ROLLOUT_SEED_OFFSET,
            )

    def estimate(self, states: Sequence[EnvState]) -> list[float]:
        if not states:
            return []
        if self.kind in ("zero", "critic"):
            return [0.0] * len(states)
        if self.kind == "rollout":
            return [e.value for e in self.rollout.estimate(states)]  # type: ignore[union-attr]
        if self.kind == "reference":
            return [
                self.success * reference_progress(s.task, [c for step in s.steps for c in step.action.tool_calls])
                for s in states
            ]
        convs = [Conversation(s.messages, s.task.tools) for s in states]
        return [float(v) for v in self.value_model.predict(convs)]


def leaf_values(
    table: NodeTable,
    handles: list[int],
    estimator: LeafValue,
    *,
    policy: Policy,
    budget: TokenBudget,
    counters: ExpandCounters,
    search: SearchConfig,
) -> list[float]:
    """Value of each non-terminal node: the estimator's, mixed with the critic score of the
    edge into it (Agent Q: a * V + (1 - a) * critic; the value kind "critic" uses the
    critic score alone). Returns `[len(handles)]` floats; rollout tokens are charged to the
    trees' budgets and counted."""
    if not handles:
        return []
    nodes = [table[h] for h in handles]
    # A transposition reuses the estimate of its first equal node (estimated earlier, or
    # in this very call: that node comes first in `nodes`).
    fresh = [n for n in nodes if n.transposition_of is None or table[n.transposition_of].terminal]
    start = time.perf_counter()
    before = policy.stats.generated_tokens
    raw = estimator.estimate([n.state for n in fresh])
    spent = policy.stats.generated_tokens - before
    counters.value_seconds += time.perf_counter() - start
    if spent:
        # A batched rollout call serves several trees: split its tokens by their leaves.
        budget.charge_split([n.tree for n in fresh], spent)
        counters.generated_tokens += spent
    for node, v in zip(fresh, raw):
        node.raw_value = v
    for node in nodes:
        if node.raw_value is None:
            node.raw_value = table[node.transposition_of].raw_value  # type: ignore[index]
            counters.values_reused += 1
    out = []
    for node in nodes:
        v = node.raw_value
        critic = node.edge.critic_score if node.edge is not None else None
        if critic is None:
            out.append(v)
        elif search.value == "critic":
            out.append(critic)
        else:
            out.append(mix_q(v, critic, search.critic_mix))
    return out


def process_reward(node: SearchNode, reward: CompositeReward, search: SearchConfig) -> tuple[float, list]:
    """Capped process reward of the step into `node`: step_reward clipped to
    [-cap, cap] and divided by max_depth, so a whole path adds at most `cap`."""
    cap = search.process_reward_cap
    r, verdicts = reward.step_reward(node.state.task, node.state.steps[-1])
    return max(-cap, min(cap, r)) / search.max_depth, verdicts
