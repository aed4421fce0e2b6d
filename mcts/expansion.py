"""Writing new nodes: expand (one expand_fn call for every selected leaf) and progressive
widening (offering exhausted nodes to widen_fn and writing the new prior logits).

Shapes: B trees, L leaves per iteration, K actions, W widening candidates per tree.
"""

from __future__ import annotations

import torch

from mcts.base import ExpandFn, ExpandOutput, WidenFn, WidenOutput
from mcts.pieces import SelectedPath
from mcts.tree import ROOT_INDEX, UNVISITED, Tree


def _check_expand_output(out: ExpandOutput, b: int, l: int, k: int) -> None:
    if not isinstance(out, ExpandOutput):
        raise TypeError(f"expand_fn must return an mcts.ExpandOutput, got {type(out).__name__}")
    for name in ("reward", "discount", "value", "handle", "terminal"):
        shape = tuple(getattr(out, name).shape)
        if shape != (b, l):
            raise ValueError(f"ExpandOutput.{name} must be [B, L]={(b, l)}, got {shape}")
    if tuple(out.prior_logits.shape) != (b, l, k):
        raise ValueError(f"ExpandOutput.prior_logits must be [B, L, K]={(b, l, k)}, got {tuple(out.prior_logits.shape)}")
    if out.stop is not None and tuple(out.stop.shape) != (b,):
        raise ValueError(f"ExpandOutput.stop must be [B]={b} or None, got {tuple(out.stop.shape)}")


def expand(tree: Tree, expand_fn: ExpandFn, parents: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Call expand_fn once for all (parent, action) pairs and write the new nodes, in place.

    parents, actions, valid: `[B, L]`. Returns `[B, L]` int64 indices of the new nodes
    (UNVISITED where not valid). The new nodes get visits 1 and value = the returned value
    (0 and discount 0 if terminal); their edges stay unvisited until backup.
    """
    return expand_with_stop(tree, expand_fn, parents, actions, valid)[0]


def expand_with_stop(
    tree: Tree, expand_fn: ExpandFn, parents: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """expand(), plus the `[B]` bool of trees the caller stopped (ExpandOutput.stop)."""
    b, l = parents.shape
    k = tree.num_actions
    rows = torch.arange(b, device=tree.device).unsqueeze(-1)
    handles = tree.node_handle[rows, parents]
    out = expand_fn(handles, actions, valid)
    _check_expand_output(out, b, l, k)
    # The caller may compute on another device (a model on GPU, a tree on CPU, or back).
    out = ExpandOutput(
        **{f: None if getattr(out, f) is None else getattr(out, f).to(tree.device) for f in ExpandOutput.__dataclass_fields__}
    )
    stop = torch.zeros(b, dtype=torch.bool, device=tree.device) if out.stop is None else out.stop.bool()
    new_index = tree.num_nodes.unsqueeze(-1) + valid.long().cumsum(1) - 1
    new_index = torch.where(valid, new_index, UNVISITED)
    bi, li = valid.nonzero(as_tuple=True)
    logits = out.prior_logits[bi, li]
    if torch.isnan(logits).any():
        raise ValueError("ExpandOutput.prior_logits holds NaN; use -inf for missing actions")
    value = out.value[bi, li]
    if torch.isnan(value).any():
        raise ValueError("ExpandOutput.value holds NaN")
    _write_nodes(
        tree, bi, new_index[bi, li], parents[bi, li], actions[bi, li], reward=out.reward[bi, li],
        discount=out.discount[bi, li], value=value, logits=logits, terminal=out.terminal[bi, li], handle=out.handle[bi, li],
    )
    tree.num_nodes.add_(valid.long().sum(1))
    return new_index, stop


def expand_dense(
    tree: Tree, expand_fn: ExpandFn, parent: torch.Tensor, action: torch.Tensor, valid: torch.Tensor, nan: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """expand_with_stop() for one leaf per tree (`[B]` parent, action, valid) without asking the device
    anything, so a CUDA graph can hold it: every tree writes one node row and one edge, and a
    tree with nothing to expand rewrites the root's row and its (parent, action) edge unchanged.
    NaN in the output is flagged in `nan` ([2]: logits, value) instead of raised here.
    Returns the `[B]` new node indices (UNVISITED where not valid) and the `[B]` stop flags."""
    b, k, dev = tree.batch_size, tree.num_actions, tree.device
    rows = torch.arange(b, device=dev)
    out = expand_fn(tree.node_handle[rows, parent].unsqueeze(-1), action.unsqueeze(-1), valid.unsqueeze(-1))
    _check_expand_output(out, b, 1, k)
    nan[0] |= (valid & torch.isnan(out.prior_logits[:, 0]).any(-1)).any()
    nan[1] |= (valid & torch.isnan(out.value[:, 0])).any()
    idx = torch.where(valid, tree.num_nodes, ROOT_INDEX)
    _write_nodes(
        tree, rows, idx, parent, action, reward=out.reward[:, 0], discount=out.discount[:, 0], value=out.value[:, 0],
        logits=out.prior_logits[:, 0], terminal=out.terminal[:, 0], handle=out.handle[:, 0], keep=valid,
    )
    tree.num_nodes.add_(valid.long())
    stop = torch.zeros(b, dtype=torch.bool, device=dev) if out.stop is None else out.stop.to(dev).bool()
    return torch.where(valid, idx, UNVISITED), stop


def _write_nodes(
    tree: Tree,
    trees: torch.Tensor,
    idx: torch.Tensor,
    parent: torch.Tensor,
    action: torch.Tensor,
    *,
    reward: torch.Tensor,
    discount: torch.Tensor,
    value: torch.Tensor,
    logits: torch.Tensor,
    terminal: torch.Tensor,
    handle: torch.Tensor,
    keep: torch.Tensor | None = None,
) -> None:
    """Write node `idx[m]` of tree `trees[m]` as the child of (parent[m], action[m]), in place.

    All `[M]` except logits `[M, K]`, on any device (the caller's expand output). The new node
    gets visits 1 and value = `value`; a child that is terminal or has no valid action gets
    value 0 and discount 0. keep: `[M]` bool; where False the same entries are rewritten with
    what they hold, so the writes have fixed shapes (a CUDA graph or a compiled step needs that).
    """
    k, dev, dtype = tree.num_actions, tree.device, tree.node_values.dtype
    logits = logits.to(device=dev, dtype=dtype)
    # A child with no valid action cannot be expanded either: it ends the episode.
    terminal = terminal.to(dev).bool() | torch.isneginf(logits).all(-1)
    value = torch.where(terminal, 0.0, value.to(device=dev, dtype=dtype))
    discount = torch.where(terminal, 0.0, discount.to(device=dev, dtype=dtype))
    row0 = trees * tree.max_nodes
    new_rows, parent_rows = row0 + idx, row0 + parent
    edges = parent_rows * k + action

    # Flattened indices: one put_ per field instead of three-tensor advanced indexing.
    def put(field: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
        values = values.to(device=dev, dtype=field.dtype)
        if keep is not None:
            values = torch.where(keep.view(-1, *([1] * (index.dim() - 1))), values, torch.take(field, index))
        field.put_(index, values)

    put(tree.children_index, edges, idx)
    put(tree.children_rewards, edges, reward)
    put(tree.children_discounts, edges, discount)
    put(tree.parents, new_rows, parent)
    put(tree.action_from_parent, new_rows, action)
    put(tree.depth, new_rows, torch.take(tree.depth, parent_rows) + 1)
    put(tree.node_handle, new_rows, handle)
    put(tree.terminal, new_rows, terminal)
    put(tree.raw_values, new_rows, value)
    put(tree.node_values, new_rows, value)
    put(tree.node_visits, new_rows, torch.ones_like(idx))
    put(tree.children_prior_logits, (new_rows * k).unsqueeze(-1) + torch.arange(k, device=dev), logits)


def exhausted_nodes(tree: Tree) -> torch.Tensor:
    """`[B, N]` bool: nodes in use, not terminal, whose every valid action has a child and
    that still have an invalid slot (room for progressive widening to add an action)."""
    valid = ~torch.isneginf(tree.children_prior_logits)
    expanded = tree.children_index != UNVISITED
    in_use = torch.arange(tree.max_nodes, device=tree.device).unsqueeze(0) < tree.num_nodes.unsqueeze(-1)
    return in_use & ~tree.terminal & valid.any(-1) & (~valid | expanded).all(-1) & (~valid).any(-1)


def widen(tree: Tree, widen_fn: WidenFn, candidates: torch.Tensor) -> torch.Tensor:
    """Offer the `candidates` (`[B, N]` bool) nodes to widen_fn in one call and write the new
    prior logits of the nodes it widened, in place. Returns `[B, N]` bool of widened nodes.

    Candidates are packed per tree in node order into `[B, W]` (W = most candidates of a tree).
    """
    b, k = tree.batch_size, tree.num_actions
    counts = candidates.sum(1)
    w = int(counts.max()) if b else 0
    done = torch.zeros_like(candidates)
    if w == 0:
        return done
    # A stable sort puts each tree's candidates first, in node order.
    order = torch.sort((~candidates).to(torch.int8), dim=1, stable=True).indices[:, :w]
    valid = torch.arange(w, device=tree.device).unsqueeze(0) < counts.unsqueeze(-1)
    rows = torch.arange(b, device=tree.device).unsqueeze(-1).expand(b, w)
    out = widen_fn(tree.node_handle[rows, order], tree.node_visits[rows, order], valid)
    if not isinstance(out, WidenOutput):
        raise TypeError(f"widen_fn must return an mcts.WidenOutput, got {type(out).__name__}")
    if tuple(out.prior_logits.shape) != (b, w, k) or tuple(out.widened.shape) != (b, w):
        raise ValueError(
            f"WidenOutput must hold prior_logits [B, W, K]={(b, w, k)} and widened [B, W]={(b, w)}, got "
            f"{tuple(out.prior_logits.shape)} and {tuple(out.widened.shape)}"
        )
    logits = out.prior_logits.to(device=tree.device, dtype=tree.children_prior_logits.dtype)
    widened = out.widened.to(tree.device).bool() & valid
    if torch.isnan(logits[widened]).any():
        raise ValueError("WidenOutput.prior_logits holds NaN; use -inf for missing actions")
    has_child = tree.children_index[rows, order] != UNVISITED
    if (widened.unsqueeze(-1) & has_child & torch.isneginf(logits)).any():
        raise ValueError("WidenOutput.prior_logits makes an action that already has a child invalid (-inf)")
    r, c = rows[widened], order[widened]
    tree.children_prior_logits[r, c] = logits[widened]
    done[r, c] = True
    return done


def widen_on_paths(tree: Tree, widen_fn: WidenFn, paths: list[SelectedPath], done: torch.Tensor) -> None:
    """Offer widen_fn the exhausted nodes on this iteration's kept paths in trees still searching."""
    if bool(done.all()):
        return
    on_paths = torch.zeros((tree.batch_size, tree.max_nodes), dtype=torch.bool, device=tree.device)
    for path in paths:
        rows = torch.arange(tree.batch_size, device=tree.device).unsqueeze(-1).expand_as(path.path_nodes)
        on_paths[rows[path.path_mask], path.path_nodes[path.path_mask]] = True
    candidates = on_paths & exhausted_nodes(tree) & ~done.unsqueeze(-1)
    if bool(candidates.any()):
        widen(tree, widen_fn, candidates)
