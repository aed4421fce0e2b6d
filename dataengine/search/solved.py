"""Solved trees: which trees of the batch hold a verified success, under solved_policy "stop"
the budget transfer (a solved tree stops and its unspent tokens go to the batch's unsolved
trees, `TokenBudget.transfer`), and with solved_contrast the siblings step pairs set against
the success: contrast probes (the success path's unexpanded final-answer candidates, verified
at no token cost) and, under "stop", a second child at each of the path's nodes."""

from __future__ import annotations

import torch

from dataengine.budget import TokenBudget
from dataengine.config import SearchConfig
from dataengine.search.nodes import NodeTable


class SolvedTrees:
    """Per-tree success flags of one batch.

    search: its objective and solved_policy are read. success: the reward's success weight.
    solved: `[B]` a verified success is in the tree. stopped: `[B]` the tree stopped searching
    (solved_policy "stop"); widening skips stopped trees. path: per tree, the handles from the
    root to its first success ([] while unsolved).
    """

    def __init__(self, search: SearchConfig, success: float, table: NodeTable) -> None:
        self.search, self.success, self.table = search, success, table
        self.solved: list[bool] = []
        self.stopped: list[bool] = []
        self.path: list[list[int]] = []
        self.probed: list[bool] = []

    def reset(self, num_trees: int) -> None:
        """A new batch of `num_trees` trees, none solved."""
        self.solved = [False] * num_trees
        self.stopped = [False] * num_trees
        self.path = [[] for _ in range(num_trees)]
        self.probed = [False] * num_trees

    def solves(self, value: float) -> bool:
        """A successful terminal (backing up `value`) solves its tree, except under objective
        "efficient_success" when it wasted steps: the search goes on for a shorter success
        (widening included)."""
        return self.search.objective != "efficient_success" or value >= self.success

    def mark(self, handle: int) -> None:
        """A successful terminal: its tree is solved and every ancestor has a success below."""
        node = self.table[handle]
        self.solved[node.tree] = True
        path = self.table.path(handle)
        self.path[node.tree] = self.path[node.tree] or path
        for h in path:
            self.table[h].solved_below = True

    def stop(self, budget: TokenBudget) -> torch.Tensor | None:
        """solved_policy "stop": trees newly solved stop, and their unspent tokens move to the
        trees of the batch without a success (split evenly, in tree order). Returns the `[B]`
        stop flags for the core, or None under "continue"."""
        if self.search.solved_policy != "stop":
            return None
        unsolved = [t for t, solved in enumerate(self.solved) if not solved]
        for t, solved in enumerate(self.solved):
            if solved and not self.stopped[t] and self.contrasted(t):
                self.stopped[t] = True
                budget.transfer(t, unsolved)
        return torch.tensor(self.stopped, dtype=torch.bool)

    def contrasted(self, tree: int) -> bool:
        """Whether solved tree `tree` may stop: always, unless `solved_contrast`; then once every
        node on its first success's path with two or more candidates has two children. The
        success's Q keeps selection on it, so until then the tree spends simulations (no
        tokens) re-backing it up, and PUCT's exploration term reaches a sibling as visits grow."""
        if not self.search.solved_contrast:
            return True
        return all(len(self.table[h].children) + len(self.table[h].probes) >= 2
                   for h in self.path[tree][:-1] if len(self.table[h].edges) >= 2)

    def probe_candidates(self) -> list[tuple[int, int]]:
        """solved_contrast: (node handle, edge index) of every candidate on a newly solved
        tree's first success path that has no child and answers without a tool call (parsed
        final answer). Stepping one ends the episode, so the verifier judges it at no token
        cost and the success's step pair at that node gets a verified failure beside it; a
        candidate that calls a tool would need more turns (tokens) before any verdict, and is
        left to the search. Each tree is probed once, at its first success."""
        if not self.search.solved_contrast:
            return []
        out = []
        for t, solved in enumerate(self.solved):
            if not solved or self.probed[t]:
                continue
            self.probed[t] = True
            for h in self.path[t][:-1]:
                node = self.table[h]
                out.extend((h, a) for a, e in enumerate(node.edges)
                           if a not in node.children and a not in node.probes and e.action.is_final)
        return out
