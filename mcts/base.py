"""The types of the search: inputs from the caller, the expand contract, outputs.

Shapes use B = trees searched together, N = node capacity of each tree, K = actions per node
(fixed for a search), L = leaves selected per tree and iteration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from mcts.tree import Tree


@dataclass(frozen=True)
class RootInput:
    """The roots of B trees, as the caller's policy and value estimator see them.

    prior_logits: `[B, K]` float, the policy's logits over the root's K actions; `-inf` marks
      an action that does not exist (the LLM adapter sampled fewer distinct actions than K).
    value: `[B]` float, the value estimate of each root.
    handle: `[B]` int64, the caller's key for each root's state in its own Python-side table.
    invalid_actions: `[B, K]` bool or None, True where an action may not be taken at the root;
      merged with the `-inf` logits.
    """

    prior_logits: torch.Tensor
    value: torch.Tensor
    handle: torch.Tensor
    invalid_actions: torch.Tensor | None = None


@dataclass(frozen=True)
class ExpandOutput:
    """What the caller's expand function returns for B x L (parent, action) pairs.

    reward: `[B, L]` float, reward of the transition parent --action--> child.
    discount: `[B, L]` float, discount applied to the child's value (forced to 0 if terminal).
    prior_logits: `[B, L, K]` float, the policy's logits over the child's K actions; `-inf`
      marks a missing action. A child with no finite logit is treated as terminal.
    value: `[B, L]` float, value estimate of the child (ignored, and stored as 0, if terminal).
    handle: `[B, L]` int64, the caller's key for the child's state.
    terminal: `[B, L]` bool, True where the child ends the episode; it is never expanded.
    stop: `[B]` bool or None, True for trees whose search ends after this call (the caller
      reached its goal there or spent its budget); None: every tree goes on.
    """

    reward: torch.Tensor
    discount: torch.Tensor
    prior_logits: torch.Tensor
    value: torch.Tensor
    handle: torch.Tensor
    terminal: torch.Tensor
    stop: torch.Tensor | None = None


class ExpandFn(Protocol):
    """The caller's model, called once per iteration with all selected leaves of all trees.

    parent_handles: `[B, L]` int64, handles of the nodes being expanded.
    actions: `[B, L]` int64, the action taken from each parent, in [0, K).
    valid: `[B, L]` bool, False where slot (b, l) holds no leaf this iteration (budget spent,
      tree full, or a collision under virtual loss); outputs there are ignored.
    Returns an ExpandOutput whose tensors are `[B, L]` (`[B, L, K]` for prior_logits).

    A function that is only tensor ops on its inputs (no reads back to the host, the same
    shapes every call; e.g. SyntheticEnv.expand) may carry `graph_safe = True`: on CUDA with
    L = 1 and no widening the search then records whole iterations in one CUDA graph and calls
    it every iteration, also when `valid` is all False; with `compiled=True` on CPU it is
    compiled into the same C++ code as the selection and backup. There it must not rely on
    int64 wraparound: the generated C++ treats signed overflow as undefined, and gcc then
    computes other values than eager torch (an earlier SyntheticEnv hash did; now its
    products stay below 2**63).
    """

    def __call__(
        self, parent_handles: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor
    ) -> ExpandOutput: ...


@dataclass(frozen=True)
class WidenOutput:
    """What the caller's widen function returns for B x W exhausted nodes.

    prior_logits: `[B, W, K]` float, the node's new logits over its K action slots: every
      action that has a child must stay finite; a newly finite slot is a new action.
    widened: `[B, W]` bool, True where the node's logits are replaced by the row above; False
      leaves the node as it is (the row is ignored).
    """

    prior_logits: torch.Tensor
    widened: torch.Tensor


class WidenFn(Protocol):
    """Progressive widening: the caller's chance to add actions to exhausted nodes.

    Called at most once per iteration, after its backups, with the nodes on that iteration's
    paths that are exhausted: not terminal, every valid action already has a child, and at
    least one slot is still invalid (room for a new action). Trees that finished their search
    are left out.
    handles: `[B, W]` int64, handles of those nodes; visits: `[B, W]` int64, their visit
    counts N(s); valid: `[B, W]` bool, False for padding.
    Returns a WidenOutput. An expand function object that has a `widen` attribute (a WidenFn)
    gets widened by `search` unless another widen_fn is given.
    """

    def __call__(self, handles: torch.Tensor, visits: torch.Tensor, valid: torch.Tensor) -> WidenOutput: ...


@dataclass(frozen=True)
class NodeStats:
    """The statistics of one node per tree that an action selection function reads.

    Gathered from the tree with the current iteration's virtual loss already applied.

    depth: `[B]` int64, depth of the node (root = 0).
    visits: `[B]` float, visit count N(s) of the node (plus virtual visits).
    value: `[B]` float, mean backed-up value V(s) of the node.
    raw_value: `[B]` float, the value estimate the node got when it was expanded.
    prior_logits: `[B, K]` float, logits of the node's actions (`-inf` for invalid ones).
    children_visits: `[B, K]` float, visit counts N(s, a) (plus virtual visits).
    qvalues: `[B, K]` float, Q(s, a) = r + discount * V(child); meaningful where visited.
    invalid: `[B, K]` bool, True for actions that may not be selected.
    """

    depth: torch.Tensor
    visits: torch.Tensor
    value: torch.Tensor
    raw_value: torch.Tensor
    prior_logits: torch.Tensor
    children_visits: torch.Tensor
    qvalues: torch.Tensor
    invalid: torch.Tensor


# (stats, generator) -> actions `[B]` int64: the one signature of every selection rule.
ActionSelectionFn = Callable[[NodeStats, torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class PolicyOutput:
    """The result of a search, as mctx returns it.

    action: `[B]` int64, the action proposed at each root (-1 where the root has no valid action).
    action_weights: `[B, K]` float, the improved policy to train the policy network on (visit
      distribution for PUCT/UCT, softmax(logits + sigma(completed Q)) for Gumbel MuZero).
    search_tree: the searched Tree (keep it to resume, save or export).
    """

    action: torch.Tensor
    action_weights: torch.Tensor
    search_tree: Tree
