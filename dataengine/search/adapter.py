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

Three batch-level features (docs/search.md has the rules):
- progressive widening (`widen`, the core's WidenFn): an exhausted node (every candidate
  expanded, no success below it) samples fresh candidates up to the cap k(N) = ceil(c N^alpha);
  where every candidate so far is a reply without a tool call, the fresh ones are sampled after
  a forced `<tool_call>` tag (`widen_tool_call`): resampling there mostly repeats the replies;
  with `widen_tool_names` every other round forces the likeliest tool no candidate calls yet;
- transpositions: a node whose state equals an earlier node of its tree (`transposition_key`)
  reuses that node's value estimate instead of estimating again;
- solved_policy "stop": a tree with a verified success stops (ExpandOutput.stop) and its
  unspent tokens go to the batch's unsolved trees (`TokenBudget.transfer`); with
  `solved_contrast` only once every node on its first success's path that has two candidates
  has a second child expanded, so step pairs have a visited sibling to set against the success.

Shapes: B trees, L leaves per tree and iteration, K action slots per node (num_actions, or
max_actions with widening), W exhausted nodes per tree offered for widening.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import mcts
from dataengine.budget import TokenBudget
from dataengine.config import PolicyConfig, SearchConfig
from dataengine.env import EnvState, ToolEnv
from dataengine.parsing import OPEN_TAG, parse_action
from dataengine.policy.base import Conversation, Policy, Sample
from dataengine.search.nodes import (
    NodeTable,
    PriorKind,
    SearchNode,
    WidenRound,
    add_samples,
    merge_samples,
    prior_logits,
    transposition_key,
    widen_cap,
)
from dataengine.search.variants import argument_variants, context_numbers, context_text, same_signature
from dataengine.types import Episode, Task, stable_hash
from dataengine.values import AICritic, RolloutValue, mix_q, reference_progress
from dataengine.verifiers.composite import CompositeReward
from dataengine.verifiers.efficiency import efficiency_score

# Rollouts use another seed than expansions of the same state, so rollout i is not candidate i.
ROLLOUT_SEED_OFFSET = 1_000_003


def widen_seed(seed: int, round: int) -> int:
    """Sampling seed of widening round `round` (1, 2, ...) of a node: a hash of the search
    seed and the round, so each round's samples are fresh draws, not the node's first K."""
    return int(stable_hash(["widen", seed, round])[:8], 16) % (2**31 - 1)


@dataclass
class ExpandCounters:
    """Running totals of one search batch (the progress bar and the summary read them).

    calls: expand calls (iterations); nodes: nodes created (roots included); terminal: terminal
    nodes; successes: terminal nodes whose episode succeeded; generated_tokens: tokens sampled
    for expansions, widening and rollouts; env_seconds / verify_seconds / value_seconds: wall
    time in env steps, verifiers and value estimation (model time inside value estimation
    included); widen_rounds / widened_edges: widening rounds run and edges they added;
    scored_variants / variant_edges / variant_tokens: argument variants scored, added as edges,
    and the tokens of the added ones (charged to the trees' budgets like sampled tokens);
    transpositions: nodes equal to an earlier node of their tree; values_reused: value
    estimates taken from such a node instead of estimated.
    """

    calls: int = 0
    nodes: int = 0
    terminal: int = 0
    successes: int = 0
    generated_tokens: int = 0
    widen_rounds: int = 0
    widened_edges: int = 0
    scored_variants: int = 0
    variant_edges: int = 0
    variant_tokens: int = 0
    transpositions: int = 0
    values_reused: int = 0
    env_seconds: float = 0.0
    verify_seconds: float = 0.0
    value_seconds: float = 0.0


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
        # The core widens through this attribute (mcts.WidenFn); None turns widening off.
        self.widen = self._widen if search.widening else None
        self.seen: list[dict[str, int]] = []
        self.solved: list[bool] = []
        self.solved_path: list[list[int]] = []  # per tree: handles root..first success ([] unsolved)
        self.stopped: list[bool] = []
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
        self.seen = [{} for _ in tasks]
        self.solved = [False] * len(tasks)
        self.solved_path = [[] for _ in tasks]
        self.stopped = [False] * len(tasks)
        handles = []
        for b, task in enumerate(tasks):
            handles.append(self.table.add(SearchNode(tree=b, state=self.env.reset(task))))
            self._link_transposition(handles[-1])
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
            self._link_transposition(h)
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
                if result.success and self._solves(returns[h]):
                    self._mark_solved(h)
            elif self.search.process_reward_cap > 0:
                node.reward, node.verdicts = self._process_reward(node)
        self.counters.verify_seconds += time.perf_counter() - start

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
        stop = self._stop_solved_trees()
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

    # ------------------------------------------------------------------ widening

    def _widen(self, handles: torch.Tensor, visits: torch.Tensor, valid: torch.Tensor) -> mcts.WidenOutput:
        """mcts.WidenFn: one widening round at each offered exhausted node that qualifies.

        A node qualifies when it has no success below it, its tree still searches and has
        tokens left, it holds fewer edges than k(N) = ceil(c * N^alpha) (at most K slots),
        and k(N) grew since its last round (a round that found only duplicates waits for a
        larger cap). The round samples cap - edges fresh candidates (at most num_actions) with
        `widen_seed`; all rounds of one call share one policy call per sample count.
        handles, visits, valid: `[B, W]`. Returns new logits `[B, W, K]` where widened.
        """
        b, w = handles.shape
        logits = torch.full((b, w, self.k), float("-inf"))
        widened = torch.zeros((b, w), dtype=torch.bool)
        picks: list[tuple[int, int, SearchNode, int, int]] = []
        for i, j in valid.nonzero().tolist():
            node = self.table[int(handles[i, j])]
            if node.terminal or node.solved_below or self.stopped[node.tree] or self.budget.exhausted(node.tree):
                continue
            n = int(visits[i, j])
            cap = widen_cap(n, self.search.widen_c, self.search.widen_alpha, self.k)
            last = node.widen_rounds[-1].cap if node.widen_rounds else 0
            if len(node.edges) < cap and cap > last:
                picks.append((i, j, node, n, cap))
        ranked: list[tuple[SearchNode, list]] = []
        if self.search.widen_arguments:
            picks = self._add_variants(picks, logits, widened, ranked)
        if self.search.widen_tool_names:
            self._rank_tool_names([node for _, _, node, _, _ in picks])
        groups: dict[tuple[int, str, str], list[tuple[int, int, SearchNode, int, int]]] = {}
        for pick in picks:
            count = min(self.num_samples, pick[4] - len(pick[2].edges))
            groups.setdefault((count, *self._widen_prefix(pick[2])), []).append(pick)
        for count, prefix, tool in sorted(groups):
            group = groups[count, prefix, tool]
            rounds = [len(node.widen_rounds) + 1 for _, _, node, _, _ in group]
            samples = self.policy.sample(
                [Conversation(node.state.messages, node.state.task.tools) for _, _, node, _, _ in group],
                count,
                max_new_tokens=self.sampling.max_new_tokens,
                temperature=self.sampling.temperature,
                top_p=self.sampling.top_p,
                seed=[widen_seed(self.seed, r) for r in rounds],
                prefix=prefix,
            )
            for (i, j, node, n, cap), r, row in zip(group, rounds, samples):
                tokens = sum(s.generated_tokens for s in row)
                self.budget.charge(node.tree, tokens)
                self.counters.generated_tokens += tokens
                before = len(node.edges)
                added = add_samples(node.edges, row, cap=cap, round=r, prior=self.prior, forced=bool(prefix))
                node.widen_rounds.append(
                    WidenRound(r, n, cap, len(node.children), before, len(node.edges), len(row), bool(prefix), tool=tool)
                )
                self.counters.widen_rounds += 1
                self.counters.widened_edges += len(added)
                if added:
                    ranked.append((node, added))
                logits[i, j] = torch.tensor(prior_logits(node.edges, self.k))
                widened[i, j] = True
        if self.critic is not None and ranked:
            # A new edge is ranked against the other edges of its round.
            scores = self.critic.rank(
                [Conversation(n.state.messages, n.state.task.tools) for n, _ in ranked],
                [[e.sample.text for e in added] for _, added in ranked],
            )
            for (_, added), score in zip(ranked, scores):
                for edge, value in zip(added, score.scores):
                    edge.critic_score = value
        return mcts.WidenOutput(prior_logits=logits, widened=widened)

    def _add_variants(
        self,
        picks: list[tuple[int, int, SearchNode, int, int]],
        logits: torch.Tensor,
        widened: torch.Tensor,
        ranked: list[tuple[SearchNode, list]],
    ) -> list[tuple[int, int, SearchNode, int, int]]:
        """Variant rounds (`widen_arguments`): at each picked node whose last round was not a
        variant round, add the most likely unused argument variants of its tool-call edges
        (up to the cap, at most num_actions) instead of sampling. New variants are scored in
        one `policy.score` call and kept in the node's pool; only added ones are charged to
        the tree (their tokens stand in for sampled ones). Returns the picks left to sample."""
        fresh: list[tuple[SearchNode, str, str]] = []
        for _, _, node, _, _ in picks:
            if _last_round_added_variants(node):
                continue
            keys = {e.action.key() for e in node.edges} | set(node.variant_pool)
            numbers = context_numbers(node.state.messages)
            swaps = same_signature(node.state.task.tools)
            schemas, text = None, ""
            if self.search.widen_arguments == "schema":
                schemas = {t.name: t.parameters or {} for t in node.state.task.tools}
                text = context_text(node.state.messages)
            for edge in node.edges:
                source = edge.action.key()
                if not edge.action.tool_calls or source in node.variant_sources:
                    continue
                node.variant_sources.add(source)
                for variant in argument_variants(edge.action, numbers, swaps=swaps, schemas=schemas, text=text):
                    key = parse_action(variant).key()
                    if key not in keys:
                        keys.add(key)
                        fresh.append((node, key, variant))
        if fresh:
            scored = self.policy.score([Conversation(n.state.messages, n.state.task.tools) for n, _, _ in fresh], [t for _, _, t in fresh])
            self.counters.scored_variants += len(fresh)
            for (node, key, _), sample in zip(fresh, scored):
                node.variant_pool[key] = sample
        rest = []
        for pick in picks:
            i, j, node, n, cap = pick
            last_was_variant = _last_round_added_variants(node)
            # Most likely first; sorted() is stable, so ties keep the pool's (deterministic) order.
            pool = sorted(node.variant_pool.items(), key=lambda kv: -kv[1].mean_logprob)
            take = pool[: min(self.num_samples, cap - len(node.edges))]
            if last_was_variant or not take:
                rest.append(pick)
                continue
            r = len(node.widen_rounds) + 1
            before = len(node.edges)
            added = []
            for key, sample in take:
                del node.variant_pool[key]
                edge = merge_samples([sample], prior=self.prior)[0]
                edge.round, edge.variant = r, True
                node.edges.append(edge)
                added.append(edge)
                self.budget.charge(node.tree, sample.num_tokens)
                self.counters.variant_tokens += sample.num_tokens
            node.widen_rounds.append(WidenRound(r, n, cap, len(node.children), before, len(node.edges), 0, False, len(added)))
            self.counters.widen_rounds += 1
            self.counters.widened_edges += len(added)
            self.counters.variant_edges += len(added)
            ranked.append((node, added))
            logits[i, j] = torch.tensor(prior_logits(node.edges, self.k))
            widened[i, j] = True
        return rest

    def _widen_prefix(self, node: SearchNode) -> tuple[str, str]:
        """(forced prefix, tool) of a node's sampled widening round.

        A tool-name round (`widen_tool_names`, every other round): the call opened with the
        name of the likeliest offered tool that no candidate of the node calls, the policy
        writing the arguments: a small policy that invents tool names (`send_order`) or keeps
        calling the wrong one rarely samples the right name (on shop it gained nothing: the
        round-2 model then wrote the wrong arguments, docs/results.md "Search yield"). Else the tool-call tag when every candidate so far is a reply
        without a tool call and the task has tools (`widen_tool_call`): sampling again from
        the same state would mostly repeat those replies. Else no prefix."""
        tools = node.state.task.tools
        if not tools:
            return "", ""
        if self.search.widen_tool_names and not (node.widen_rounds and node.widen_rounds[-1].tool):
            called = {c.name for e in node.edges for c in e.action.tool_calls}
            untried = [name for name in node.tool_names or [] if name not in called]
            if untried:
                return tool_name_prefix(untried[0]), untried[0]
        if not self.search.widen_tool_call:
            return "", ""
        return ("", "") if any(OPEN_TAG in e.sample.text for e in node.edges) else (OPEN_TAG, "")

    def _rank_tool_names(self, nodes: list[SearchNode]) -> None:
        """Order each node's offered tools by the policy's log-prob of the forced call opening
        (one `policy.score` call for every node not ranked yet; scoring is prefill, no tokens
        are generated or charged)."""
        todo = [n for n in nodes if n.tool_names is None and n.state.task.tools]
        pairs = [(n, t.name) for n in todo for t in n.state.task.tools]
        if not pairs:
            return
        scored = self.policy.score(
            [Conversation(n.state.messages, n.state.task.tools) for n, _ in pairs],
            [tool_name_prefix(name) for _, name in pairs],
            end_turn=False,
        )
        logprob: dict[int, list[tuple[float, str]]] = {}
        for (node, name), sample in zip(pairs, scored):
            logprob.setdefault(id(node), []).append((sample.logprob, name))
        for node in todo:
            # Likeliest first; sorted() is stable, so ties keep the task's tool order.
            node.tool_names = [name for _, name in sorted(logprob[id(node)], key=lambda x: -x[0])]

    # ------------------------------------------------------------------ transpositions, solved trees

    def _link_transposition(self, handle: int) -> None:
        """Point the node at the first node of its tree with an equal state, or register it."""
        if not self.search.transpositions:
            return
        node = self.table[handle]
        key = transposition_key(node.state)
        first = self.seen[node.tree].setdefault(key, handle)
        if first != handle:
            node.transposition_of = first
            self.counters.transpositions += 1

    def _solves(self, value: float) -> bool:
        """A successful terminal (backing up `value`) solves its tree, except under objective
        "efficient_success" when it wasted steps: the search goes on for a shorter success
        (widening included)."""
        return self.search.objective != "efficient_success" or value >= self.reward.weights.success

    def _mark_solved(self, handle: int) -> None:
        """A successful terminal: its tree is solved and every ancestor has a success below."""
        node = self.table[handle]
        self.solved[node.tree] = True
        path = self.table.path(handle)
        self.solved_path[node.tree] = self.solved_path[node.tree] or path
        for h in path:
            self.table[h].solved_below = True

    def _stop_solved_trees(self) -> torch.Tensor | None:
        """solved_policy "stop": trees newly solved stop, and their unspent tokens move to the
        trees of the batch without a success (split evenly, in tree order). Returns the `[B]`
        stop flags for the core, or None under "continue"."""
        if self.search.solved_policy != "stop":
            return None
        unsolved = [t for t, solved in enumerate(self.solved) if not solved]
        for t, solved in enumerate(self.solved):
            if solved and not self.stopped[t] and self._contrasted(t):
                self.stopped[t] = True
                self.budget.transfer(t, unsolved)
        return torch.tensor(self.stopped, dtype=torch.bool)

    def _contrasted(self, tree: int) -> bool:
        """Whether solved tree `tree` may stop: always, unless `solved_contrast`; then once every
        node on its first success's path with two or more candidates has two children. The
        success's Q keeps selection on it, so until then the tree spends simulations (no
        tokens) re-backing it up, and PUCT's exploration term reaches a sibling as visits grow."""
        if not self.search.solved_contrast:
            return True
        path = self.solved_path[tree][:-1]
        return all(len(self.table[h].children) >= 2 for h in path if len(self.table[h].edges) >= 2)

    # ------------------------------------------------------------------ pieces

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
        greedy = self.policy.sample(convs, 1, temperature=0.0, **kw)
        if self.num_samples == 1:
            return greedy
        sampled = self.policy.sample(convs, self.num_samples - 1, temperature=self.sampling.temperature, **kw)
        return [g + s for g, s in zip(greedy, sampled)]

    def _leaf_values(self, handles: list[int]) -> list[float]:
        """Value of each non-terminal node: the estimator's, mixed with the critic score of the
        edge into it (Agent Q: a * V + (1 - a) * critic; the value kind "critic" uses the
        critic score alone)."""
        if not handles:
            return []
        nodes = [self.table[h] for h in handles]
        # A transposition reuses the estimate of its first equal node (estimated earlier, or
        # in this very call: that node comes first in `nodes`).
        fresh = [n for n in nodes if n.transposition_of is None or self.table[n.transposition_of].terminal]
        start = time.perf_counter()
        before = self.policy.stats.generated_tokens
        raw = self.values.estimate([n.state for n in fresh])
        spent = self.policy.stats.generated_tokens - before
        self.counters.value_seconds += time.perf_counter() - start
        if spent:
            # A batched rollout call serves several trees: split its tokens by their leaves.
            self.budget.charge_split([n.tree for n in fresh], spent)
            self.counters.generated_tokens += spent
        for node, v in zip(fresh, raw):
            node.raw_value = v
        for node in nodes:
            if node.raw_value is None:
                node.raw_value = self.table[node.transposition_of].raw_value  # type: ignore[index]
                self.counters.values_reused += 1
        out = []
        for node in nodes:
            v = node.raw_value
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


def tool_name_prefix(name: str) -> str:
    """The opening of a call to tool `name`, as the worked examples write calls (`render_inline_calls`),
    cut after `"arguments":`. Not after the space: SmolLM2's tokenizer writes ' {"' as one token, and a
    forced lone space put the model off its usual text (it wrote `"arguments": 2` or a second space)."""
    return f'{OPEN_TAG}{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments":'


def _last_round_added_variants(node: SearchNode) -> bool:
    """Variant rounds alternate with sampled ones: a node whose last round added variants samples next."""
    return bool(node.widen_rounds and node.widen_rounds[-1].variants)
