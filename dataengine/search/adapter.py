"""The LLM adapter: the expand function (mcts.ExpandFn) over policy + ToolEnv + verifiers.

Each call expands every selected leaf of every tree at once:

1. the chosen edge of each parent is executed: one `ToolEnv.step_many` for all of them;
2. children that end the episode (final answer, step limit, max depth, or the tree's token
   budget spent) get the composite verifier reward;
3. every other child gets K candidate actions from ONE batched `policy.sample` call; duplicates
   (same `Action.key()`) are merged and their prior mass summed (`nodes.merge_samples`);
4. optional: Agent Q's critic ranks each new node's candidates (one batched `policy.score`);
   the leaf values come from the configured estimator (zero, rollouts, critic, value model),
   mixed with the critic score of the edge into the leaf: a * V + (1 - a) * critic;
5. optional capped process reward from the step verifiers on the transition.

Shapes: B trees, L leaves per tree and iteration, K candidate actions per node.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import mcts
from dataengine.config import PolicyConfig, SearchConfig
from dataengine.env import EnvState, ToolEnv
from dataengine.policy.base import Conversation, Policy
from dataengine.search.budget import TokenBudget
from dataengine.search.nodes import (
    NodeTable,
    PriorKind,
    SearchNode,
    merge_samples,
    prior_logits,
)
from dataengine.types import Task
from dataengine.values import AICritic, RolloutValue, mix_q
from dataengine.verifiers.composite import CompositeReward

# Rollouts use another seed than expansions of the same state, so rollout i is not candidate i.
ROLLOUT_SEED_OFFSET = 1_000_003


@dataclass
class ExpandCounters:
    """Running totals of one search batch (the progress bar and the summary read them).

    calls: expand calls (iterations); nodes: nodes created (roots included); terminal: terminal
    nodes; successes: terminal nodes whose episode succeeded; generated_tokens: tokens sampled
    for expansions and rollouts; env_seconds / verify_seconds / value_seconds: wall time in
    env steps, verifiers and value estimation (model time inside value estimation included).
    """

    calls: int = 0
    nodes: int = 0
    terminal: int = 0
    successes: int = 0
    generated_tokens: int = 0
    env_seconds: float = 0.0
    verify_seconds: float = 0.0
    value_seconds: float = 0.0


class LeafValue:
    """Value estimates of non-terminal states: `estimate(states) -> [len(states)]` floats.

    kind: "zero", "rollout" (mean composite reward of `rollouts` policy rollouts of at most
    `rollout_steps` turns) or "value_model" (`value_model.predict`). "critic" estimates 0 here:
    the critic score of the edge is mixed in by the adapter (with weight 1 - a, or fully when
    the value kind is "critic").
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
    ) -> None:
        if kind not in ("zero", "rollout", "critic", "value_model"):
            raise ValueError(f"unknown value estimate {kind!r}; choose zero, rollout, critic or value_model")
        if kind == "value_model" and value_model is None:
            raise ValueError("value estimate 'value_model' needs a fitted ValueModel (value_model=...)")
        self.kind = kind
        self.value_model = value_model
        self.rollout = None
        if kind == "rollout":
            self.rollout = RolloutValue(
                policy,
                env,
                lambda episode: reward.score(episode).reward,
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
        convs = [Conversation(s.messages, s.task.tools) for s in states]
        return [float(v) for v in self.value_model.predict(convs)]


class LLMExpander:
    """The expand function of an LLM tree search over B tasks; holds the node table.

    policy: samples K candidates per state (its `stats` count model time and tokens).
    env: the sandboxed ToolEnv. reward: the composite verifier reward of episodes.
    search: budgets and options (num_actions K, max_depth, value, critic_mix,
        process_reward_cap, max_generated_tokens per task).
    sampling: max_new_tokens, temperature and top_p of the candidate actions.
    prior: "logprob" (summed exp of the length-normalised log-prob of merged samples) or
        "frequency" (sample counts).
    seed: sampling seed (same seed and inputs, same samples and so the same trees).
    """

    def __init__(
        self,
        policy: Policy,
        env: ToolEnv,
        reward: CompositeReward,
        search: SearchConfig,
        sampling: PolicyConfig,
        *,
        prior: PriorKind = "logprob",
        rollouts: int = 2,
        value_model: Any = None,
        seed: int = 0,
        on_expand: Callable[[LLMExpander], None] | None = None,
    ) -> None:
        self.policy, self.env, self.reward = policy, env, reward
        self.search, self.sampling = search, sampling
        self.k = search.num_actions
        self.prior: PriorKind = prior
        self.seed = seed
        self.table = NodeTable()
        self.counters = ExpandCounters()
        self.budget = TokenBudget.for_tasks(0, search.max_generated_tokens)
        self.tasks: list[Task] = []
        self.on_expand = on_expand
        self.use_critic = search.value == "critic" or search.critic_mix < 1.0
        self.critic = AICritic(policy) if self.use_critic else None
        self.values = LeafValue(
            search.value,
            policy=policy,
            env=env,
            reward=reward,
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            rollouts=rollouts,
            value_model=value_model,
            seed=seed,
        )

    # ------------------------------------------------------------------ roots

    def roots(self, tasks: Sequence[Task]) -> mcts.RootInput:
        """Reset the env for each task, sample the roots' K candidates, estimate root values.

        Returns the RootInput of B = len(tasks) trees: prior_logits `[B, K]`, value `[B]`,
        handle `[B]`.
        """
        if not tasks:
            raise ValueError("a search batch needs at least one task")
        self.tasks = list(tasks)
        self.budget = TokenBudget.for_tasks(len(tasks), self.search.max_generated_tokens)
        handles = []
        for b, task in enumerate(tasks):
            handles.append(self.table.add(SearchNode(tree=b, state=self.env.reset(task))))
        self.counters.nodes += len(handles)
        self._sample_edges(handles)
        values = self._leaf_values(handles)
        logits = torch.tensor([prior_logits(self.table[h].edges, self.k) for h in handles], dtype=torch.float32)
        for h, v in zip(handles, values):
            self.table[h].value_estimate = v
        return mcts.RootInput(
            prior_logits=logits,
            value=torch.tensor(values, dtype=torch.float32),
            handle=torch.tensor(handles, dtype=torch.int64),
        )

    # ------------------------------------------------------------------ expand

    def __call__(self, parent_handles: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor) -> mcts.ExpandOutput:
        b, l = parent_handles.shape
        self.counters.calls += 1
        reward = torch.zeros((b, l))
        value = torch.zeros((b, l))
        terminal = torch.zeros((b, l), dtype=torch.bool)
        logits = torch.full((b, l, self.k), float("-inf"))
        handle = torch.full((b, l), mcts.NO_HANDLE, dtype=torch.int64)
        slots = [(i, j) for i, j in zip(*torch.nonzero(valid, as_tuple=True))]
        slots = [(int(i), int(j)) for i, j in slots]
        if not slots:
            return mcts.ExpandOutput(reward, torch.ones((b, l)), logits, value, handle, terminal)

        parents = [self.table[int(parent_handles[i, j])] for i, j in slots]
        chosen = [int(actions[i, j]) for i, j in slots]
        for p, a in zip(parents, chosen):
            if a >= len(p.edges):
                raise RuntimeError(f"search chose action {a} at a node with {len(p.edges)} edges (its logit is -inf)")
        start = time.perf_counter()
        outcomes = self.env.step_many([p.state for p in parents], [p.edges[a].action for p, a in zip(parents, chosen)])
        self.counters.env_seconds += time.perf_counter() - start

        children = []
        for (i, j), p, a, out in zip(slots, parents, chosen, outcomes):
            state, depth = out.state, p.depth + 1
            ends = state.terminal or depth >= self.search.max_depth or self.budget.exhausted(p.tree)
            if ends and not state.terminal:
                # Cut by the search (max depth or token budget): an unfinished, truncated episode.
                state = dataclasses.replace(state, truncated=True)
            node = SearchNode(
                tree=p.tree,
                state=state,
                parent=int(parent_handles[i, j]),
                action_index=a,
                edge=p.edges[a],
                depth=depth,
                terminal=ends,
            )
            h = self.table.add(node)
            children.append(h)
            handle[i, j] = h
        self.counters.nodes += len(children)

        start = time.perf_counter()
        for h in children:
            node = self.table[h]
            if node.terminal:
                result = self.reward.score(node.state.episode())
                node.reward, node.success, node.verdicts = result.reward, result.success, list(result.verdicts)
                self.counters.terminal += 1
                self.counters.successes += int(result.success)
            elif self.search.process_reward_cap > 0:
                node.reward, node.verdicts = self._process_reward(node)
        self.counters.verify_seconds += time.perf_counter() - start

        open_nodes = [h for h in children if not self.table[h].terminal]
        self._sample_edges(open_nodes)
        estimates = dict(zip(open_nodes, self._leaf_values(open_nodes)))
        for (i, j), h in zip(slots, children):
            node = self.table[h]
            reward[i, j] = node.reward
            terminal[i, j] = node.terminal
            if not node.terminal:
                node.value_estimate = estimates[h]
                value[i, j] = node.value_estimate
                logits[i, j] = torch.tensor(prior_logits(node.edges, self.k))
        if self.on_expand is not None:
            self.on_expand(self)
        return mcts.ExpandOutput(
            reward=reward, discount=torch.ones((b, l)), prior_logits=logits, value=value, handle=handle, terminal=terminal
        )

    # ------------------------------------------------------------------ pieces

    def _sample_edges(self, handles: list[int]) -> None:
        """K candidates for each node in one policy call; merged edges; critic scores."""
        if not handles:
            return
        nodes = [self.table[h] for h in handles]
        convs = [Conversation(n.state.messages, n.state.task.tools) for n in nodes]
        samples = self.policy.sample(
            convs,
            self.k,
            max_new_tokens=self.sampling.max_new_tokens,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            seed=self.seed,
        )
        for node, row in zip(nodes, samples):
            node.edges = merge_samples(row, prior=self.prior)
            tokens = sum(s.num_tokens for s in row)
            self.budget.charge(node.tree, tokens)
            self.counters.generated_tokens += tokens
        if self.critic is not None:
            ranked = self.critic.rank(convs, [[e.sample.text for e in n.edges] for n in nodes])
            for node, scores in zip(nodes, ranked):
                for edge, score in zip(node.edges, scores.scores):
                    edge.critic_score = score

    def _leaf_values(self, handles: list[int]) -> list[float]:
        """Value of each non-terminal node: the estimator's, mixed with the critic score of the
        edge into it (Agent Q: a * V + (1 - a) * critic; the value kind "critic" uses the
        critic score alone)."""
        if not handles:
            return []
        nodes = [self.table[h] for h in handles]
        start = time.perf_counter()
        before = self.policy.stats.generated_tokens
        raw = self.values.estimate([n.state for n in nodes])
        spent = self.policy.stats.generated_tokens - before
        self.counters.value_seconds += time.perf_counter() - start
        if spent:
            # A batched rollout call serves several trees: split its tokens by their leaves.
            self.budget.charge_split([n.tree for n in nodes], spent)
            self.counters.generated_tokens += spent
        out = []
        for node, v in zip(nodes, raw):
            critic = node.edge.critic_score if node.edge is not None else None
            if critic is None:
                out.append(v)
            elif self.search.value == "critic":
                out.append(critic)
            else:
                out.append(mix_q(v, critic, self.search.critic_mix))
        return out

    def _process_reward(self, node: SearchNode) -> tuple[float, list]:
        """Capped process reward of the step into `node`: step_reward clipped to
        [-cap, cap] and divided by max_depth, so a whole path adds at most `cap`."""
        cap = self.search.process_reward_cap
        r, verdicts = self.reward.step_reward(node.state.task, node.state.steps[-1])
        return max(-cap, min(cap, r)) / self.search.max_depth, verdicts
