"""Progressive widening (the core's mcts.WidenFn; docs/search.md has the rules).

An exhausted node (every candidate expanded, no success below it) gets fresh candidates up to
the cap k(N) = ceil(c N^alpha): sampled with `widen_seed` (after a forced `<tool_call>` tag
where every candidate so far is a reply without one, `widen_tool_call`; every other round
after the name of the likeliest tool no candidate calls yet, `widen_tool_names`), or, in
variant rounds (`widen_arguments`), the likeliest unused argument variants of its calls.

Shapes: B trees, W exhausted nodes per tree offered for widening, K action slots per node.
"""

from __future__ import annotations

import json

import torch

import mcts
from dataengine.budget import TokenBudget
from dataengine.config import PolicyConfig, SearchConfig
from dataengine.parsing import OPEN_TAG, parse_action
from dataengine.policy.base import Conversation, Policy, SampleRequest
from dataengine.search.counters import ExpandCounters
from dataengine.search.nodes import (
    NodeTable,
    PriorKind,
    SearchNode,
    WidenRound,
    add_samples,
    merge_samples,
    prior_logits,
    widen_cap,
)
from dataengine.search.solved import SolvedTrees
from dataengine.search.variants import argument_variants, context_numbers, context_text, same_signature
from dataengine.types import stable_hash
from dataengine.values import AICritic


def widen_seed(seed: int, round: int) -> int:
    """Sampling seed of widening round `round` (1, 2, ...) of a node: a hash of the search
    seed and the round, so each round's samples are fresh draws, not the node's first K."""
    return int(stable_hash(["widen", seed, round])[:8], 16) % (2**31 - 1)


class Widening:
    """The widening rounds of one expander: `__call__` is the core's mcts.WidenFn.

    policy, search, sampling, prior, seed: as the expander's (K = search.action_slots slots,
    num_actions samples per round at most). critic: Agent Q's critic, or None; it ranks each
    round's new edges. table, counters, solved: the expander's node table, running totals and
    solved trees (stopped trees are not widened). budget: the batch's token budget, set by
    `begin` at each batch's roots.
    """

    def __init__(
        self,
        policy: Policy,
        search: SearchConfig,
        sampling: PolicyConfig,
        *,
        prior: PriorKind,
        seed: int,
        critic: AICritic | None,
        table: NodeTable,
        counters: ExpandCounters,
        solved: SolvedTrees,
    ) -> None:
        self.policy, self.search, self.sampling = policy, search, sampling
        self.prior, self.seed, self.critic = prior, seed, critic
        self.table, self.counters, self.solved = table, counters, solved
        self.k = search.action_slots
        self.num_samples = search.num_actions
        self.budget = TokenBudget.for_tasks(0, search.max_generated_tokens)

    def begin(self, budget: TokenBudget) -> None:
        """A new batch: its rounds charge `budget`."""
        self.budget = budget

    def __call__(self, handles: torch.Tensor, visits: torch.Tensor, valid: torch.Tensor) -> mcts.WidenOutput:
        """mcts.WidenFn: one widening round at each offered exhausted node that qualifies.

        A node qualifies when it has no success below it, its tree still searches and has
        tokens left, it holds fewer edges than k(N) = ceil(c * N^alpha) (at most K slots),
        and k(N) grew since its last round (a round that found only duplicates waits for a
        larger cap). The round samples cap - edges fresh candidates (at most num_actions) with
        `widen_seed`; all rounds of one call are decoded together (one `policy.sample_together`).
        handles, visits, valid: `[B, W]`. Returns new logits `[B, W, K]` where widened.
        """
        b, w = handles.shape
        logits = torch.full((b, w, self.k), float("-inf"))
        widened = torch.zeros((b, w), dtype=torch.bool)
        picks: list[tuple[int, int, SearchNode, int, int]] = []
        for i, j in valid.nonzero().tolist():
            node = self.table[int(handles[i, j])]
            if node.terminal or node.solved_below or self.solved.stopped[node.tree] or self.budget.exhausted(node.tree):
                continue
            n = int(visits[i, j])
            cap = widen_cap(n, self.search.widen_c, self.search.widen_alpha, self.k)
            last = node.widen_rounds[-1].cap if node.widen_rounds else 0
            if len(node.edges) < cap and cap > last:
                picks.append((i, j, node, n, cap))
        ranked: list[tuple[SearchNode, list]] = []
        if self.search.widen_arguments:
            picks = self.add_variants(picks, logits, widened, ranked)
        if self.search.widen_tool_names:
            self.rank_tool_names([node for _, _, node, _, _ in picks])
        groups: dict[tuple[int, str, str], list[tuple[int, int, SearchNode, int, int]]] = {}
        for pick in picks:
            count = min(self.num_samples, pick[4] - len(pick[2].edges))
            groups.setdefault((count, *self.prefix(pick[2])), []).append(pick)
        order = sorted(groups)
        requests = []
        for count, prefix, tool in order:
            group = groups[count, prefix, tool]
            rounds = [len(node.widen_rounds) + 1 for _, _, node, _, _ in group]
            requests.append(SampleRequest(
                [Conversation(node.state.messages, node.state.task.tools) for _, _, node, _, _ in group],
                count,
                temperature=self.sampling.temperature,
                top_p=self.sampling.top_p,
                seed=[widen_seed(self.seed, r) for r in rounds],
                prefix=prefix,
            ))
        # Every round of the call in one decode: its steps are paid once for all their rows.
        results = self.policy.sample_together(requests, max_new_tokens=self.sampling.max_new_tokens) if requests else []
        for (count, prefix, tool), samples in zip(order, results):
            group = groups[count, prefix, tool]
            rounds = [len(node.widen_rounds) + 1 for _, _, node, _, _ in group]
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

    def add_variants(
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

    def prefix(self, node: SearchNode) -> tuple[str, str]:
        """(forced prefix, tool) of a node's sampled widening round.

        A tool-name round (`widen_tool_names`, every other round): the call opened with the
        name of the likeliest offered tool that no candidate of the node calls, the policy
        writing the arguments: a small policy that invents tool names (`send_order`) or keeps
        calling the wrong one rarely samples the right name (on shop it gained nothing: the
        round-2 model then wrote the wrong arguments, README "Search yield"). Else the tool-call tag when every candidate so far is a reply
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

    def rank_tool_names(self, nodes: list[SearchNode]) -> None:
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


def tool_name_prefix(name: str) -> str:
    """The opening of a call to tool `name`, as the worked examples write calls (`render_inline_calls`),
    cut after `"arguments":`. Not after the space: SmolLM2's tokenizer writes ' {"' as one token, and a
    forced lone space put the model off its usual text (it wrote `"arguments": 2` or a second space)."""
    return f'{OPEN_TAG}{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments":'


def _last_round_added_variants(node: SearchNode) -> bool:
    """Variant rounds alternate with sampled ones: a node whose last round added variants samples next."""
    return bool(node.widen_rounds and node.widen_rounds[-1].variants)
