"""Monotonic transformations of Q(s, a), as in mctx's qtransforms.

Each takes the NodeStats of B nodes and returns `[B, K]` transformed Q values.
"""

from __future__ import annotations

import torch

from mcts.base import NodeStats
from mcts.numerics import softmax

# Avoids dividing by zero when all Q values of a node are equal.
EPSILON = 1e-8


def qtransform_by_min_max(stats: NodeStats, *, min_value: float, max_value: float) -> torch.Tensor:
    """Q normalised by fixed bounds: (Q - min) / (max - min); unvisited actions get min_value."""
    visited = stats.children_visits > 0
    q = torch.where(visited, stats.qvalues, torch.full_like(stats.qvalues, min_value))
    return (q - min_value) / (max_value - min_value)


def qtransform_by_parent_and_siblings(stats: NodeStats, *, epsilon: float = EPSILON) -> torch.Tensor:
    """Q min-max normalised by the node's value and its visited children's Q values (MuZero).

    Unvisited actions are completed with the minimum, so they score 0.
    """
    visited = stats.children_visits > 0
    node_value = stats.value.unsqueeze(-1)
    safe_q = torch.where(visited, stats.qvalues, node_value)
    min_value = torch.minimum(node_value, safe_q.min(-1, keepdim=True).values)
    max_value = torch.maximum(node_value, safe_q.max(-1, keepdim=True).values)
    completed = torch.where(visited, stats.qvalues, min_value)
    return (completed - min_value) / (max_value - min_value).clamp_min(epsilon)


def mixed_value(stats: NodeStats) -> torch.Tensor:
    """`[B]` the mixed value of Gumbel MuZero (appendix D): raw value and visited Q by prior."""
    visited = stats.children_visits > 0
    total_visits = stats.children_visits.sum(-1)
    probs = softmax(stats.prior_logits)
    # Keeps the weighted Q finite when a visited action has zero prior probability.
    probs = probs.clamp_min(torch.finfo(probs.dtype).tiny)
    sum_probs = torch.where(visited, probs, torch.zeros_like(probs)).sum(-1, keepdim=True)
    weighted_q = torch.where(
        visited, probs * stats.qvalues / torch.where(sum_probs > 0, sum_probs, 1.0), torch.zeros_like(probs)
    ).sum(-1)
    return (stats.raw_value + total_visits * weighted_q) / (total_visits + 1)


def qtransform_completed_by_mix_value(
    stats: NodeStats,
    *,
    value_scale: float = 0.1,
    maxvisit_init: float = 50.0,
    rescale_values: bool = True,
    use_mixed_value: bool = True,
    epsilon: float = EPSILON,
) -> torch.Tensor:
    """sigma(completed Q) of Gumbel MuZero: (maxvisit_init + max_a N(s, a)) * value_scale * Q.

    Unvisited actions are completed with the mixed value (or the raw value); Q is then
    min-max rescaled to [0, 1] over the node's actions if rescale_values.
    value_scale: the paper's c_scale = 0.1; maxvisit_init: its c_visit = 50.
    """
    visited = stats.children_visits > 0
    value = mixed_value(stats) if use_mixed_value else stats.raw_value
    completed = torch.where(visited, stats.qvalues, value.unsqueeze(-1))
    if rescale_values:
        # Invalid actions do not take part in the min and max.
        lo = completed.masked_fill(stats.invalid, float("inf")).min(-1, keepdim=True).values
        hi = completed.masked_fill(stats.invalid, float("-inf")).max(-1, keepdim=True).values
        completed = (completed - lo) / (hi - lo).clamp_min(epsilon)
        completed = completed.masked_fill(stats.invalid, 0.0)
    max_visit = stats.children_visits.max(-1, keepdim=True).values
    return (maxvisit_init + max_visit) * value_scale * completed
