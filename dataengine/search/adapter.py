"""The LLM adapter: the expand function (mcts.ExpandFn) over policy + ToolEnv + verifiers.

Each call expands every selected leaf of every tree at once:

1. the chosen edge of each parent is executed: one `ToolEnv.step_many` for all of them;
2. children that end the episode (final answer, step limit, max depth, or the tree's token
   budget spent) get the composite verifier reward;
3. every other child gets K candidate actions from ONE batched policy decode (with the greedy
   candidate, its greedy row and K - 1 sampled rows in one `policy.sample_together`); duplicates
   (same `Action.key()`) are merged and their prior mass summed (`nodes.merge_samples`);
4. optional: Agent Q's critic ranks each new node's candidates (one batched `policy.score`);
   the leaf values come from the configured estimator (zero, rollouts, critic, value model),
   mixed with the critic score of the edge into the leaf: a * V + (1 - a) * critic;
5. optional capped process reward from the step verifiers on the transition.

Three batch-level features (docs/search.md has the rules), each a module beside this one:
- progressive widening (widening.py, `Widening`, the core's WidenFn through `widen`): an
  exhausted node (every candidate expanded, no success below it) gets fresh candidates up to
  the cap k(N) = ceil(c N^alpha), sampled or argument variants;
- transpositions (transpositions.py): a node whose state equals an earlier node of its tree
  (`transposition_key`) reuses that node's value estimate instead of estimating again;
- solved_policy "stop" (solved.py): a tree with a verified success stops (ExpandOutput.stop)
  and its unspent tokens go to the batch's unsolved trees (`TokenBudget.transfer`); with
  `solved_contrast` only once every node on its first success's path that has two candidates
  has a second child expanded, so step pairs have a visited sibling to set against the success;
  and, stop or continue, contrast probes: the path's unexpanded final-answer candidates are
  stepped and verified (no tokens) as terminal nodes outside the tensor tree.
Leaf values, search returns and process reward are leaves.py's; running totals counters.py's.
This module holds the expand contract (roots, __call__), candidate sampling and the node table.

Shapes: B trees, L leaves per tree and iteration, K action slots per node (num_actions, or
max_actions with widening), W exhausted nodes per tree offered for widening.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import mcts
from dataengine.budget import TokenBudget
from dataengine.config import PolicyConfig, SearchConfig
from dataengine.env import ToolEnv
from dataengine.policy.base import Conversation, Policy, Sample, SampleRequest
from dataengine.search.counters import ExpandCounters
from dataengine.search.leaves import LeafValue, leaf_values, process_reward, search_return
from dataengine.search.nodes import NodeTable, PriorKind, SearchNode, merge_samples, prior_logits
from dataengine.search.solved import SolvedTrees
from dataengine.search.transpositions import Transpositions
from dataengine.search.widening import Widening
from dataengine.types import Task
from dataengine.values import AICritic
from dataengine.verifiers.composite import CompositeReward

__all__ = ["ExpandCounters", "LLMExpander", "LeafValue"]


class LLMExpander:
    """The expand function of an LLM tree search over B tasks; holds the node table.

    policy: samples K candidates per state (its `stats` count model time and tokens).
    env: the sandboxed ToolEnv. reward: the composite verifier reward of episodes.
    search: budgets and options (num_actions K, max_depth, value, critic_mix,
        process_reward_cap, max_generated_tokens per task, widening, transpositions,
        solved_policy).
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
        self.k = search.action_slots
        self.num_samples = search.num_actions
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
            objective=search.objective,
        )
        self.transpositions = Transpositions(search.transpositions, self.table, self.counters)
        self.solved = SolvedTrees(search, reward.weights.success, self.table)
        self.widening = Widening(
            policy,
            search,
            sampling,
            prior=prior,
            seed=seed,
            critic=self.critic,
            table=self.table,
            counters=self.counters,
            solved=self.solved,
        )
        # The core widens through this attribute (mcts.WidenFn); None turns widening off.
        self.widen = self.widening if search.widening else None

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
        self.table.budget = self.budget
        self.widening.begin(self.budget)
        self.transpositions.reset(len(tasks))
        self.solved.reset(len(tasks))
        handles = []
        for b, task in enumerate(tasks):
            handles.append(self.table.add(SearchNode(tree=b, state=self.env.reset(task))))
            self.transpositions.link(handles[-1])
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
            p.children[a] = h
            self.transpositions.link(h)
            children.append(h)
            handle[i, j] = h
        self.counters.nodes += len(children)

        start = time.perf_counter()
        returns: dict[int, float] = {}  # terminal handle -> what it backs up (search_return)
        for h in children:
            node = self.table[h]
            if node.terminal:
                episode = node.state.episode()
                result = self.reward.score(episode)
                node.reward, node.success, node.verdicts = result.reward, result.success, list(result.verdicts)
                returns[h] = search_return(self.reward, result, self.search.objective, episode)
                self.counters.terminal += 1
                self.counters.successes += int(result.success)
                if result.success and self.solved.solves(returns[h]):
                    self.solved.mark(h)
            elif self.search.process_reward_cap > 0:
                node.reward, node.verdicts = process_reward(node, self.reward, self.search)
        self.counters.verify_seconds += time.perf_counter() - start
        self._probe(self.solved.probe_candidates())

        open_nodes = [h for h in children if not self.table[h].terminal]
        self._sample_edges(open_nodes)
        estimates = dict(zip(open_nodes, self._leaf_values(open_nodes)))
        for (i, j), h in zip(slots, children):
            node = self.table[h]
            # The row keeps the composite reward; the tree backs up the search's objective.
            reward[i, j] = returns[h] if node.terminal else node.reward
            terminal[i, j] = node.terminal
            if not node.terminal:
                node.value_estimate = estimates[h]
                value[i, j] = node.value_estimate
                logits[i, j] = torch.tensor(prior_logits(node.edges, self.k))
        stop = self.solved.stop(self.budget)
        if self.on_expand is not None:
            self.on_expand(self)
        return mcts.ExpandOutput(
            reward=reward,
            discount=torch.ones((b, l)),
            prior_logits=logits,
            value=value,
            handle=handle,
            terminal=terminal,
            stop=stop,
        )

    # ------------------------------------------------------------------ pieces

    def _probe(self, candidates: list[tuple[int, int]]) -> None:
        """Contrast probes (`SolvedTrees.probe_candidates`): step each (node, edge) in one
        `ToolEnv.step_many` and verify the episode it ends; the probe is a terminal node of the
        table, kept in its parent's `probes` and not in the tensor tree (nothing is backed up,
        so the search's statistics are those of the search alone)."""
        if not candidates:
            return
        parents = [self.table[h] for h, _ in candidates]
        start = time.perf_counter()
        outcomes = self.env.step_many([p.state for p in parents], [p.edges[a].action for p, (_, a) in zip(parents, candidates)])
        self.counters.env_seconds += time.perf_counter() - start
        start = time.perf_counter()
        for (h, a), p, out in zip(candidates, parents, outcomes):
            if not out.state.terminal:  # a final answer ends the episode; anything else is not a probe
                continue
            episode = out.state.episode()
            result = self.reward.score(episode)
            node = SearchNode(tree=p.tree, state=out.state, parent=h, action_index=a, edge=p.edges[a],
                              depth=p.depth + 1, terminal=True, reward=result.reward, success=result.success,
                              verdicts=list(result.verdicts),
                              probe_value=search_return(self.reward, result, self.search.objective, episode))
            p.probes[a] = self.table.add(node)
            self.counters.probes += 1
        self.counters.verify_seconds += time.perf_counter() - start

    def _sample_edges(self, handles: list[int]) -> None:
        """K candidates for each node in one policy call; merged edges; critic scores."""
        if not handles:
            return
        nodes = [self.table[h] for h in handles]
        convs = [Conversation(n.state.messages, n.state.task.tools) for n in nodes]
        samples = self._candidates(convs)
        for node, row in zip(nodes, samples):
            node.edges = merge_samples(row, prior=self.prior)
            if self.search.greedy_candidate:  # the greedy sample is first, so its edge is edge 0
                node.edges[0].greedy = True
            tokens = sum(s.generated_tokens for s in row)
            self.budget.charge(node.tree, tokens)
            self.counters.generated_tokens += tokens
        if self.critic is not None:
            ranked = self.critic.rank(convs, [[e.sample.text for e in n.edges] for n in nodes])
            for node, scores in zip(nodes, ranked):
                for edge, score in zip(node.edges, scores.scores):
                    edge.critic_score = score

    def _candidates(self, convs: list[Conversation]) -> list[list[Sample]]:
        """K candidate samples per conversation; with `search.greedy_candidate` the first is the
        greedy continuation and K - 1 are sampled. At temperature 0.7 two samples can both miss
        the call the greedy decode gets right (units bench, 2026-11-29: MCTS missed 3 tasks greedy solved)."""
        kw = dict(max_new_tokens=self.sampling.max_new_tokens, top_p=self.sampling.top_p, seed=self.seed)
        if not self.search.greedy_candidate:
            return self.policy.sample(convs, self.num_samples, temperature=self.sampling.temperature, **kw)
        if self.num_samples == 1:
            return self.policy.sample(convs, 1, temperature=0.0, **kw)
        # One decode for both: the greedy rows and the K - 1 sampled rows share its steps.
        top_p, seed = self.sampling.top_p, self.seed
        greedy, sampled = self.policy.sample_together(
            [SampleRequest(convs, 1, temperature=0.0, top_p=top_p, seed=seed),
             SampleRequest(convs, self.num_samples - 1, temperature=self.sampling.temperature, top_p=top_p, seed=seed)],
            max_new_tokens=self.sampling.max_new_tokens,
        )
        return [g + s for g, s in zip(greedy, sampled)]

    def _leaf_values(self, handles: list[int]) -> list[float]:
        """`leaves.leaf_values` of the nodes `handles` with this expander's estimator and budget."""
        return leaf_values(
            self.table,
            handles,
            self.values,
            policy=self.policy,
            budget=self.budget,
            counters=self.counters,
            search=self.search,
        )
