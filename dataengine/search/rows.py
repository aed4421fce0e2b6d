"""Store rows of a searched batch: `tasks`, `nodes` (every node) and `trajectories` (every
root-to-terminal path; baselines add their sampled episodes). Column meanings live in
storage/schemas.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mcts
from dataengine.env import EnvState
from dataengine.search.nodes import NodeTable, edge_priors
from dataengine.types import Message, Task
from storage.dedup import trajectory_hash
from storage.rows import to_json, verdict_structs


def messages_dicts(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as JSON-able dicts (Message.model_validate reads them back)."""
    return [m.model_dump(mode="json") for m in messages]


def task_rows(tasks: Sequence[Task]) -> list[dict[str, Any]]:
    return [{"task_id": t.id, "suite": t.suite, "split": t.split, "task_json": t.model_dump_json()} for t in tasks]


def trajectory_row(
    state: EnvState,
    *,
    traj_id: str,
    source: str,
    reward: float,
    success: bool,
    verdicts: Sequence[Any],
    generated_tokens: int,
    model_id: str,
    tree_id: str | None = None,
    node_ids: list[int] | None = None,
) -> dict[str, Any]:
    """One `trajectories` row for the episode that ends in `state`."""
    messages = messages_dicts(state.messages)
    episode = state.episode()
    return {
        "task_id": state.task.id,
        "suite": state.task.suite,
        "split": state.task.split,
        "tree_id": tree_id,
        "traj_id": traj_id,
        "node_ids": node_ids,
        "source": source,
        "messages_json": to_json(messages),
        "final_answer": episode.final_answer,
        "reward": float(reward),
        "success": bool(success),
        "num_steps": len(state.steps),
        "num_tool_calls": len(episode.calls),
        "num_generated_tokens": int(generated_tokens),
        "verdicts": verdict_structs(verdicts),
        "model_id": model_id,
        "traj_hash": trajectory_hash([m.to_chat() for m in state.messages]),
        "turn": state.turn,
    }


def tree_rows(table: NodeTable, tree: mcts.Tree, b: int, *, model_id: str) -> tuple[list[dict], list[dict]]:
    """(`nodes` rows, `trajectories` rows) of tree `b`.

    node_id is the node's index in the tensor tree (root 0). q of a node is Q(parent, action)
    = reward + discount * V(node) read from the searched tensors (the root's q is its V);
    visits is N(node). origin / widen_round say which feature produced the node,
    transposition_of names the node whose value estimate it reused, and the root row holds
    the tree's budget_received / budget_given. Contrast probes (`SearchNode.probes`) follow
    the tensor tree's nodes (origin "contrast", 1 visit, q their search return). Every
    terminal node gives one trajectory (source "mcts").
    """
    count = int(tree.num_nodes[b])
    handles = tree.node_handle[b, :count].tolist()
    parents = tree.parents[b, :count].tolist()
    actions = tree.action_from_parent[b, :count].tolist()
    visits = tree.node_visits[b, :count].tolist()
    values = tree.node_values[b, :count].tolist()
    rewards = tree.children_rewards[b]
    discounts = tree.children_discounts[b]
    # Contrast probes follow the tensor tree's nodes: parent = the node they were probed at,
    # q = their search return, 1 visit. A probe whose edge the search expanded later is dropped.
    probes = [(ph, n, a) for n, h in enumerate(handles) for a, ph in sorted(table[h].probes.items())
              if a not in table[h].children]
    for ph, n, a in probes:
        handles.append(ph)
        parents.append(n)
        actions.append(a)
        visits.append(1)
    index = {h: n for n, h in enumerate(handles)}
    root = table[handles[0]]
    task = root.state.task
    budget = table.budget
    tree_id = task.id
    node_rows, traj_rows = [], []
    for n, h in enumerate(handles):
        node = table[h]
        p, a = parents[n], actions[n]
        if p == mcts.NO_PARENT:
            q, prior = values[n], None
        elif n >= count:
            q, prior = float(node.probe_value), edge_priors(table[handles[p]].edges)[a]  # type: ignore[arg-type]
        else:
            q = float(rewards[p, a]) + float(discounts[p, a]) * values[n]
            prior = edge_priors(table[handles[p]].edges)[a]
        edge = node.edge
        last = node.state.steps[-1] if node.state.steps else None
        node_rows.append(
            {
                "task_id": task.id,
                "suite": task.suite,
                "tree_id": tree_id,
                "node_id": n,
                "parent_id": None if p == mcts.NO_PARENT else p,
                "depth": node.depth,
                "action_index": None if p == mcts.NO_PARENT else a,
                "action_text": edge.sample.text if edge else None,
                "action_json": to_json(edge.action) if edge else None,
                "action_key": edge.action.key() if edge else None,
                "parse_error": edge.action.parse_error if edge else None,
                "logprob": edge.sample.logprob if edge else None,
                "num_tokens": edge.sample.num_tokens if edge else None,
                "prior": prior,
                "visits": int(visits[n]),
                "q": float(q),
                "value_estimate": node.value_estimate,
                "critic_score": edge.critic_score if edge else None,
                "reward": float(node.reward) if p != mcts.NO_PARENT else None,
                "terminal": node.terminal,
                "success": node.success if node.terminal else None,
                "verdicts": verdict_structs(node.verdicts),
                "observation": "\n".join(m.content for m in last.observations) if last else None,
                "messages_json": to_json(messages_dicts(node.state.messages)),
                "env_hash": node.state.state_hash,
                "prefix_hash": node.state.prefix_hash,
                "model_id": model_id,
                "origin": node.origin,
                "widen_round": edge.round if edge else None,
                "transposition_of": None if node.transposition_of is None else index[node.transposition_of],
                "budget_received": budget.received[node.tree] if budget is not None and edge is None else None,
                "budget_given": budget.given[node.tree] if budget is not None and edge is None else None,
                "turn": node.state.turn,
            }
        )
        if node.terminal:
            path = table.path(h)
            traj_rows.append(
                trajectory_row(
                    node.state,
                    traj_id=f"{tree_id}/{n}",
                    source="mcts",
                    reward=node.reward,
                    success=bool(node.success),
                    verdicts=node.verdicts,
                    generated_tokens=sum(table[x].edge.sample.generated_tokens for x in path[1:]),  # type: ignore[union-attr]
                    model_id=model_id,
                    tree_id=tree_id,
                    node_ids=[index[x] for x in path],
                )
            )
    return node_rows, traj_rows
