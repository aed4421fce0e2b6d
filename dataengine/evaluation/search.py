"""Search at inference: the tree search of dataengine.search with the evaluated model as policy.

For each task the search grows a tree (config.search budgets); the episode it returns is the
path that follows the most visited child from the root (ties: higher mean value, then the lower
node index) down to a terminal node. When that path stops at a node that was never expanded,
the episode is unfinished and is verified as it is (it has no final answer, so it fails).

Terminal nodes are scored by the composite verifier reward, which knows the gold answer, so the
search is guided by the same oracle it is judged by: `search_found` (any success in the tree)
is an upper bound, and `search_success` measures what the search can select with that guide.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataengine.env import ToolEnv
from dataengine.evaluation.rollout import Rollout
from dataengine.policy.base import Policy
from dataengine.types import Task
from dataengine.verifiers import CompositeReward


def chosen_path(tree: Any, b: int) -> list[int]:
    """Node indices (root first) of the most-visited path of tree `b` of an mcts.Tree."""
    count = int(tree.num_nodes[b])
    parents = tree.parents[b, :count].tolist()
    visits = tree.node_visits[b, :count].tolist()
    values = tree.node_values[b, :count].tolist()
    terminal = tree.terminal[b, :count].tolist()
    children: dict[int, list[int]] = {}
    for n in range(1, count):
        children.setdefault(parents[n], []).append(n)
    path = [0]
    while not terminal[path[-1]] and children.get(path[-1]):
        path.append(max(children[path[-1]], key=lambda c: (visits[c], values[c], -c)))
    return path


def search_at_inference(
    policy: Policy,
    env: ToolEnv,
    config: Any,
    *,
    reward: CompositeReward | None = None,
    seed: int = 0,
):
    """A `SearchFn` for evaluate(): searches the tasks in batches of config.search.trees_per_batch.

    config: an EngineConfig (its `search` and `policy` sections set budgets and sampling).
    Each returned Rollout carries the tokens the whole tree cost (TokenBudget of its task).
    """
    from dataengine.search import search_batch

    reward = reward or CompositeReward(replay=env.replay)

    def run(tasks: Sequence[Task]) -> list[tuple[Rollout | None, bool]]:
        out: list[tuple[Rollout | None, bool]] = []
        size = config.search.trees_per_batch
        for start in range(0, len(tasks), size):
            part = list(tasks[start:start + size])
            batch = search_batch(part, policy=policy, env=env, reward=reward, config=config, seed=seed + start)
            for b, task in enumerate(part):
                count = int(batch.tree.num_nodes[b])
                handles = batch.tree.node_handle[b, :count].tolist()
                last = batch.table[handles[chosen_path(batch.tree, b)[-1]]]
                found = any(bool(batch.table[h].success) for h in handles)
                out.append((Rollout(task, last.state, 0, generated_tokens=batch.budget.used[b]), found))
        return out

    return run
