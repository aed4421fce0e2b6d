"""Transpositions: a node whose state equals an earlier node of its tree (`transposition_key`)
points at that node and reuses its value estimate (`leaves.leaf_values`) instead of estimating
again. Keys are kept per tree: trees of a batch never share nodes."""

from __future__ import annotations

from dataengine.search.counters import ExpandCounters
from dataengine.search.nodes import NodeTable, transposition_key


class Transpositions:
    """The first node of each state key, per tree of the batch.

    enabled: `search.transpositions`; off, `link` does nothing.
    seen: `[B]` dicts, transposition key -> handle of the first node with that state.
    """

    def __init__(self, enabled: bool, table: NodeTable, counters: ExpandCounters) -> None:
        self.enabled = enabled
        self.table, self.counters = table, counters
        self.seen: list[dict[str, int]] = []

    def reset(self, num_trees: int) -> None:
        """A new batch of `num_trees` trees: no state seen yet."""
        self.seen = [{} for _ in range(num_trees)]

    def link(self, handle: int) -> None:
        """Point the node at the first node of its tree with an equal state, or register it."""
        if not self.enabled:
            return
        node = self.table[handle]
        key = transposition_key(node.state)
        first = self.seen[node.tree].setdefault(key, handle)
        if first != handle:
            node.transposition_of = first
            self.counters.transpositions += 1
