"""Batched Monte Carlo tree search on torch tensors, in the manner of DeepMind's mctx.

Knows nothing about LLMs: the caller's model enters through one expand function (see
mcts.base.ExpandFn) and its states through integer handles.
"""

from mcts.action_selection import (
    gumbel_muzero_interior_action_selection,
    gumbel_muzero_root_action_selection,
    masked_argmax,
    puct_action_selection,
    uct_action_selection,
)
from mcts.base import (
    ActionSelectionFn,
    ExpandFn,
    ExpandOutput,
    NodeStats,
    PolicyOutput,
    RootInput,
    SearchSummary,
)
from mcts.checkpoint import load_tree, save_tree
from mcts.export import tree_to_networkx
from mcts.policies import (
    add_dirichlet_noise,
    gumbel_muzero_policy,
    make_generator,
    muzero_policy,
    uct_policy,
)
from mcts.qtransforms import (
    qtransform_by_min_max,
    qtransform_by_parent_and_siblings,
    qtransform_completed_by_mix_value,
)
from mcts.search import backup, backup_path, expand, node_stats, search, select_path
from mcts.tree import (
    NO_HANDLE,
    NO_PARENT,
    ROOT_INDEX,
    UNVISITED,
    Tree,
    children_visits,
    gather_nodes,
    grow,
    init_tree,
    qvalues,
    summary,
)

__all__ = [
    "NO_HANDLE",
    "NO_PARENT",
    "ROOT_INDEX",
    "UNVISITED",
    "ActionSelectionFn",
    "ExpandFn",
    "ExpandOutput",
    "NodeStats",
    "PolicyOutput",
    "RootInput",
    "SearchSummary",
    "Tree",
    "add_dirichlet_noise",
    "backup",
    "backup_path",
    "children_visits",
    "expand",
    "gather_nodes",
    "grow",
    "gumbel_muzero_interior_action_selection",
    "gumbel_muzero_policy",
    "gumbel_muzero_root_action_selection",
    "init_tree",
    "load_tree",
    "make_generator",
    "masked_argmax",
    "muzero_policy",
    "node_stats",
    "puct_action_selection",
    "qtransform_by_min_max",
    "qtransform_by_parent_and_siblings",
    "qtransform_completed_by_mix_value",
    "qvalues",
    "save_tree",
    "search",
    "select_path",
    "summary",
    "tree_to_networkx",
    "uct_action_selection",
    "uct_policy",
]
