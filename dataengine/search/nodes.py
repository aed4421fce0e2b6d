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

from dataengine.env import EnvState
from dataengine.parsing import parse_action
from dataengine.policy.base import Sample
from dataengine.types import Action, Verdict

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
    """

    action: Action
    sample: Sample
    count: int
    mass: float
    critic_score: float | None = None


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
        terminal nodes).
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


class NodeTable:
    """Every node of the trees of one batch; a node's handle is its index here."""

    def __init__(self) -> None:
        self.nodes: list[SearchNode] = []

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
