"""Export of one searched tree to a networkx DiGraph (for inspection, plots and the store)."""

from __future__ import annotations

import math

import networkx as nx

from mcts.tree import Tree


def tree_to_networkx(tree: Tree, b: int = 0) -> nx.DiGraph:
    """The nodes in use of tree `b` as a DiGraph, node ids = node indices (root 0).

    Node attributes: handle, visits, value (mean backed-up V), raw_value, reward (of the edge
    into the node; 0 at the root), prior (softmax probability of that edge; 1 at the root),
    q (reward + discount * value of that edge), depth, terminal.
    Edge attributes: action, prior, visits, reward, discount, q.
    """
    if not 0 <= b < tree.batch_size:
        raise IndexError(f"tree index b={b} is out of range for a batch of {tree.batch_size} trees")
    n = int(tree.num_nodes[b])
    cpu = {name: t[b, :n].cpu() if name not in ("num_nodes", "root_gumbel") else t for name, t in tree.tensors().items()}
    probs = cpu["children_prior_logits"].softmax(-1).nan_to_num(0.0)
    graph = nx.DiGraph()
    for i in range(n):
        parent = int(cpu["parents"][i])
        action = int(cpu["action_from_parent"][i])
        if parent >= 0:
            reward = float(cpu["children_rewards"][parent, action])
            discount = float(cpu["children_discounts"][parent, action])
            prior = float(probs[parent, action])
        else:
            reward, discount, prior = 0.0, math.nan, 1.0
        value = float(cpu["node_values"][i])
        graph.add_node(
            i,
            handle=int(cpu["node_handle"][i]),
            visits=int(cpu["node_visits"][i]),
            value=value,
            raw_value=float(cpu["raw_values"][i]),
            reward=reward,
            prior=prior,
            q=reward + discount * value if parent >= 0 else value,
            depth=int(cpu["depth"][i]),
            terminal=bool(cpu["terminal"][i]),
        )
        if parent >= 0:
            graph.add_edge(
                parent,
                i,
                action=action,
                prior=prior,
                visits=int(cpu["children_visits"][parent, action]),
                reward=reward,
                discount=discount,
                q=reward + discount * float(cpu["children_values"][parent, action]),
            )
    return graph
