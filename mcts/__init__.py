"""Batched Monte Carlo tree search on torch tensors, in the manner of DeepMind's mctx.

Knows nothing about LLMs: the caller's model enters through one expand function (see
mcts.base.ExpandFn) and its states through integer handles. This is the public surface; the
building blocks (init_tree, select_path, backup, ...) stay importable from their modules:
mcts.search (the loop), mcts.tree (the data), mcts.action_selection, mcts.qtransforms.
"""

from mcts.action_selection import (
    gumbel_muzero_interior_action_selection,
    gumbel_muzero_root_action_selection,
    puct_action_selection,
    uct_action_selection,
)
from mcts.base import ExpandFn, ExpandOutput, PolicyOutput, RootInput, WidenFn, WidenOutput
from mcts.checkpoint import load_tree, save_tree
from mcts.export import tree_to_networkx
from mcts.policies import add_dirichlet_noise, gumbel_muzero_policy, muzero_policy, uct_policy
from mcts.qtransforms import (
    qtransform_by_min_max,
    qtransform_by_parent_and_siblings,
    qtransform_completed_by_mix_value,
)
from mcts.search import search
from mcts.tree import NO_HANDLE, NO_PARENT, SearchSummary, Tree

__all__ = [
    "NO_HANDLE",
    "NO_PARENT",
    "ExpandFn",
    "ExpandOutput",
    "PolicyOutput",
    "RootInput",
    "SearchSummary",
    "Tree",
    "WidenFn",
    "WidenOutput",
    "add_dirichlet_noise",
    "gumbel_muzero_interior_action_selection",
    "gumbel_muzero_policy",
    "gumbel_muzero_root_action_selection",
    "load_tree",
    "muzero_policy",
    "puct_action_selection",
    "qtransform_by_min_max",
    "qtransform_by_parent_and_siblings",
    "qtransform_completed_by_mix_value",
    "save_tree",
    "search",
    "tree_to_networkx",
    "uct_action_selection",
    "uct_policy",
]
