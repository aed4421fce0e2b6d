"""Public entry points: one call runs a whole search and proposes an action, as in mctx.

Each policy takes a RootInput (a fresh search) or a Tree (resume: run more simulations on it;
root noise is not drawn again) and returns a PolicyOutput.
"""

from __future__ import annotations

import functools

import torch

from mcts import action_selection, seq_halving
from mcts.action_selection import C_EXP, PB_C_BASE, PB_C_INIT, QTransform
from mcts.base import ExpandFn, PolicyOutput, RootInput, WidenFn
from mcts.qtransforms import (
    qtransform_by_parent_and_siblings,
    qtransform_completed_by_mix_value,
)
from mcts.search import init_tree, node_stats, search
from mcts.tree import ROOT_INDEX, SearchSummary, Tree, summary

# AlphaZero's root noise: 25% of the prior replaced by Dirichlet(0.3) noise.
DIRICHLET_FRACTION = 0.25
DIRICHLET_ALPHA = 0.3
# Gumbel MuZero: actions sampled without replacement at the root (the paper's m = 16).
MAX_NUM_CONSIDERED_ACTIONS = 16


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A torch.Generator on `device` seeded with `seed`: same seed, same search."""
    return torch.Generator(device=device).manual_seed(seed)


def add_dirichlet_noise(
    prior_logits: torch.Tensor,
    generator: torch.Generator | None,
    *,
    dirichlet_fraction: float = DIRICHLET_FRACTION,
    dirichlet_alpha: float = DIRICHLET_ALPHA,
) -> torch.Tensor:
    """`[B, K]` logits of (1 - fraction) * softmax(prior_logits) + fraction * Dirichlet(alpha).

    The noise covers only valid actions (finite logits); invalid ones stay -inf.
    """
    invalid = torch.isneginf(prior_logits)
    alpha = torch.full_like(prior_logits, dirichlet_alpha)
    # Dirichlet sampled as normalised Gamma draws: torch's Gamma sampler takes a generator.
    gamma = torch._standard_gamma(alpha, generator=generator).masked_fill(invalid, 0.0)
    noise = gamma / gamma.sum(-1, keepdim=True).clamp_min(torch.finfo(gamma.dtype).tiny)
    probs = (1.0 - dirichlet_fraction) * torch.softmax(prior_logits, -1) + dirichlet_fraction * noise
    logits = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))
    return logits.masked_fill(invalid, float("-inf"))


def _start(
    root: RootInput | Tree, num_simulations: int, max_nodes: int | None, device, gumbel: torch.Tensor | None = None
) -> Tree:
    if isinstance(root, Tree):
        return root if device is None else root.to(device)
    return init_tree(root, num_simulations=num_simulations, max_nodes=max_nodes, root_gumbel=gumbel, device=device)


def _apply_temperature(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))
    return (logits - logits.max(-1, keepdim=True).values) / temperature


def _no_action_where_unsearchable(tree: Tree, action: torch.Tensor) -> torch.Tensor:
    """-1 for roots without any valid action (nothing can be proposed there)."""
    return torch.where(tree.terminal[:, ROOT_INDEX], -1, action)


def _visit_policy(tree: Tree, temperature: float, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Action sampled from the root visit counts (argmax if temperature == 0) and the weights."""
    stats: SearchSummary = summary(tree)
    weights = stats.visit_probs
    invalid = torch.isneginf(tree.children_prior_logits[:, ROOT_INDEX])
    if temperature == 0.0:
        action = stats.visit_counts.masked_fill(invalid, -1).argmax(-1)
    else:
        probs = torch.softmax(_apply_temperature(weights, temperature), -1).masked_fill(invalid, 0.0)
        # Rows with nothing to sample (no valid action) get a placeholder; they answer -1.
        probs = torch.where(probs.sum(-1, keepdim=True) > 0, probs, torch.ones_like(probs))
        action = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return _no_action_where_unsearchable(tree, action), weights


def muzero_policy(
    root: RootInput | Tree,
    expand_fn: ExpandFn,
    *,
    num_simulations: int,
    seed: int = 0,
    max_depth: int | None = None,
    max_nodes: int | None = None,
    leaves_per_iteration: int = 1,
    min_leaves: int = 0,
    virtual_loss: float = 1.0,
    dirichlet_fraction: float = DIRICHLET_FRACTION,
    dirichlet_alpha: float = DIRICHLET_ALPHA,
    pb_c_init: float = PB_C_INIT,
    pb_c_base: float = PB_C_BASE,
    qtransform: QTransform = qtransform_by_parent_and_siblings,
    temperature: float = 1.0,
    device: torch.device | str | None = None,
    widen_fn: WidenFn | None = None,
    graphs: bool | None = None,
    compiled: bool = False,
) -> PolicyOutput:
    """PUCT search (AlphaZero/MuZero) with Dirichlet root noise; acts by root visit counts.

    dirichlet_fraction=0 disables root noise. temperature applies to the visit distribution
    the action is sampled from (0: most visited). action_weights are the visit probabilities.
    widen_fn: progressive widening (mcts.WidenFn; default: expand_fn.widen if it has one).
    Widening the root replaces its logits, root noise included.
    graphs: CUDA graphs for selection and backup (mcts.search; default on for CUDA with L = 1).
    compiled: on CPU, the same fixed-step loop through torch.compile (mcts.search).
    min_leaves: with leaves_per_iteration L > 1, leaves per iteration across the batch to keep
      while trees finish (mcts.search; 0: L per tree always).
    """
    tree = _start(root, num_simulations, max_nodes, device)
    generator = make_generator(seed, tree.device)
    if not isinstance(root, Tree) and dirichlet_fraction > 0:
        tree.children_prior_logits[:, ROOT_INDEX] = add_dirichlet_noise(
            tree.children_prior_logits[:, ROOT_INDEX],
            generator,
            dirichlet_fraction=dirichlet_fraction,
            dirichlet_alpha=dirichlet_alpha,
        )
    select = functools.partial(
        action_selection.puct_action_selection, pb_c_init=pb_c_init, pb_c_base=pb_c_base, qtransform=qtransform
    )
    tree = search(
        tree,
        expand_fn,
        root_action_selection_fn=select,
        interior_action_selection_fn=select,
        num_simulations=num_simulations,
        max_depth=max_depth,
        max_nodes=max_nodes,
        leaves_per_iteration=leaves_per_iteration,
        min_leaves=min_leaves,
        virtual_loss=virtual_loss,
        generator=generator,
        widen_fn=widen_fn,
        graphs=graphs,
        compiled=compiled,
    )
    action, weights = _visit_policy(tree, temperature, generator)
    return PolicyOutput(action=action, action_weights=weights, search_tree=tree)


def uct_policy(
    root: RootInput | Tree,
    expand_fn: ExpandFn,
    *,
    num_simulations: int,
    seed: int = 0,
    max_depth: int | None = None,
    max_nodes: int | None = None,
    leaves_per_iteration: int = 1,
    min_leaves: int = 0,
    virtual_loss: float = 1.0,
    c_exp: float = C_EXP,
    qtransform: QTransform = qtransform_by_parent_and_siblings,
    temperature: float = 1.0,
    device: torch.device | str | None = None,
    widen_fn: WidenFn | None = None,
    graphs: bool | None = None,
    compiled: bool = False,
) -> PolicyOutput:
    """UCT search as in Agent Q (eq. 7); acts by root visit counts like muzero_policy."""
    tree = _start(root, num_simulations, max_nodes, device)
    generator = make_generator(seed, tree.device)
    select = functools.partial(action_selection.uct_action_selection, c_exp=c_exp, qtransform=qtransform)
    tree = search(
        tree,
        expand_fn,
        root_action_selection_fn=select,
        interior_action_selection_fn=select,
        num_simulations=num_simulations,
        max_depth=max_depth,
        max_nodes=max_nodes,
        leaves_per_iteration=leaves_per_iteration,
        min_leaves=min_leaves,
        virtual_loss=virtual_loss,
        generator=generator,
        widen_fn=widen_fn,
        graphs=graphs,
        compiled=compiled,
    )
    action, weights = _visit_policy(tree, temperature, generator)
    return PolicyOutput(action=action, action_weights=weights, search_tree=tree)


def gumbel_muzero_policy(
    root: RootInput | Tree,
    expand_fn: ExpandFn,
    *,
    num_simulations: int,
    seed: int = 0,
    max_depth: int | None = None,
    max_nodes: int | None = None,
    leaves_per_iteration: int = 1,
    min_leaves: int = 0,
    virtual_loss: float = 1.0,
    max_num_considered_actions: int = MAX_NUM_CONSIDERED_ACTIONS,
    gumbel_scale: float = 1.0,
    qtransform: QTransform = qtransform_completed_by_mix_value,
    device: torch.device | str | None = None,
    widen_fn: WidenFn | None = None,
    graphs: bool | None = None,
    compiled: bool = False,
) -> PolicyOutput:
    """Gumbel MuZero (Danihelka et al. 2022): Sequential Halving with Gumbel at the root.

    The action is the best of the most visited considered actions by g + logits + sigma(Q);
    action_weights = softmax(logits + sigma(completed Q)), the improved policy.
    gumbel_scale: 0 turns the root into deterministic top-m selection.
    """
    device = device if device is not None else (root.device if isinstance(root, Tree) else root.prior_logits.device)
    generator = make_generator(seed, device)
    gumbel = None
    if not isinstance(root, Tree):
        uniform = torch.rand(root.prior_logits.shape, generator=generator, device=device)
        tiny = torch.finfo(uniform.dtype).tiny
        neg_log_u = (-torch.log(uniform.clamp_min(tiny))).clamp_min(tiny)
        gumbel = -gumbel_scale * torch.log(neg_log_u)
    tree = _start(root, num_simulations, max_nodes, device, gumbel)
    # Sequential Halving plans for every simulation the tree will have after this call.
    budget = int(tree.num_simulations.max()) + num_simulations
    root_select = functools.partial(
        action_selection.gumbel_muzero_root_action_selection,
        gumbel=tree.root_gumbel,
        num_simulations=budget,
        max_num_considered_actions=max_num_considered_actions,
        qtransform=qtransform,
    )
    interior_select = functools.partial(
        action_selection.gumbel_muzero_interior_action_selection, qtransform=qtransform
    )
    tree = search(
        tree,
        expand_fn,
        root_action_selection_fn=root_select,
        interior_action_selection_fn=interior_select,
        num_simulations=num_simulations,
        max_depth=max_depth,
        max_nodes=max_nodes,
        leaves_per_iteration=leaves_per_iteration,
        min_leaves=min_leaves,
        virtual_loss=virtual_loss,
        generator=generator,
        widen_fn=widen_fn,
        graphs=graphs,
        compiled=compiled,
        # Triton could not build (or took minutes over) the one fused kernel inductor makes of a
        # whole Gumbel iteration on CUDA; fused groups of at most 8 nodes build (docs/mcts.md).
        compile_options={"max_fusion_size": 8} if tree.device.type == "cuda" else None,
    )
    root_index = torch.full((tree.batch_size,), ROOT_INDEX, dtype=torch.int64, device=tree.device)
    stats = node_stats(tree, root_index)
    completed_q = qtransform(stats)
    considered_visit = stats.children_visits.max(-1).values
    scores = seq_halving.score_considered(
        considered_visit, tree.root_gumbel, stats.prior_logits, completed_q, stats.children_visits
    )
    action = _no_action_where_unsearchable(tree, action_selection.masked_argmax(scores, stats.invalid))
    weights = torch.softmax((stats.prior_logits + completed_q).masked_fill(stats.invalid, float("-inf")), -1)
    # A root without any valid action has no policy to improve: its weights are all zero.
    weights = torch.nan_to_num(weights, nan=0.0)
    return PolicyOutput(action=action, action_weights=weights, search_tree=tree)
