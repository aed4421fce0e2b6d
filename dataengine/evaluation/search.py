"""Search at inference: the tree search of dataengine.search with the evaluated model as policy.

For each task the search grows a tree (config.search budgets); the episode it returns is the
path that follows the most visited child from the root (ties: higher mean value, then the lower
node index) down to a terminal node. When that path stops at a node that was never expanded,
the episode is unfinished and is verified as it is (it has no final answer, so it fails).

With selection "oracle", terminal nodes are scored by the composite verifier reward, which knows
the gold answer, so the search is guided by the same oracle it is judged by: `search_found` (any
success in the tree) is an upper bound, and `search_success` measures what the search can select
with that guide. With selection "deployable" the tree is grown against tasks whose gold is
hidden (GoldFreeReward: format, execution, efficiency, length only) and the returned episode is
then judged with the full reward: `search_deployable_success`, a success rate an agent without
the answer key could reach.
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


def without_gold(task: Task) -> Task:
    """`task` with everything a verifier could learn the right answer from removed (answer,
    reference calls and end state, acceptable values); whether it needs a tool stays hidden too
    (the default, needs_tool=True, is the same for every task)."""
    from dataengine.types import Gold

    return task.model_copy(update={"gold": Gold()})


class GoldFreeReward:
    """The composite reward of a task whose gold is hidden: only what a deployed agent could
    score itself (format, schema, execution, efficiency, length, the syntax penalty). Never a
    success; used to guide search at inference without the oracle."""

    def __init__(self, inner: CompositeReward) -> None:
        self.inner = inner
        self.weights = inner.weights

    def score(self, episode: Any) -> Any:
        result = self.inner.score(episode.model_copy(update={"task": without_gold(episode.task)}))
        return result.model_copy(update={"success": False})

    def step_reward(self, task: Task, step: Any) -> Any:
        return self.inner.step_reward(without_gold(task), step)

    def versions(self) -> dict[str, str]:
        return self.inner.versions()


def search_at_inference(
    policy: Policy,
    env: ToolEnv,
    config: Any,
    *,
    reward: CompositeReward | None = None,
    seed: int = 0,
    selection: str = "oracle",
):
    """A `SearchFn` for evaluate(): searches the tasks in batches of config.search.trees_per_batch.

    config: an EngineConfig (its `search` and `policy` sections set budgets and sampling).
    selection: "oracle" guides the tree with the verifier reward, which knows the gold answer
        (an upper bound, not a deployable success rate); "deployable" guides it with
        GoldFreeReward (no gold), and only the returned episode is judged with the full reward.
    Each returned Rollout carries the tokens the whole tree cost (TokenBudget of its task).
    """
    import dataclasses

    from dataengine.search import search_batch

    if selection not in ("oracle", "deployable"):
        raise ValueError(f"selection must be 'oracle' or 'deployable', got {selection!r}")
    reward = reward or CompositeReward(replay=env.replay)
    guide = reward if selection == "oracle" else GoldFreeReward(reward)

    def run(tasks: Sequence[Task]) -> list[tuple[Rollout | None, bool]]:
        out: list[tuple[Rollout | None, bool]] = []
        size = config.search.trees_per_batch
        for start in range(0, len(tasks), size):
            part = list(tasks[start:start + size])
            searched = part if selection == "oracle" else [without_gold(t) for t in part]
            batch = search_batch(searched, policy=policy, env=env, reward=guide, config=config, seed=seed + start)
            for b, task in enumerate(part):
                count = int(batch.tree.num_nodes[b])
                handles = batch.tree.node_handle[b, :count].tolist()
                last = batch.table[handles[chosen_path(batch.tree, b)[-1]]]
                state = dataclasses.replace(last.state, task=task)  # judged against the real gold
                found = any(bool(batch.table[h].success) for h in handles)
                out.append((Rollout(task, state, 0, generated_tokens=batch.budget.used[b]), found))
        return out

    return run
