"""Sequential Halving at the root of Gumbel MuZero (Danihelka et al. 2022), as in mctx."""

from __future__ import annotations

import functools
import math

import torch

# Floor of the scores, so that the invalid-action penalty alone decides among -inf logits.
LOW_LOGIT = -1e9


def score_considered(
    considered_visit: torch.Tensor,
    gumbel: torch.Tensor,
    logits: torch.Tensor,
    normalized_qvalues: torch.Tensor,
    visit_counts: torch.Tensor,
) -> torch.Tensor:
    """`[B, K]` g(a) + logits(a) + sigma(Q(a)), -inf for actions whose visits != considered_visit.

    considered_visit: `[B]` or `[B, 1]`; the other arguments `[B, K]`.
    """
    if considered_visit.dim() == 1:
        considered_visit = considered_visit.unsqueeze(-1)
    logits = logits - logits.max(-1, keepdim=True).values
    penalty = torch.where(
        visit_counts == considered_visit, torch.zeros_like(logits), torch.full_like(logits, float("-inf"))
    )
    return torch.clamp(gumbel + logits + normalized_qvalues, min=LOW_LOGIT) + penalty


def get_sequence_of_considered_visits(max_num_considered_actions: int, num_simulations: int) -> tuple[int, ...]:
    """The visit count an action must have to be considered, for each simulation index.

    Sequential halving spreads num_simulations over phases; each phase visits every considered
    action equally, then keeps the better half (never fewer than 2).
    """
    if max_num_considered_actions <= 1:
        return tuple(range(num_simulations))
    log2max = math.ceil(math.log2(max_num_considered_actions))
    sequence: list[int] = []
    visits = [0] * max_num_considered_actions
    num_considered = max_num_considered_actions
    while len(sequence) < num_simulations:
        num_extra_visits = max(1, int(num_simulations / (log2max * num_considered)))
        for _ in range(num_extra_visits):
            sequence.extend(visits[:num_considered])
            for i in range(num_considered):
                visits[i] += 1
        num_considered = max(2, num_considered // 2)
    return tuple(sequence[:num_simulations])


@functools.lru_cache(maxsize=64)
def _table(max_num_considered_actions: int, num_simulations: int) -> tuple[tuple[int, ...], ...]:
    return tuple(
        get_sequence_of_considered_visits(m, num_simulations) for m in range(max_num_considered_actions + 1)
    )


def get_table_of_considered_visits(
    max_num_considered_actions: int, num_simulations: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """`[max_num_considered_actions + 1, num_simulations]` int64: row m is the sequence for m actions.

    Cached per device: the root rule asks for it at every selection. Do not modify it.
    """
    if torch.compiler.is_compiling():
        # A constant of the compiled graph; dynamo would trace through the caches anyway (and warn).
        table = _table.__wrapped__(max_num_considered_actions, num_simulations)
        return torch.tensor(table, dtype=torch.int64, device=device)
    return _table_tensor(max_num_considered_actions, num_simulations, str(torch.device(device)))


@functools.lru_cache(maxsize=64)
def _table_tensor(max_num_considered_actions: int, num_simulations: int, device: str) -> torch.Tensor:
    return torch.tensor(_table(max_num_considered_actions, num_simulations), dtype=torch.int64, device=device)
