"""The Python side of the LLM search: a table of nodes that the tensor trees point into.

The mcts core keeps statistics as tensors and knows each node only by an integer handle; the
handle is the node's index in a `NodeTable`. A node holds what the tensors cannot: the env
state (conversation and tool-state snapshot), the action that led to it, the sample it was
read from, verdicts, and its K candidate edges (the merged samples it may be expanded with).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from dataengine.budget import TokenBudget
from dataengine.env import EnvState
from dataengine.parsing import parse_action
from dataengine.policy.base import Sample
from dataengine.types import Action, Verdict, stable_hash

PriorKind = Literal["logprob", "frequency"]


@dataclass
class Edge:
    """One candidate action at a node: duplicates (same `Action.key()`) merged into one edge.

    action: the parsed action (of the first sample with this key).
    sample: the first sample with this key (its text, token count and behaviour log-prob).
    count: how many of the K samples had this key.
    mass: summed prior mass of the merged samples (exp of the length-normalised log-prob, or
        1 per sample for frequency priors).
    critic_score: Agent Q critic score in [0, 1] of this action, or None when no critic ran.
    round: widening round that added the edge (0: the node's first K samples).
    forced: the edge came from a tool-call widening round (sampled after a forced tool-call
        opening tag, `SearchConfig.widen_tool_call`).
    variant: the edge is an argument variant of another edge (`search.variants`), scored by
        the policy instead of sampled (`SearchConfig.widen_arguments`).
    greedy: the edge holds the policy's greedy continuation (`SearchConfig.greedy_candidate`).
    """

    action: Action
    sample: Sample
    count: int
    mass: float
    critic_score: float | None = None
    round: int = 0
    forced: bool = False
    variant: bool = False
    greedy: bool = False


@dataclass(frozen=True)
class WidenRound:
    """One progressive widening round at a node, as it happened.

    round: 1, 2, ... at this node. visits: N(s) when it ran. cap: k(N) = ceil(c * N^alpha),
    bounded by the action slots. expanded: edges that had a child then (all of them: the node
    was exhausted). edges_before, edges_after: candidate edges before and after the round.
    samples: fresh samples drawn (cap - edges_before, at most num_actions; 0 in a variant round).
    forced: the samples were drawn after a forced tool-call opening tag.
    variants: argument variants added instead of samples (a variant round).
    tool: the tool whose name the samples were forced to call (a tool-name round), else "".
    """

    round: int
    visits: int
    cap: int
    expanded: int
    edges_before: int
    edges_after: int
    samples: int
    forced: bool = False
    variants: int = 0
    tool: str = ""


@dataclass
class SearchNode:
    """One node of a search tree: the env state after the action on the edge into it.

    tree: index of the tree (task) in its batch; parent: handle of the parent (None: root).
    action_index: edge index at the parent (None: root); edge: that edge (None: root).
    depth: assistant turns from the root; terminal: the episode ends here (final answer, step
        limit, max depth or the tree's token budget).
    reward: reward of the edge into this node (the composite verifier reward when terminal,
        the capped process reward otherwise); success: terminal and solved (None otherwise).
    value_estimate: the leaf value the search started this node with (None when terminal).
    verdicts: verifier verdicts of the episode (terminal) or of the last step (process reward).
    edges: the K candidate actions sampled at this node (empty until expanded, and for
        terminal nodes); widening rounds append to them.
    raw_value: the value estimator's output before the critic mix (None when terminal).
    children: edge index -> handle of the child expanded through it.
    transposition_of: handle of the earlier node of the tree with an equal state
        (`transposition_key`), whose value estimate this node reused; None otherwise.
    solved_below: a successful terminal node lies in this node's subtree.
    widen_rounds: the widening rounds done here (`WidenRound`, in order).
    variant_pool: argument variants of this node's edges, scored and not yet added (action
        key -> sample); variant_sources: keys of the edges whose variants are in the pool or added.
    tool_names: the task's tools, likeliest first under the policy at this state (tool-name
        rounds, `SearchConfig.widen_tool_names`); None until the first such round is due.
    probes: edge index -> handle of a contrast probe through it (`SearchConfig.solved_contrast`:
        an unexpanded final-answer candidate of a success path's node, stepped and verified
        outside the tensor tree).
    probe_value: a probe's search return (what it would back up as a child); None for the
        tensor tree's nodes.
    """

    tree: int
    state: EnvState
    parent: int | None = None
    action_index: int | None = None
    edge: Edge | None = None
    depth: int = 0
    terminal: bool = False
    reward: float = 0.0
    success: bool | None = None
    value_estimate: float | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    raw_value: float | None = None
    children: dict[int, int] = field(default_factory=dict)
    transposition_of: int | None = None
    solved_below: bool = False
    widen_rounds: list[WidenRound] = field(default_factory=list)
    variant_pool: dict[str, Sample] = field(default_factory=dict)
    tool_names: list[str] | None = None
    variant_sources: set[str] = field(default_factory=set)
    probes: dict[int, int] = field(default_factory=dict)
    probe_value: float | None = None

    @property
    def origin(self) -> str:
        """What produced the node: "root", "greedy" (the parent's greedy candidate), "expand" (an
        edge of the parent's first K samples), "widen" (an edge a widening round added at the
        parent), "widen_tool" (one a tool-call widening round added) or "widen_args" (an
        argument variant a widening round added); "contrast" for a contrast probe."""
        if self.edge is None:
            return "root"
        if self.probe_value is not None:
            return "contrast"
        if self.edge.greedy:
            return "greedy"
        if self.edge.round == 0:
            return "expand"
        if self.edge.variant:
            return "widen_args"
        return "widen_tool" if self.edge.forced else "widen"


class NodeTable:
    """Every node of the trees of one batch; a node's handle is its index here."""

    def __init__(self) -> None:
        self.nodes: list[SearchNode] = []
        # The token budget of the batch's trees (used, received, given per tree); set by the
        # expander, read by the store rows.
        self.budget: TokenBudget | None = None

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, handle: int) -> SearchNode:
        return self.nodes[handle]

    def add(self, node: SearchNode) -> int:
        """Store `node`; returns its handle."""
        self.nodes.append(node)
        return len(self.nodes) - 1

    def path(self, handle: int) -> list[int]:
        """Handles from the root of the node's tree to the node, root first."""
        out = [handle]
        while self.nodes[out[-1]].parent is not None:
            out.append(self.nodes[out[-1]].parent)  # type: ignore[arg-type]
        return out[::-1]


def merge_samples(samples: Sequence[Sample], *, prior: PriorKind = "logprob") -> list[Edge]:
    """Parse K samples and merge duplicate actions (equal `Action.key()`), summing prior mass.

    The edges keep the order in which each key first appears, so the same samples always give
    the same edge indices.
    """
    if prior not in ("logprob", "frequency"):
        raise ValueError(f"prior must be 'logprob' or 'frequency', got {prior!r}")
    edges: dict[str, Edge] = {}
    for sample in samples:
        action = parse_action(sample.text)
        mass = 1.0 if prior == "frequency" else math.exp(sample.mean_logprob)
        key = action.key()
        if key in edges:
            edges[key].count += 1
            edges[key].mass += mass
        else:
            edges[key] = Edge(action=action, sample=sample, count=1, mass=mass)
    return list(edges.values())


def add_samples(
    edges: list[Edge], samples: Sequence[Sample], *, cap: int, round: int, prior: PriorKind = "logprob", forced: bool = False
) -> list[Edge]:
    """Merge a widening round's samples into a node's `edges` (in place); returns the new edges.

    A sample whose key equals an existing edge adds its count and prior mass to it; a new key
    becomes a new edge (marked with `round`) while the node holds fewer than `cap` edges, and
    is dropped after that.
    """
    by_key = {e.action.key(): e for e in edges}
    added = []
    for edge in merge_samples(samples, prior=prior):
        key = edge.action.key()
        if key in by_key:
            by_key[key].count += edge.count
            by_key[key].mass += edge.mass
        elif len(edges) < cap:
            edge.round, edge.forced = round, forced
            edges.append(edge)
            by_key[key] = edge
            added.append(edge)
    return added


def widen_cap(visits: int, c: float, alpha: float, slots: int) -> int:
    """k(N) = ceil(c * N^alpha) candidate edges at a node of N visits, at most `slots`."""
    return min(slots, math.ceil(c * max(visits, 0) ** alpha))


def transposition_key(state: EnvState) -> str:
    """The state's identity up to the order of whole turns.

    Equal keys mean the same task, the same tool state (`state_hash`), the same end flags and
    the same turns (each assistant message, raw text as the model saw it, with the
    observations it got) possibly in another order within each user turn: a step whose
    observations hold a user message (the next user turn of a multi-turn task) closes a
    segment, and segments keep their order. The edges of one node have distinct keys, so
    two nodes of one tree share a key only when their paths took the same turns in another
    order: a transposition.
    """
    segments: list[list[str]] = [[]]
    for step in state.steps:
        segments[-1].append(
            stable_hash([step.action.to_message().model_dump(mode="json"), [o.model_dump(mode="json") for o in step.observations]])
        )
        if any(o.role == "user" for o in step.observations):
            segments.append([])
    return stable_hash([state.task.id, state.state_hash, state.done, state.truncated, [sorted(x) for x in segments]])


def prior_logits(edges: Sequence[Edge], k: int) -> list[float]:
    """`[k]` logits: log of each edge's normalised mass; -inf for the slots without an edge."""
    if len(edges) > k:
        raise ValueError(f"{len(edges)} edges do not fit in K={k} action slots")
    total = sum(e.mass for e in edges)
    out = [-math.inf] * k
    for i, e in enumerate(edges):
        # A tiny mass (very unlikely text) must stay a valid, finite action.
        out[i] = math.log(max(e.mass / total, 1e-30)) if total > 0 else 0.0
    return out


def edge_priors(edges: Sequence[Edge]) -> list[float]:
    """Normalised prior probability of each edge (what the `nodes.prior` column stores)."""
    total = sum(e.mass for e in edges)
    return [e.mass / total if total > 0 else 1.0 / len(edges) for e in edges]
