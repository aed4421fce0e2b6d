"""The search loop: select L leaves per tree under virtual loss, expand them in one call, back up.

Every function works on B trees at once; Python loops run over depth and over the L leaves,
never over trees. `search` runs the loop eagerly (`_search_eager`, any L) or, with one leaf per
iteration, through the fixed-step runner (`mcts.fixed_steps`: CUDA graphs or torch.compile via
`mcts.runners`). The walk and climb pieces live in `mcts.pieces`; expansion and widening in
`mcts.expansion`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from mcts.base import ActionSelectionFn, ExpandFn, NodeStats, RootInput, WidenFn
from mcts.expansion import exhausted_nodes, expand, expand_with_stop, widen, widen_on_paths
from mcts.fixed_steps import search_fixed_steps
from mcts.pieces import (
    DROPPED,
    INACTIVE,
    NEW,
    REVISIT,
    SelectedPath,
    VirtualLoss,
    Walk,
    backup,
    climb,
    masked,
    row_offsets,
    start_climb,
    stats_at,
    walk_steps,
)
from mcts.runners import Compiled, CudaGraphs, rule_key
from mcts.tree import NO_HANDLE, NO_PARENT, ROOT_INDEX, UNVISITED, Tree, grow

# Re-exported: the loop's building blocks stay importable from mcts.search.
__all__ = [
    "DROPPED", "INACTIVE", "NEW", "REVISIT", "SelectedPath", "VirtualLoss", "Walk", "add_virtual_loss", "backup",
    "backup_path", "clear_virtual_loss", "climb", "exhausted_nodes", "expand", "init_tree", "node_stats", "search",
    "select_path", "start_climb", "walk_steps", "widen",
]

def _check_root(root: RootInput) -> tuple[int, int]:
    if root.prior_logits.dim() != 2:
        raise ValueError(f"RootInput.prior_logits must be [B, K], got shape {tuple(root.prior_logits.shape)}")
    b, k = root.prior_logits.shape
    if tuple(root.value.shape) != (b,):
        raise ValueError(f"RootInput.value must be [B]={b}, got shape {tuple(root.value.shape)}")
    if tuple(root.handle.shape) != (b,):
        raise ValueError(f"RootInput.handle must be [B]={b}, got shape {tuple(root.handle.shape)}")
    if root.invalid_actions is not None and tuple(root.invalid_actions.shape) != (b, k):
        raise ValueError(
            f"RootInput.invalid_actions must be [B, K]={(b, k)}, got {tuple(root.invalid_actions.shape)}"
        )
    if torch.isnan(root.prior_logits).any() or torch.isnan(root.value).any():
        raise ValueError("RootInput holds NaN in prior_logits or value; use -inf for missing actions")
    return b, k


def init_tree(
    root: RootInput,
    *,
    num_simulations: int,
    max_nodes: int | None = None,
    root_gumbel: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tree:
    """A tree per root with only the root expanded (visits 1, value = root.value).

    num_simulations: the planned budget; sets the default capacity.
    max_nodes: node capacity N per tree; default num_simulations + 1 (one node per simulation).
    root_gumbel: `[B, K]` Gumbel noise kept for Gumbel MuZero's root selection; default zeros.
    device: where the tensors live; default the device of root.prior_logits.
    """
    b, k = _check_root(root)
    if num_simulations < 0:
        raise ValueError(f"num_simulations must be >= 0, got {num_simulations}")
    n = num_simulations + 1 if max_nodes is None else max_nodes
    if n < 1:
        raise ValueError(f"max_nodes must be >= 1 (the root), got {n}")
    device = torch.device(device) if device is not None else root.prior_logits.device
    if root_gumbel is not None and (tuple(root_gumbel.shape) != (b, k) or torch.isnan(root_gumbel).any()):
        raise ValueError(f"root_gumbel must be a [B, K]={(b, k)} tensor without NaN, got {tuple(root_gumbel.shape)}")

    def full(shape, value, dt):
        return torch.full(shape, value, dtype=dt, device=device)

    logits = root.prior_logits.to(device=device, dtype=dtype).clone()
    if root.invalid_actions is not None:
        logits = logits.masked_fill(root.invalid_actions.to(device), float("-inf"))
    tree = Tree(
        node_visits=full((b, n), 0, torch.int64),
        raw_values=full((b, n), 0.0, dtype),
        node_values=full((b, n), 0.0, dtype),
        parents=full((b, n), NO_PARENT, torch.int64),
        action_from_parent=full((b, n), -1, torch.int64),
        depth=full((b, n), 0, torch.int64),
        node_handle=full((b, n), NO_HANDLE, torch.int64),
        terminal=full((b, n), False, torch.bool),
        children_index=full((b, n, k), UNVISITED, torch.int64),
        children_prior_logits=full((b, n, k), float("-inf"), dtype),
        children_visits=full((b, n, k), 0, torch.int64),
        children_rewards=full((b, n, k), 0.0, dtype),
        children_discounts=full((b, n, k), 0.0, dtype),
        children_values=full((b, n, k), 0.0, dtype),
        num_nodes=full((b,), 1, torch.int64),
        root_gumbel=(
            full((b, k), 0.0, dtype) if root_gumbel is None else root_gumbel.to(device=device, dtype=dtype)
        ),
    )
    value = root.value.to(device=device, dtype=dtype)
    tree.node_visits[:, ROOT_INDEX] = 1
    tree.raw_values[:, ROOT_INDEX] = value
    tree.node_values[:, ROOT_INDEX] = value
    tree.node_handle[:, ROOT_INDEX] = root.handle.to(device=device, dtype=torch.int64)
    tree.children_prior_logits[:, ROOT_INDEX] = logits
    # A root without any valid action cannot be searched: it is marked terminal.
    tree.terminal[:, ROOT_INDEX] = torch.isneginf(logits).all(dim=-1)
    return tree


def node_stats(tree: Tree, node_index: torch.Tensor, virtual_loss: VirtualLoss | None = None) -> NodeStats:
    """The NodeStats of node `node_index[b]` ([B]) of every tree, with virtual loss applied.

    A virtual visit counts as one visit whose Q is the lowest value seen at the node, so
    pending paths look worse and other leaves get selected.
    """
    return stats_at(tree, row_offsets(tree) + node_index, virtual_loss)


def select_path(
    tree: Tree,
    *,
    root_action_selection_fn: ActionSelectionFn,
    interior_action_selection_fn: ActionSelectionFn,
    active: torch.Tensor,
    max_depth: int | None = None,
    generator: torch.Generator | None = None,
    virtual_loss: VirtualLoss | None = None,
    steps: int | None = None,
) -> SelectedPath:
    """Walk every active tree from the root to a leaf, choosing actions with the given rules.

    The walk stops at an unexpanded edge (NEW), at an existing leaf that is terminal or at
    max_depth (REVISIT), or at a node whose every action is invalid or pending (DROPPED).
    active: `[B]` bool, trees that search in this slot.
    steps: take exactly this many steps (at least the longest walk: the deepest node's depth
      + 1) instead of stopping when every walk has ended, which asks the device each step. The
      extra steps change nothing but draw tie-break noise.
    """
    walk = Walk.start(tree, active)
    steps_taken = walk_steps(
        tree, walk, root_action_selection_fn=root_action_selection_fn,
        interior_action_selection_fn=interior_action_selection_fn, max_depth=max_depth,
        generator=generator, virtual_loss=virtual_loss, steps=steps,
    )
    return walk.path(*steps_taken)


def add_virtual_loss(virtual_loss: VirtualLoss, path: SelectedPath) -> None:
    """Add one virtual traversal of each tree's path (where path_mask is True), in place."""
    rows = torch.arange(path.status.shape[0], device=path.status.device)
    for d in range(path.path_nodes.shape[1]):
        n, a = path.path_nodes[:, d], path.path_actions[:, d]
        amount = virtual_loss.amount * path.path_mask[:, d].to(virtual_loss.edge_visits.dtype)
        # Each tree writes one distinct row, so plain indexed assignment has no duplicates.
        virtual_loss.edge_visits[rows, n, a] = virtual_loss.edge_visits[rows, n, a] + amount
        virtual_loss.node_visits[rows, n] = virtual_loss.node_visits[rows, n] + amount


def clear_virtual_loss(virtual_loss: VirtualLoss, path: SelectedPath) -> None:
    """Zero the virtual visits on each tree's path (exact, unlike subtracting floats), in place."""
    rows = torch.arange(path.status.shape[0], device=path.status.device)
    for d in range(path.path_nodes.shape[1]):
        n, a, keep = path.path_nodes[:, d], path.path_actions[:, d], path.path_mask[:, d]
        virtual_loss.edge_visits[rows, n, a] = torch.where(keep, 0.0, virtual_loss.edge_visits[rows, n, a])
        virtual_loss.node_visits[rows, n] = torch.where(keep, 0.0, virtual_loss.node_visits[rows, n])


def backup_path(tree: Tree, path: SelectedPath, leaf_index: torch.Tensor, active: torch.Tensor) -> None:
    """backup() along a path already known from select_path, vectorised over depth, in place.

    Gives exactly the tensors backup() gives; the search uses it because it costs a fixed
    number of tensor ops instead of a dozen per level. leaf_index, active: `[B]`.
    """
    mask = path.path_mask & active.unsqueeze(-1)
    if path.path_nodes.shape[1] == 0 or not bool(mask.any()):
        return
    k = tree.num_actions
    offsets = row_offsets(tree)
    nodes = offsets.unsqueeze(-1) + path.path_nodes  # [B, D] rows in the flattened [B * N] tensors
    edges = nodes * k + path.path_actions  # [B, D] entries in the flattened [B * N * K] tensors
    reward = torch.take(tree.children_rewards, edges)
    discount = torch.take(tree.children_discounts, edges)
    # Inactive trees hold UNVISITED here; their steps are masked out below.
    leaf = (offsets + leaf_index.clamp_min(0)).unsqueeze(-1)
    value = torch.take(tree.node_values, leaf[:, 0])
    # The reverse scan G = r + discount * G over unbound columns: three ops per step.
    returns = []
    for m, r, dsc in zip(*(t.unbind(1)[::-1] for t in (mask, reward, discount))):
        value = torch.where(m, r + dsc * value, value)
        returns.append(value)
    returns = torch.stack(returns[::-1], 1)
    # The child of step j is the node of step j + 1, or the leaf after the path's last step.
    child = torch.cat([nodes[:, 1:], leaf], 1)
    child = torch.where(torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1), child, leaf)
    # Steps past a path's end repeat its last node: keep only real steps so indices are unique.
    n, e, c, g = nodes[mask], edges[mask], child[mask], returns[mask]
    count = torch.take(tree.node_visits, n)
    tree.node_values.put_(n, (torch.take(tree.node_values, n) * count + g) / (count + 1))
    tree.node_visits.put_(n, count + 1)
    tree.children_values.put_(e, torch.take(tree.node_values, c))
    tree.children_visits.put_(e, torch.take(tree.children_visits, e) + 1)


def search(
    tree: Tree,
    expand_fn: ExpandFn,
    *,
    root_action_selection_fn: ActionSelectionFn,
    interior_action_selection_fn: ActionSelectionFn,
    num_simulations: int,
    max_depth: int | None = None,
    max_nodes: int | None = None,
    leaves_per_iteration: int = 1,
    min_leaves: int = 0,
    virtual_loss: float = 1.0,
    generator: torch.Generator | None = None,
    widen_fn: WidenFn | None = None,
    graphs: bool | None = None,
    compiled: bool = False,
    compile_options: dict[str, Any] | None = None,
) -> Tree:
    """Run `num_simulations` more simulations in every tree; returns the (possibly grown) tree.

    Each iteration selects up to `leaves_per_iteration` (L) paths per tree, each seeing the
    virtual loss of the earlier ones, expands all new leaves in one expand_fn call, then backs
    the L leaf values up in order. A path that reaches a terminal or max-depth leaf backs up
    that leaf's value again without expanding. An unexpanded edge chosen earlier in the
    iteration cannot be chosen again, so the new leaves are distinct; a path that finds no
    selectable action is dropped and does not count.

    max_depth: deepest node depth; nodes there are leaves (None: unbounded).
    max_nodes: node capacity; default grows the tree to fit every simulation. A tree that is
      full stops early.
    min_leaves: with L > 1, each iteration selects ceil(min_leaves / searching trees) paths per
      searching tree, at least 1 and at most L, so one expand call keeps about min_leaves new
      leaves while trees finish, and a batch of many trees still takes one leaf each (0: L
      paths per tree in every iteration, as without it).
    virtual_loss: virtual visits added per pending traversal (only used when L > 1).
    generator: torch.Generator on the tree's device for tie-breaking; seeds the search.
    widen_fn: progressive widening (see WidenFn); after each iteration's backups it is offered
      the exhausted nodes on that iteration's paths in trees still searching. Default: the
      expand function's `widen` attribute when it has one, else no widening.
    A tree also stops when the expand function returns ExpandOutput.stop True for it.
    graphs: with L = 1, run each iteration's selection and backup as CUDA graphs, captured once
      per walk length and replayed, or whole iterations when the expand function is
      `graph_safe` (`mcts.fixed_steps`): one replay instead of hundreds of kernel launches.
      Default: on when the tree is on CUDA and L = 1. True on CPU runs the same fixed-step loop
      without capture (what the tests check). Same rules and same trees, except that tie-break
      noise is drawn for a fixed number of steps: where a rule ties exactly (UCT's unvisited
      children) the random choice can differ from the eager loop's.
    compiled: run the fixed-step loop through torch.compile (`mcts.runners.Compiled`; C++ on
      CPU, Triton kernels on CUDA, without CUDA graphs):
      whole iterations when the expand function is `graph_safe` and nothing widens, else the
      selection and the backup with the expand function eagerly between them. Same rules and,
      on CPU, the same tie-break noise (on CUDA it is drawn in one flat call, other numbers, so
      exact ties can break another way); the fused arithmetic can round differently from ATen's in the
      last bit, so a near-tied selection could go the other way (none did in
      benchmarks/probe_mcts_compiled.py), and the generated code depends on the CPU. Each new
      walk length and batch shape costs a compilation (then cached
      on disk), so it pays on long or repeated searches. Needs L = 1.
    compile_options: inductor options added to `Compiled.options` for compiled=True
      (gumbel_muzero_policy passes `max_fusion_size=8` on CUDA, docs/mcts.md).
    """
    if widen_fn is None:
        widen_fn = getattr(expand_fn, "widen", None)
    if num_simulations < 0:
        raise ValueError(f"num_simulations must be >= 0, got {num_simulations}")
    if leaves_per_iteration < 1:
        raise ValueError(f"leaves_per_iteration must be >= 1, got {leaves_per_iteration}")
    if min_leaves < 0:
        raise ValueError(f"min_leaves must be >= 0, got {min_leaves}")
    if max_depth is not None and max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    capacity = int(tree.num_nodes.max()) + num_simulations if max_nodes is None else max_nodes
    tree = grow(tree, capacity)
    b, n, k = tree.batch_size, tree.max_nodes, tree.num_actions
    big_l = leaves_per_iteration
    target = tree.num_simulations + num_simulations
    done = tree.terminal[:, ROOT_INDEX] | (tree.num_simulations >= target)
    if graphs is None:
        graphs = tree.device.type == "cuda" and big_l == 1
    if graphs or compiled:
        if big_l != 1:
            raise ValueError(f"graphs=True and compiled=True need leaves_per_iteration=1, got {big_l}")
        replay = (
            Compiled(generator, b, k, (n, rule_key(root_action_selection_fn), rule_key(interior_action_selection_fn)),
                     rule_calls={"iterate": UNROLL, "select": 1, "backup": 0, "walk_first": 1, "walk_more": 1,
                                 "climb_first": 0, "climb_more": 0, "expand_climb": 0,
                                 "walk_expand_climb": 1}, device=tree.device,
                     extra_options=compile_options)
            if compiled else CudaGraphs(generator) if tree.device.type == "cuda" else None
        )
        with replay.settings() if isinstance(replay, Compiled) else contextlib.nullcontext():
            search_fixed_steps(
                tree, expand_fn, walk_fn=functools.partial(
                    walk_steps, root_action_selection_fn=root_action_selection_fn,
                    interior_action_selection_fn=interior_action_selection_fn, max_depth=max_depth,
                ), done=done, target=target, max_depth=max_depth, widen_fn=widen_fn, generator=generator,
                replay=replay, step_bucket=STEP_BUCKET, unroll=UNROLL, long_walk=LONG_WALK, piece_steps=PIECE,
            )
        return tree
    _search_eager(
        tree, expand_fn, root_action_selection_fn=root_action_selection_fn,
        interior_action_selection_fn=interior_action_selection_fn, done=done, target=target, max_depth=max_depth,
        leaves_per_iteration=big_l, min_leaves=min_leaves, virtual_loss=virtual_loss, generator=generator,
        widen_fn=widen_fn,
    )
    return tree


def _search_eager(
    tree: Tree,
    expand_fn: ExpandFn,
    *,
    root_action_selection_fn: ActionSelectionFn,
    interior_action_selection_fn: ActionSelectionFn,
    done: torch.Tensor,
    target: torch.Tensor,
    max_depth: int | None,
    leaves_per_iteration: int,
    virtual_loss: float,
    generator: torch.Generator | None,
    widen_fn: WidenFn | None,
    min_leaves: int = 0,
) -> None:
    """search()'s eager runner, in place: L = leaves_per_iteration paths per tree and iteration
    under virtual loss, one expand call, L backups along the known paths, then widening.
    done: `[B]` bool, trees that no longer search (updated in place); target: `[B]` int64,
    the root visits at which a tree stops; min_leaves as search()'s."""
    b, n, k = tree.batch_size, tree.max_nodes, tree.num_actions
    big_l = leaves_per_iteration
    vl = None
    if big_l > 1:
        vl = VirtualLoss(
            edge_visits=torch.zeros((b, n, k), dtype=tree.node_values.dtype, device=tree.device),
            node_visits=torch.zeros((b, n), dtype=tree.node_values.dtype, device=tree.device),
            amount=virtual_loss,
        )
    while not bool(done.all()):
        sims = tree.num_simulations
        counted = torch.zeros(b, dtype=torch.int64, device=tree.device)
        n_new = torch.zeros(b, dtype=torch.int64, device=tree.device)
        paths: list[SelectedPath] = []
        new_masks, revisit_masks = [], []
        leaves = big_l
        if min_leaves and big_l > 1:
            searching = max(1, int((~done).sum()))
            leaves = min(big_l, max(1, -(-min_leaves // searching)))
        for _ in range(leaves):
            active = ~done & (sims + counted < target)
            path = select_path(
                tree,
                root_action_selection_fn=root_action_selection_fn,
                interior_action_selection_fn=interior_action_selection_fn,
                active=active,
                max_depth=max_depth,
                generator=generator,
                virtual_loss=vl,
            )
            is_new = path.status == NEW
            for earlier, earlier_new in zip(paths, new_masks):
                same_edge = earlier_new & (earlier.parent == path.parent) & (earlier.action == path.action)
                is_new = is_new & ~same_edge
            is_new = is_new & (tree.num_nodes + n_new < n)
            is_revisit = path.status == REVISIT
            if vl is not None:
                add_virtual_loss(vl, masked(path, is_new | is_revisit))
            counted += (is_new | is_revisit).long()
            n_new += is_new.long()
            paths.append(path)
            new_masks.append(is_new)
            revisit_masks.append(is_revisit)
        # A searching tree whose every path was dropped is full: it stops.
        done = done | (~done & (counted == 0))
        valid = torch.stack(new_masks, 1)
        new_index = torch.full((b, leaves), UNVISITED, dtype=torch.int64, device=tree.device)
        stopped = torch.zeros(b, dtype=torch.bool, device=tree.device)
        if bool(valid.any()):
            parents = torch.stack([p.parent for p in paths], 1)
            actions = torch.stack([p.action for p in paths], 1)
            new_index, stopped = expand_with_stop(tree, expand_fn, parents, actions, valid)
        for j, path in enumerate(paths):
            if vl is not None:
                clear_virtual_loss(vl, masked(path, new_masks[j] | revisit_masks[j]))
            leaf = torch.where(new_masks[j], new_index[:, j], path.leaf)
            revisit = revisit_masks[j]
            if bool(revisit.any()):
                rows = torch.arange(b, device=tree.device)
                safe = leaf.clamp_min(0)
                tree.node_visits[rows, safe] = tree.node_visits[rows, safe] + revisit.long()
            backup_path(tree, path, leaf, new_masks[j] | revisit)
        done = done | stopped | (tree.num_simulations >= target)
        if widen_fn is not None:
            widen_on_paths(tree, widen_fn, [masked(p, new_masks[j] | revisit_masks[j]) for j, p in enumerate(paths)], done)


# The fixed-step runner's settings, read at each search (tests and benchmarks set them here).
STEP_BUCKET = 4  # walk lengths are rounded up to a multiple of this: fewer graphs to capture
UNROLL = 2  # iterations per graph when the expand function is graph-safe
# Walks and climbs longer than LONG_WALK steps run as repeated pieces of PIECE steps, asking the
# host after each whether one is still going. Unrolled, each walk length was its own graph, and
# on deep trees compiling those took longer than searching (docs/mcts.md); 8 keeps the depth-6
# benchmark and few-step tool-use trees whole. A single tree (B = 1) keeps whole walks up to
# twice that: no other tree's longer walk makes it take extra steps, and at B = 1 the host
# round trips of pieces cost more than the steps (3.2x the time per simulation at depth 64).
LONG_WALK = 8
PIECE = 8
