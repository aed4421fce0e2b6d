"""The search loop: select L leaves per tree under virtual loss, expand them in one call, back up.

Every function works on B trees at once; Python loops run over depth and over the L leaves,
never over trees.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mcts.base import ActionSelectionFn, ExpandFn, ExpandOutput, NodeStats, RootInput, WidenFn, WidenOutput
from mcts.runners import Compiled, CudaGraphs, rule_key
from mcts.tree import NO_HANDLE, NO_PARENT, ROOT_INDEX, UNVISITED, Tree, grow

# Selection outcomes, one per tree, in SelectedPath.status.
INACTIVE = 0  # the tree did not search in this slot (budget spent, root terminal)
NEW = 1  # the path ends on an unexpanded edge (parent, action): expand it
REVISIT = 2  # the path ends on an existing leaf that is never expanded (terminal or max depth)
# The path found nothing to select (every action pending), or its new node does not fit.
DROPPED = 3


@dataclass(frozen=True)
class SelectedPath:
    """One root-to-leaf path per tree.

    status: `[B]` int64, INACTIVE, NEW, REVISIT or DROPPED.
    parent: `[B]` int64, node the last action was taken from.
    action: `[B]` int64, the last action.
    leaf: `[B]` int64, the existing leaf reached (REVISIT), else UNVISITED.
    path_nodes: `[B, D]` int64, nodes the path left, root first (D = longest path of the batch).
    path_actions: `[B, D]` int64, action taken at each of them.
    path_mask: `[B, D]` bool, True where the step belongs to the tree's path.
    """

    status: torch.Tensor
    parent: torch.Tensor
    action: torch.Tensor
    leaf: torch.Tensor
    path_nodes: torch.Tensor
    path_actions: torch.Tensor
    path_mask: torch.Tensor


@dataclass
class VirtualLoss:
    """Pending visits of the current iteration, cleared after its backups.

    edge_visits: `[B, N, K]` float, virtual visits on each edge.
    node_visits: `[B, N]` float, virtual visits on each node (sum over its edges).
    amount: virtual visits added per traversal; each counts as the node's lowest value.
    """

    edge_visits: torch.Tensor
    node_visits: torch.Tensor
    amount: float


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
    return _stats_at(tree, _row_offsets(tree) + node_index, virtual_loss)


def _row_offsets(tree: Tree) -> torch.Tensor:
    """`[B]` b * N: added to a node index, the row of node (b, n) in a tensor flattened to [B * N, ...]."""
    return torch.arange(tree.batch_size, device=tree.device) * tree.max_nodes


def _take(tree: Tree, name: str, flat: torch.Tensor) -> torch.Tensor:
    """Rows `flat` ([B]) of field `name` flattened to [B * N, ...] (Tree.rows): gather_nodes with
    the index computed once per node instead of once per field (each tensor op is the cost here)."""
    return tree.rows(name).index_select(0, flat)


def _stats_at(tree: Tree, flat: torch.Tensor, virtual_loss: VirtualLoss | None) -> NodeStats:
    """node_stats() of the nodes at flattened rows `flat` ([B], from _row_offsets)."""
    dtype = tree.node_values.dtype
    logits = _take(tree, "children_prior_logits", flat)
    counts = _take(tree, "children_visits", flat).to(dtype)
    q = _take(tree, "children_rewards", flat) + _take(tree, "children_discounts", flat) * _take(tree, "children_values", flat)
    value = _take(tree, "node_values", flat)
    visits = _take(tree, "node_visits", flat).to(dtype)
    invalid = torch.isneginf(logits)
    if virtual_loss is not None:
        pending = virtual_loss.edge_visits.flatten(0, 1).index_select(0, flat)
        # An unexpanded edge already chosen this iteration is blocked: L leaves stay distinct.
        invalid = invalid | ((pending > 0) & (_take(tree, "children_index", flat) == UNVISITED))
        visited = counts > 0
        low = torch.minimum(value, torch.where(visited, q, value.unsqueeze(-1)).min(-1).values).unsqueeze(-1)
        total = counts + pending
        q = torch.where(pending > 0, (q * counts + low * pending) / total.clamp_min(1e-12), q)
        counts = total
        visits = visits + virtual_loss.node_visits.flatten(0, 1).index_select(0, flat)
    return NodeStats(
        depth=_take(tree, "depth", flat),
        visits=visits,
        value=value,
        raw_value=_take(tree, "raw_values", flat),
        prior_logits=logits,
        children_visits=counts,
        qvalues=q,
        invalid=invalid,
    )


@dataclass
class Walk:
    """select_path's loop state, `[B]` each, so that a long walk can run as fixed-length pieces
    (`_search_static` compiles one piece rather than one graph per walk length).

    node: where each walk stands; running: still walking; parent, action: the last step taken;
    leaf: the existing leaf a REVISIT walk ended on; dropped, new, revisit: how walks ended.
    """

    node: torch.Tensor
    running: torch.Tensor
    parent: torch.Tensor
    action: torch.Tensor
    leaf: torch.Tensor
    dropped: torch.Tensor
    new: torch.Tensor
    revisit: torch.Tensor

    @classmethod
    def start(cls, tree: Tree, active: torch.Tensor) -> Walk:
        """Every active tree at its root (unless the root is terminal)."""
        node = torch.full((tree.batch_size,), ROOT_INDEX, dtype=torch.int64, device=tree.device)
        running = active & ~tree.terminal[:, ROOT_INDEX]
        return cls(node, running, node.clone(), torch.zeros_like(node), torch.full_like(node, UNVISITED),
                   *(torch.zeros_like(running) for _ in range(3)))

    def path(self, nodes: list[torch.Tensor], actions: list[torch.Tensor], masks: list[torch.Tensor]) -> SelectedPath:
        """The SelectedPath of a finished walk whose steps were `nodes`, `actions`, `masks`."""
        b = self.node.shape[0]
        inactive = torch.full_like(self.node, INACTIVE)
        status = torch.where(self.new, NEW, torch.where(self.revisit, REVISIT, torch.where(self.dropped, DROPPED, inactive)))
        if not nodes:
            empty = torch.zeros((b, 0), dtype=torch.int64, device=self.node.device)
            return SelectedPath(status, self.parent, self.action, self.leaf, empty, empty, empty.bool())
        return SelectedPath(status, self.parent, self.action, self.leaf,
                            torch.stack(nodes, 1), torch.stack(actions, 1), torch.stack(masks, 1))


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


def walk_steps(
    tree: Tree,
    walk: Walk,
    *,
    root_action_selection_fn: ActionSelectionFn,
    interior_action_selection_fn: ActionSelectionFn,
    max_depth: int | None = None,
    generator: torch.Generator | None = None,
    virtual_loss: VirtualLoss | None = None,
    steps: int | None = None,
    at_root: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Move `walk` on by `steps` steps (None: until every walk has ended), in place; the first
    step uses the root rule when `at_root`. Returns each step's nodes, actions and masks."""
    k = tree.num_actions
    offsets = _row_offsets(tree)
    nodes, actions, masks = [], [], []
    depth = 0
    while (depth < steps) if steps is not None else bool(walk.running.any()):
        running, node = walk.running, walk.node
        flat = offsets + node
        stats = _stats_at(tree, flat, virtual_loss)
        select = root_action_selection_fn if depth == 0 and at_root else interior_action_selection_fn
        chosen = select(stats, generator)
        # Every action of the node is invalid or pending: nothing is left to select here.
        stuck = running & stats.invalid.all(-1)
        walk.dropped = walk.dropped | stuck
        running = running ^ stuck  # stuck is a subset of running: this removes it
        child = torch.take(tree.children_index, flat * k + chosen)
        nodes.append(node)
        actions.append(chosen)
        masks.append(running)
        walk.parent = torch.where(running, node, walk.parent)
        walk.action = torch.where(running, chosen, walk.action)
        unexpanded = child == UNVISITED
        child_flat = offsets + child.clamp_min(0)
        at_leaf = _take(tree, "terminal", child_flat)
        if max_depth is not None:
            at_leaf = at_leaf | (_take(tree, "depth", child_flat) >= max_depth)
        ended = running & (unexpanded | at_leaf)
        is_new = ended & unexpanded
        is_revisit = ended ^ is_new
        walk.new = walk.new | is_new
        walk.revisit = walk.revisit | is_revisit
        walk.leaf = torch.where(is_revisit, child, walk.leaf)
        walk.running = running ^ ended
        walk.node = torch.where(walk.running, child, node)
        depth += 1
    return nodes, actions, masks


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


def backup(tree: Tree, leaf_index: torch.Tensor, active: torch.Tensor, steps: int | None = None) -> None:
    """Back the value of `leaf_index[b]` up to the root of every active tree, in place.

    Along the path, G = r(s, a) + discount(s, a) * G starts from V(leaf); each parent's value
    becomes the running mean of the G it received, its visits grow by one, and the edge's
    children_values/children_visits are refreshed (mctx's backward).
    steps: climb exactly this many levels (at least the deepest leaf's depth) instead of asking
      the device at each level whether a path is still climbing; extra levels change nothing.
    """
    climb(tree, *start_climb(tree, leaf_index, active), steps)


def start_climb(tree: Tree, leaf_index: torch.Tensor, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """backup()'s loop state before its first level, `[B]` each: the node each tree's value
    stands at, that value, and whether the tree still climbs."""
    rows = torch.arange(tree.batch_size, device=tree.device)
    index = torch.where(active, leaf_index, ROOT_INDEX)
    return index, tree.node_values[rows, index], active & (index != ROOT_INDEX)


def climb(
    tree: Tree, index: torch.Tensor, value: torch.Tensor, running: torch.Tensor, steps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """backup()'s levels from the state start_climb (or an earlier climb) gave, in place: `steps`
    levels, or None until every tree is at its root. Returns the state after them."""
    rows = torch.arange(tree.batch_size, device=tree.device)
    level = 0
    while (level < steps) if steps is not None else bool(running.any()):
        level += 1
        parent = torch.where(running, tree.parents[rows, index], index).clamp_min(0)
        act = torch.where(running, tree.action_from_parent[rows, index], 0).clamp_min(0)
        reward = tree.children_rewards[rows, parent, act]
        discount = tree.children_discounts[rows, parent, act]
        value = torch.where(running, reward + discount * value, value)
        count = tree.node_visits[rows, parent]
        old_value = tree.node_values[rows, parent]
        new_value = (old_value * count + value) / (count + 1)
        # Rows that stopped rewrite their own current entries unchanged.
        tree.node_values[rows, parent] = torch.where(running, new_value, old_value)
        tree.node_visits[rows, parent] = count + running.long()
        tree.children_values[rows, parent, act] = torch.where(
            running, tree.node_values[rows, index], tree.children_values[rows, parent, act]
        )
        tree.children_visits[rows, parent, act] = tree.children_visits[rows, parent, act] + running.long()
        index = torch.where(running, parent, index)
        running = running & (index != ROOT_INDEX)
    return index, value, running


def backup_path(tree: Tree, path: SelectedPath, leaf_index: torch.Tensor, active: torch.Tensor) -> None:
    """backup() along a path already known from select_path, vectorised over depth, in place.

    Gives exactly the tensors backup() gives; the search uses it because it costs a fixed
    number of tensor ops instead of a dozen per level. leaf_index, active: `[B]`.
    """
    mask = path.path_mask & active.unsqueeze(-1)
    if path.path_nodes.shape[1] == 0 or not bool(mask.any()):
        return
    k = tree.num_actions
    offsets = _row_offsets(tree)
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
    return _expand(tree, expand_fn, parents, actions, valid)[0]


def _expand(
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


def _expand_dense(
    tree: Tree, expand_fn: ExpandFn, parent: torch.Tensor, action: torch.Tensor, valid: torch.Tensor, nan: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """_expand() for one leaf per tree (`[B]` parent, action, valid) without asking the device
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
    virtual_loss: virtual visits added per pending traversal (only used when L > 1).
    generator: torch.Generator on the tree's device for tie-breaking; seeds the search.
    widen_fn: progressive widening (see WidenFn); after each iteration's backups it is offered
      the exhausted nodes on that iteration's paths in trees still searching. Default: the
      expand function's `widen` attribute when it has one, else no widening.
    A tree also stops when the expand function returns ExpandOutput.stop True for it.
    graphs: with L = 1, run each iteration's selection and backup as CUDA graphs, captured once
      per walk length and replayed, or whole iterations when the expand function is
      `graph_safe` (`_search_static`): one replay instead of hundreds of kernel launches.
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
    if max_depth is not None and max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    capacity = int(tree.num_nodes.max()) + num_simulations if max_nodes is None else max_nodes
    tree = grow(tree, capacity)
    b, n, k = tree.batch_size, tree.max_nodes, tree.num_actions
    big_l = leaves_per_iteration
    target = tree.num_simulations + num_simulations
    done = tree.terminal[:, ROOT_INDEX] | (tree.num_simulations >= target)
    vl = None
    if big_l > 1:
        vl = VirtualLoss(
            edge_visits=torch.zeros((b, n, k), dtype=tree.node_values.dtype, device=tree.device),
            node_visits=torch.zeros((b, n), dtype=tree.node_values.dtype, device=tree.device),
            amount=virtual_loss,
        )
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
            _search_static(
                tree, expand_fn, walk_fn=functools.partial(
                    walk_steps, root_action_selection_fn=root_action_selection_fn,
                    interior_action_selection_fn=interior_action_selection_fn, max_depth=max_depth,
                ), done=done, target=target, max_depth=max_depth, widen_fn=widen_fn, generator=generator,
                replay=replay,
            )
        return tree
    while not bool(done.all()):
        sims = tree.num_simulations
        counted = torch.zeros(b, dtype=torch.int64, device=tree.device)
        n_new = torch.zeros(b, dtype=torch.int64, device=tree.device)
        paths: list[SelectedPath] = []
        new_masks, revisit_masks = [], []
        for _ in range(big_l):
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
                add_virtual_loss(vl, _masked(path, is_new | is_revisit))
            counted += (is_new | is_revisit).long()
            n_new += is_new.long()
            paths.append(path)
            new_masks.append(is_new)
            revisit_masks.append(is_revisit)
        # A searching tree whose every path was dropped is full: it stops.
        done = done | (~done & (counted == 0))
        valid = torch.stack(new_masks, 1)
        new_index = torch.full((b, big_l), UNVISITED, dtype=torch.int64, device=tree.device)
        stopped = torch.zeros(b, dtype=torch.bool, device=tree.device)
        if bool(valid.any()):
            parents = torch.stack([p.parent for p in paths], 1)
            actions = torch.stack([p.action for p in paths], 1)
            new_index, stopped = _expand(tree, expand_fn, parents, actions, valid)
        for j, path in enumerate(paths):
            if vl is not None:
                clear_virtual_loss(vl, _masked(path, new_masks[j] | revisit_masks[j]))
            leaf = torch.where(new_masks[j], new_index[:, j], path.leaf)
            revisit = revisit_masks[j]
            if bool(revisit.any()):
                rows = torch.arange(b, device=tree.device)
                safe = leaf.clamp_min(0)
                tree.node_visits[rows, safe] = tree.node_visits[rows, safe] + revisit.long()
            backup_path(tree, path, leaf, new_masks[j] | revisit)
        done = done | stopped | (tree.num_simulations >= target)
        if widen_fn is not None:
            _widen_on_paths(tree, widen_fn, [_masked(p, new_masks[j] | revisit_masks[j]) for j, p in enumerate(paths)], done)
    return tree


def _widen_on_paths(tree: Tree, widen_fn: WidenFn, paths: list[SelectedPath], done: torch.Tensor) -> None:
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


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _search_static(
    tree: Tree,
    expand_fn: ExpandFn,
    *,
    walk_fn: Callable[..., tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]],
    done: torch.Tensor,
    target: torch.Tensor,
    max_depth: int | None,
    widen_fn: WidenFn | None,
    generator: torch.Generator | None,
    replay: CudaGraphs | Compiled | None,
) -> None:
    """search() with one leaf per iteration, written for CUDA graphs: selection and backup read
    and write fixed tensors and take a fixed number of steps (the deepest node's depth + 1,
    rounded up to STEP_BUCKET and capped by max_depth), so each is one graph per walk length.
    Between them the expand function and widening run eagerly; when the expand function is
    marked `graph_safe` and nothing widens, UNROLL whole iterations (select, expand, backup)
    are one graph. Past LONG_WALK steps the selection and the backup run in pieces (walk_fn is
    walk_steps with the rules bound). replay None runs the same steps eagerly (CPU)."""
    b, n = tree.batch_size, tree.max_nodes
    long_walk = LONG_WALK if b > 1 else 2 * LONG_WALK
    rows = torch.arange(b, device=tree.device)
    # What the backup reads: copied here by the selection, by the caller from the expansion.
    new_index = torch.full((b, 1), UNVISITED, dtype=torch.int64, device=tree.device)
    stopped = torch.zeros(b, dtype=torch.bool, device=tree.device)
    old_leaf = torch.full((b,), UNVISITED, dtype=torch.int64, device=tree.device)
    new, revisit = torch.zeros_like(stopped), torch.zeros_like(stopped)
    # A walk or a climb in pieces keeps its state here between calls.
    walk_state = Walk.start(tree, stopped)
    climb_state = (old_leaf.clone(), torch.zeros(b, dtype=tree.node_values.dtype, device=tree.device), stopped.clone())

    def settle(walk: Walk, ended: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """What the walk's end asks of the expansion and the backup. `ended`: a 0-dim bool, False
        where the walk may not have ended yet: then it asks nothing and changes nothing."""
        is_new, is_revisit = walk.new & (tree.num_nodes < n), walk.revisit
        if ended is not None:
            is_new, is_revisit = is_new & ended, is_revisit & ended
        # Nothing selectable: the tree is full.
        done.logical_or_(~(is_new | is_revisit) if ended is None else ended & ~(is_new | is_revisit))
        old_leaf.copy_(walk.leaf)
        new.copy_(is_new)
        revisit.copy_(is_revisit)
        return is_new, is_revisit

    def choose(steps: int, gen: Any) -> tuple[SelectedPath, torch.Tensor, torch.Tensor]:
        walk = Walk.start(tree, ~done & (tree.num_simulations < target))
        path = walk.path(*walk_fn(tree, walk, steps=steps, generator=gen))
        return (path, *settle(walk))

    # Only widening reads a walk's path; without it a piece returns just whether a walk goes on.
    keep_path = widen_fn is not None

    def walk_piece(steps: int, gen: Any, first: bool = False) -> tuple[torch.Tensor, ...]:
        walk = Walk.start(tree, ~done & (tree.num_simulations < target)) if first else dataclasses.replace(walk_state)
        nodes, actions, masks = walk_fn(tree, walk, steps=steps, generator=gen, at_root=first)
        # Stacked before walk_state is written: a continued piece's first node is walk_state.node.
        path = (torch.stack(nodes, 1), torch.stack(actions, 1), torch.stack(masks, 1)) if keep_path else ()
        for field in dataclasses.fields(Walk):
            getattr(walk_state, field.name).copy_(getattr(walk, field.name))
        return *path, walk.running.any()

    def walk_first(steps: int, gen: Any) -> tuple[torch.Tensor, ...]:
        return walk_piece(steps, gen, first=True)

    def walk_in_pieces() -> list[list[torch.Tensor]]:
        """Walk in pieces until every walk has ended; the walk is left in walk_state. Returns each
        piece's nodes, actions and masks (`[B, PIECE]`) when keep_path."""
        *piece, going = run("walk_first", walk_first, PIECE)
        pieces = [[t.clone() for t in piece]]  # cloned: a graph's outputs are overwritten by its next replay
        while bool(going):
            *piece, going = run("walk_more", walk_piece, PIECE)
            pieces.append([t.clone() for t in piece])
        return pieces

    def leaf_visits() -> torch.Tensor:
        """Each tree's leaf, after counting a visit to a revisited one."""
        leaf = torch.where(new, new_index[:, 0], old_leaf)
        safe = leaf.clamp_min(0)
        tree.node_visits[rows, safe] = tree.node_visits[rows, safe] + revisit.long()
        return leaf

    def back_up(steps: int, gen: Any = None) -> None:
        backup(tree, leaf_visits(), new | revisit, steps=steps)
        done.logical_or_(stopped | (tree.num_simulations >= target))

    def climb_piece(steps: int, gen: Any = None, first: bool = False) -> torch.Tensor:
        state = start_climb(tree, leaf_visits(), new | revisit) if first else climb_state
        state = climb(tree, *state, steps)
        for t, value in zip(climb_state, state):
            t.copy_(value)
        # Before the last piece this changes nothing: the root's visits (num_simulations) grow there.
        done.logical_or_(stopped | (tree.num_simulations >= target))
        return state[2].any()

    def climb_first(steps: int, gen: Any = None) -> torch.Tensor:
        return climb_piece(steps, gen, first=True)

    def climb_on(going: Any) -> None:
        """Climb in pieces until no tree climbs; `going`: whether one did in the last piece."""
        while bool(going):
            going = run("climb_more", climb_piece, PIECE)

    run = replay or (lambda name, fn, steps: fn(steps, generator))
    deepest = int(tree.depth.max())

    def walk_length(extra: int) -> int:
        walk = round_up(deepest + extra, STEP_BUCKET)
        return walk if max_depth is None else min(walk, max_depth)

    in_pieces = False  # once walks are long they stay long: trees only deepen
    if widen_fn is None and getattr(expand_fn, "graph_safe", False):
        # The expand function is capturable too: whole iterations are one graph, and the host
        # reads three numbers per replay (all done, deepest node, NaN seen).
        nan = torch.zeros(2, dtype=torch.bool, device=tree.device)
        status = torch.zeros(3, dtype=torch.int64, device=tree.device)

        def iterate(steps: int, gen: Any) -> torch.Tensor:
            for _ in range(UNROLL):
                path, is_new, _ = choose(steps, gen)
                index, stop = _expand_dense(tree, expand_fn, path.parent, path.action, is_new, nan)
                new_index.copy_(index.unsqueeze(-1))
                stopped.copy_(stop)
                back_up(steps)
            status.copy_(torch.stack([done.all().long(), tree.depth.max(), nan[0].long() * 2 + nan[1].long()]))
            return status

        def expand_climb(steps: int, gen: Any = None, walking: torch.Tensor | None = None) -> torch.Tensor:
            # After a walk in pieces: the rest of an iteration, up to the backup's first piece.
            ended = None if walking is None else ~walking
            is_new, _ = settle(walk_state, ended)
            index, stop = _expand_dense(tree, expand_fn, walk_state.parent, walk_state.action, is_new, nan)
            new_index.copy_(index.unsqueeze(-1))
            stopped.copy_(stop if ended is None else stop & ended)
            going = climb_piece(steps, first=True)
            walking = torch.zeros_like(going) if walking is None else walking
            status.copy_(torch.stack([walking.long(), going.long(), nan[0].long() * 2 + nan[1].long()]))
            return status

        def walk_expand_climb(steps: int, gen: Any) -> torch.Tensor:
            # A walk's first piece, and where every walk ended in it (most iterations) the rest
            # of the iteration too: one call. Else the expansion and the climb see no tree.
            return expand_climb(steps, gen, walking=walk_first(steps, gen)[-1])

        def check(flags: int) -> None:
            if flags:
                raise ValueError(f"ExpandOutput.{'prior_logits' if flags & 2 else 'value'} holds NaN"
                                 + ("; use -inf for missing actions" if flags & 2 else ""))

        all_done = bool(done.all())
        # Deep trees go on one iteration at a time below, walking in pieces.
        while not all_done and walk_length(UNROLL) <= long_walk:
            all_done, deepest, flags = run("iterate", iterate, walk_length(UNROLL)).tolist()
            check(flags)
        # Deep trees: one iteration at a time, the walk and the backup in pieces.
        while not bool(done.all()):
            walking, going, flags = run("walk_expand_climb", walk_expand_climb, PIECE).tolist()
            check(flags)
            if walking:
                while walking:
                    walking = bool(run("walk_more", walk_piece, PIECE)[-1])
                _, going, flags = run("expand_climb", expand_climb, PIECE).tolist()
                check(flags)
            climb_on(going)
        return
    while not bool(done.all()):
        in_pieces = in_pieces or walk_length(1) > long_walk
        if in_pieces:
            pieces = walk_in_pieces()
            path = walk_state.path(*(list(torch.cat(part, 1).unbind(1)) for part in zip(*pieces))) if keep_path else None
            is_new, is_revisit = settle(walk_state)
            parent, action = walk_state.parent, walk_state.action
        else:
            path, is_new, is_revisit = run("select", choose, walk_length(1))
            parent, action = path.parent, path.action
        if bool(is_new.any()):
            index, stop = _expand(tree, expand_fn, parent[:, None], action[:, None], is_new[:, None])
            new_index.copy_(index)
            stopped.copy_(stop)
            deepest = int(tree.depth.max())
        else:
            new_index.fill_(UNVISITED)
            stopped.fill_(False)
        if in_pieces or round_up(deepest, STEP_BUCKET) > long_walk:
            climb_on(run("climb_first", climb_first, PIECE))
        else:
            run("backup", back_up, round_up(deepest, STEP_BUCKET))
        if widen_fn is not None:
            _widen_on_paths(tree, widen_fn, [_masked(path, is_new | is_revisit)], done)


def _masked(path: SelectedPath, keep: torch.Tensor) -> SelectedPath:
    """The path with its steps kept only for trees where `keep` ([B]) is True."""
    return SelectedPath(
        status=path.status,
        parent=path.parent,
        action=path.action,
        leaf=path.leaf,
        path_nodes=path.path_nodes,
        path_actions=path.path_actions,
        path_mask=path.path_mask & keep.unsqueeze(-1),
    )
