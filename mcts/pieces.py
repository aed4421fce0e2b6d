"""The pieces selection and backup are made of, shared by the eager loop and the fixed-step
runner: path and virtual-loss types, a node's stats, a walk from the root in steps (`Walk`,
`walk_steps`), the backup's climb in levels (`start_climb`, `climb`, `backup`).

A walk or a climb can stop when every tree has ended (asking the device each step) or take a
fixed number of steps, so it can be recorded as a CUDA graph or compiled, and cut into pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mcts.base import ActionSelectionFn, NodeStats
from mcts.tree import ROOT_INDEX, UNVISITED, Tree

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


def row_offsets(tree: Tree) -> torch.Tensor:
    """`[B]` b * N: added to a node index, the row of node (b, n) in a tensor flattened to [B * N, ...]."""
    return torch.arange(tree.batch_size, device=tree.device) * tree.max_nodes


def take_rows(tree: Tree, name: str, flat: torch.Tensor) -> torch.Tensor:
    """Rows `flat` ([B]) of field `name` flattened to [B * N, ...] (Tree.rows): gather_nodes with
    the index computed once per node instead of once per field (each tensor op is the cost here)."""
    return tree.rows(name).index_select(0, flat)


def stats_at(tree: Tree, flat: torch.Tensor, virtual_loss: VirtualLoss | None) -> NodeStats:
    """node_stats() of the nodes at flattened rows `flat` ([B], from row_offsets)."""
    dtype = tree.node_values.dtype
    logits = take_rows(tree, "children_prior_logits", flat)
    counts = take_rows(tree, "children_visits", flat).to(dtype)
    q = take_rows(tree, "children_rewards", flat) + take_rows(tree, "children_discounts", flat) * take_rows(tree, "children_values", flat)
    value = take_rows(tree, "node_values", flat)
    visits = take_rows(tree, "node_visits", flat).to(dtype)
    invalid = torch.isneginf(logits)
    if virtual_loss is not None:
        pending = virtual_loss.edge_visits.flatten(0, 1).index_select(0, flat)
        # An unexpanded edge already chosen this iteration is blocked: L leaves stay distinct.
        invalid = invalid | ((pending > 0) & (take_rows(tree, "children_index", flat) == UNVISITED))
        visited = counts > 0
        low = torch.minimum(value, torch.where(visited, q, value.unsqueeze(-1)).min(-1).values).unsqueeze(-1)
        total = counts + pending
        q = torch.where(pending > 0, (q * counts + low * pending) / total.clamp_min(1e-12), q)
        counts = total
        visits = visits + virtual_loss.node_visits.flatten(0, 1).index_select(0, flat)
    return NodeStats(
        depth=take_rows(tree, "depth", flat),
        visits=visits,
        value=value,
        raw_value=take_rows(tree, "raw_values", flat),
        prior_logits=logits,
        children_visits=counts,
        qvalues=q,
        invalid=invalid,
    )


@dataclass
class Walk:
    """select_path's loop state, `[B]` each, so that a long walk can run as fixed-length pieces
    (`fixed_steps.search_fixed_steps` compiles one piece rather than one graph per walk length).

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
    offsets = row_offsets(tree)
    nodes, actions, masks = [], [], []
    depth = 0
    while (depth < steps) if steps is not None else bool(walk.running.any()):
        running, node = walk.running, walk.node
        flat = offsets + node
        stats = stats_at(tree, flat, virtual_loss)
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
        at_leaf = take_rows(tree, "terminal", child_flat)
        if max_depth is not None:
            at_leaf = at_leaf | (take_rows(tree, "depth", child_flat) >= max_depth)
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


def masked(path: SelectedPath, keep: torch.Tensor) -> SelectedPath:
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
