"""Action selection rules: PUCT, UCT and Gumbel MuZero (root and interior).

Each rule maps the NodeStats of B nodes (and a torch.Generator for tie-breaking) to `[B]`
int64 actions, never choosing an action marked invalid.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mcts import seq_halving
from mcts.base import NodeStats
from mcts.numerics import softmax
from mcts.qtransforms import (
    qtransform_by_parent_and_siblings,
    qtransform_completed_by_mix_value,
)

QTransform = Callable[[NodeStats], torch.Tensor]

# AlphaZero's exploration constants: c1 (pb_c_init) and c2 (pb_c_base).
PB_C_INIT = 1.25
PB_C_BASE = 19652.0
# Agent Q's UCT exploration constant c_exp (the paper leaves it a hyperparameter).
C_EXP = 1.0
# Scale of the random tie-breaking term: far below any meaningful score difference.
TIE_BREAK_SCALE = 1e-7


def masked_argmax(scores: torch.Tensor, invalid: torch.Tensor) -> torch.Tensor:
    """`[B]` argmax over the last axis of `[B, K]` scores, never picking an invalid action."""
    return scores.masked_fill(invalid, float("-inf")).argmax(-1)


class NoiseTape:
    """Stands in for a rule's torch.Generator where the draws must be made ahead: a compiled
    search step (mcts.search, compiled=True) cannot call the generator, so its uniform noise is
    drawn before the step in one flat float32 tensor and handed out here in order; `offset`
    counts the values handed out. A CPU generator gives one flat draw the same numbers as the
    same draws made one by one, so the rules see exactly the noise of the eager loop.
    """

    def __init__(self, noise: torch.Tensor):
        self.noise = noise
        self.offset = 0

    def rand(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        """Uniform [0, 1) float32 noise of this shape: the next draw."""
        size = math.prod(shape)
        if self.offset + size > self.noise.numel():
            raise ValueError(
                f"a selection rule drew more tie-break noise than the compiled search holds ({self.noise.numel()} "
                "values: one [B, K] draw per rule call); draw through the given generator once per call, or use compiled=False"
            )
        out = self.noise[self.offset : self.offset + size].view(shape)
        self.offset += size
        return out


def _tie_break(stats: NodeStats, generator: torch.Generator | NoiseTape | None) -> torch.Tensor:
    if isinstance(generator, NoiseTape):
        noise = generator.rand(stats.qvalues.shape)
    else:
        noise = torch.rand(stats.qvalues.shape, generator=generator, device=stats.qvalues.device)
    return TIE_BREAK_SCALE * noise.to(stats.qvalues.dtype)


def puct_scores(
    stats: NodeStats,
    *,
    pb_c_init: float = PB_C_INIT,
    pb_c_base: float = PB_C_BASE,
    qtransform: QTransform = qtransform_by_parent_and_siblings,
) -> torch.Tensor:
    """`[B, K]` PUCT scores Q(s, a) + P(s, a) sqrt(N(s)) / (1 + N(s, a)) * c(s), without tie-breaking.

    c(s) = pb_c_init + log((N(s) + pb_c_base + 1) / pb_c_base); Q is transformed by qtransform
    (default: min-max normalised by the node's value and its siblings).
    """
    visits = stats.visits.to(stats.qvalues.dtype).unsqueeze(-1)
    pb_c = pb_c_init + torch.log((visits + pb_c_base + 1.0) / pb_c_base)
    probs = softmax(stats.prior_logits)
    policy_score = torch.sqrt(visits) * pb_c * probs / (stats.children_visits + 1.0)
    return qtransform(stats) + policy_score


def puct_action_selection(
    stats: NodeStats,
    generator: torch.Generator | None = None,
    *,
    pb_c_init: float = PB_C_INIT,
    pb_c_base: float = PB_C_BASE,
    qtransform: QTransform = qtransform_by_parent_and_siblings,
) -> torch.Tensor:
    """AlphaZero/MuZero PUCT: argmax_a of puct_scores, ties broken at random by `generator`."""
    scores = puct_scores(stats, pb_c_init=pb_c_init, pb_c_base=pb_c_base, qtransform=qtransform)
    return masked_argmax(scores + _tie_break(stats, generator), stats.invalid)


def uct_action_selection(
    stats: NodeStats,
    generator: torch.Generator | None = None,
    *,
    c_exp: float = C_EXP,
    qtransform: QTransform = qtransform_by_parent_and_siblings,
) -> torch.Tensor:
    """UCT as in Agent Q (arXiv 2408.07199, eq. 7): argmax_a Q(s, a) + c_exp sqrt(log N(s) / (1 + N(s, a))).

    Q is transformed by qtransform (default min-max normalisation, so c_exp is scale-free).
    """
    visits = stats.visits.to(stats.qvalues.dtype).clamp_min(1.0).unsqueeze(-1)
    explore = c_exp * torch.sqrt(torch.log(visits) / (1.0 + stats.children_visits))
    scores = qtransform(stats) + explore + _tie_break(stats, generator)
    return masked_argmax(scores, stats.invalid)


def gumbel_muzero_root_action_selection(
    stats: NodeStats,
    generator: torch.Generator | None = None,
    *,
    gumbel: torch.Tensor,
    num_simulations: int,
    max_num_considered_actions: int,
    qtransform: QTransform = qtransform_completed_by_mix_value,
) -> torch.Tensor:
    """Gumbel MuZero root: Sequential Halving over the top actions by g + logits + sigma(Q).

    gumbel: `[B, K]` the root's Gumbel noise, fixed for the whole search.
    num_simulations: the budget Sequential Halving plans for.
    max_num_considered_actions: m, actions sampled without replacement at the root.
    """
    del generator  # deterministic given the Gumbel noise
    table = seq_halving.get_table_of_considered_visits(
        max_num_considered_actions, max(num_simulations, 1), device=stats.qvalues.device
    )
    # Counted from the logits: actions blocked by virtual loss still belong to the halving plan.
    num_valid = (~torch.isneginf(stats.prior_logits)).sum(-1)
    num_considered = num_valid.clamp_max(max_num_considered_actions)
    # At the root the simulation index is the sum of visit counts (virtual ones included).
    simulation_index = stats.children_visits.sum(-1).round().long().clamp_max(table.shape[1] - 1)
    considered_visit = table[num_considered, simulation_index].to(stats.children_visits.dtype)
    scores = seq_halving.score_considered(
        considered_visit, gumbel, stats.prior_logits, qtransform(stats), stats.children_visits
    )
    chosen = masked_argmax(scores, stats.invalid)
    # Past the planned budget no action has exactly the considered count: fall back to the
    # interior rule so a resumed search still spreads its visits sensibly.
    # Computed for every tree, not behind a host-side `stuck.any()`: the selection stays free of
    # device-to-host syncs, so a CUDA graph can replay it (mcts.search, graphs).
    stuck = torch.isneginf(scores.masked_fill(stats.invalid, float("-inf")).max(-1).values)
    return torch.where(stuck, gumbel_muzero_interior_action_selection(stats, qtransform=qtransform), chosen)


def gumbel_muzero_interior_action_selection(
    stats: NodeStats,
    generator: torch.Generator | None = None,
    *,
    qtransform: QTransform = qtransform_completed_by_mix_value,
) -> torch.Tensor:
    """Gumbel MuZero interior nodes: argmax_a pi'(a) - N(s, a) / (1 + sum_b N(s, b)).

    pi' = softmax(logits + sigma(completed Q)) is the improved policy; the rule makes visit
    counts track it deterministically.
    """
    del generator
    probs = softmax(stats.prior_logits + qtransform(stats))
    total = stats.children_visits.sum(-1, keepdim=True)
    scores = probs - stats.children_visits / (1.0 + total)
    return masked_argmax(scores, stats.invalid)
