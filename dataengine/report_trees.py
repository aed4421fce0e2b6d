"""Search-tree pictures for the run report.

`labelled_tree` turns a stored tree (storage.queries.tree_graph) into the graph that is drawn:
every node carries `label`, a short text of the action into it (tool calls with abbreviated
arguments, `answer: ...`, or `parse error: <raw text>`), `parse_error` (bool) and `outcome`
("success" / "failure" for terminal nodes, else None). `pick_trees` chooses a solved tree
(one that also holds a failed leaf when there is one) and an unsolved tree; `draw_trees` draws
them side by side: depth left to right, colour = Q, parse errors as squares, terminal successes
outlined green and failures red, with a legend.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

LABEL_WIDTH = 32
MAX_DRAWN = 60


def clip(text: str, width: int) -> str:
    """`text` with whitespace collapsed, cut to `width` characters (an ellipsis marks a cut)."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _argument(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(clip(value, 12), ensure_ascii=False)
    return clip(json.dumps(value, ensure_ascii=False, separators=(",", ":")), 12)


def action_label(action_json: str | None, action_text: str | None, parse_error: str | None,
                 width: int = LABEL_WIDTH) -> str:
    """A short text of one action: `name(arg=value, ...)` per tool call (`;` between calls),
    `answer: <text>`, or `parse error: <raw text>`; at most `width` characters."""
    action: dict[str, Any] = {}
    if action_json:
        try:
            loaded = json.loads(action_json)
            action = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            action = {}
    if parse_error is not None or action.get("parse_error") is not None:
        return clip("parse error: " + (action_text or action.get("text") or ""), width)
    calls = [c for c in action.get("tool_calls") or [] if isinstance(c, dict)]
    if calls:
        shown = []
        for call in calls:
            arguments = call.get("arguments") if isinstance(call.get("arguments"), dict) else {}
            shown.append(f"{call.get('name')}(" + ", ".join(f"{k}={_argument(v)}" for k, v in arguments.items()) + ")")
        return clip("; ".join(shown), width)
    if action.get("final_answer") is not None:
        return clip(f"answer: {action['final_answer']}", width)
    return clip(action_text or "", width)


def _kept_nodes(graph: Any, max_nodes: int) -> set[int]:
    """At most `max_nodes` nodes closed under ancestors: the path to the most visited success
    and to the most visited failure first, then the most visited nodes."""
    import networkx as nx

    if graph.number_of_nodes() <= max_nodes:
        return set(graph.nodes)
    by_visits = sorted(graph.nodes, key=lambda n: (-(graph.nodes[n].get("visits") or 0), n))
    first = [next((n for n in by_visits if graph.nodes[n].get("success")), None),
             next((n for n in by_visits if graph.nodes[n].get("terminal") and not graph.nodes[n].get("success")), None)]
    kept: set[int] = set()
    for node in [n for n in first if n is not None] + by_visits:
        needed = ({node} | nx.ancestors(graph, node)) - kept
        if len(kept) + len(needed) <= max_nodes:
            kept |= needed
        if len(kept) >= max_nodes:
            break
    return kept


def labelled_tree(graph: Any, *, max_nodes: int = MAX_DRAWN, width: int = LABEL_WIDTH) -> Any:
    """The drawn form of a stored tree: a networkx DiGraph of at most `max_nodes` nodes (see
    _kept_nodes). Node attributes: label (str: the action into the node; the root's is
    `task <task_id>`), parse_error (bool), outcome ("success" | "failure" | None), q, visits,
    depth; edge attributes: label (the child's label). Graph attributes: run_id, tree_id,
    task_id, nodes_total, nodes_drawn."""
    import networkx as nx

    kept = _kept_nodes(graph, max_nodes)
    out = nx.DiGraph(run_id=graph.graph.get("run_id"), tree_id=graph.graph.get("tree_id"),
                     nodes_total=graph.number_of_nodes(), nodes_drawn=len(kept))
    for node in sorted(kept):
        data = graph.nodes[node]
        if data.get("parent_id") is None:
            label = clip(f"task {data.get('task_id')}", width)
            out.graph["task_id"] = data.get("task_id")
        else:
            label = action_label(data.get("action_json"), data.get("action_text"), data.get("parse_error"), width)
        outcome = "success" if data.get("success") else ("failure" if data.get("terminal") else None)
        out.add_node(node, label=label, parse_error=data.get("parse_error") is not None, outcome=outcome,
                     q=data.get("q"), visits=data.get("visits") or 0, depth=data.get("depth"),
                     action_index=data.get("action_index"))
    for parent, child in graph.edges:
        if parent in kept and child in kept:
            out.add_edge(parent, child, label=out.nodes[child]["label"])
    return out


def tree_layout(graph: Any) -> dict[int, tuple[float, float]]:
    """Positions: x = depth, y = leaf order of a depth-first walk (children by action index),
    an inner node at the middle of its children; no edges cross."""
    roots = [n for n in graph.nodes if graph.in_degree(n) == 0]
    pos: dict[int, tuple[float, float]] = {}
    next_leaf = [0.0]

    def place(node: int, depth: int) -> float:
        children = sorted(graph.successors(node), key=lambda c: (graph.nodes[c].get("action_index") or 0, c))
        if children:
            ys = [place(c, depth + 1) for c in children]
            y = (ys[0] + ys[-1]) / 2
        else:
            y = next_leaf[0]
            next_leaf[0] += 1.0
        pos[node] = (float(depth), -y)
        return y

    for root in sorted(roots):
        place(root, 0)
    return pos


def pick_trees(nodes: pl.LazyFrame) -> dict[str, tuple[str, str] | None]:
    """{"solved": (run_id, tree_id), "unsolved": (run_id, tree_id)} from node rows carrying
    `round` (i64 or null). Solved: a tree with a successful leaf, preferring one that also has a
    failed leaf, then the latest round, then the most nodes; unsolved: a tree without success,
    preferring one with a failed leaf, then the latest round, then the most nodes. None where
    no tree qualifies."""
    trees = (
        nodes.group_by("run_id", "round", "tree_id")
        .agg(n=pl.len(), successes=pl.col("success").fill_null(False).sum(),
             failures=(pl.col("terminal").fill_null(False) & ~pl.col("success").fill_null(False)).sum())
        .with_columns(mixed=pl.col("failures") > 0)
        .collect()
    )
    chosen: dict[str, tuple[str, str] | None] = {}
    for name, part in (("solved", trees.filter(pl.col("successes") > 0)),
                       ("unsolved", trees.filter(pl.col("successes") == 0))):
        part = part.sort(["mixed", "round", "n", "run_id", "tree_id"], descending=[True, True, True, False, False],
                         nulls_last=True)
        chosen[name] = (part["run_id"][0], part["tree_id"][0]) if part.height else None
    return chosen


def draw_trees(panels: list[tuple[Any, str]], path: Path) -> Path:
    """Draw labelled trees (labelled_tree) side by side, one titled panel each, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx
    from matplotlib.lines import Line2D

    layouts = [tree_layout(g) for g, _ in panels]
    depths = [max((x for x, _ in p.values()), default=0) + 1 for p in layouts]
    leaves = [max((-y for _, y in p.values()), default=0) + 1 for p in layouts]
    widths = [2.6 * d + 0.5 for d in depths]
    height = min(30.0, max(3.5, 0.3 * max(leaves) + 1.5))
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths) + 1.2, height), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    drawn = None
    for ax, (graph, title), pos in zip(axes[0], panels, layouts):
        nx.draw_networkx_edges(graph, pos, ax=ax, arrows=False, edge_color="#999999")
        for shape, nodes in (("o", [n for n in graph.nodes if not graph.nodes[n]["parse_error"]]),
                             ("s", [n for n in graph.nodes if graph.nodes[n]["parse_error"]])):
            if not nodes:
                continue
            outline = ["green" if graph.nodes[n]["outcome"] == "success" else
                       "red" if graph.nodes[n]["outcome"] == "failure" else "black" for n in nodes]
            q = [graph.nodes[n]["q"] if graph.nodes[n]["q"] is not None else 0.0 for n in nodes]
            drawn = nx.draw_networkx_nodes(graph, pos, nodelist=nodes, ax=ax, node_shape=shape, node_color=q,
                                           cmap="coolwarm_r", vmin=0.0, vmax=1.0, edgecolors=outline,
                                           linewidths=2.0, node_size=110)
        for node, (x, y) in pos.items():
            # Model text is drawn as is: parse_math=False keeps a "$" from starting mathtext.
            ax.text(x + 0.08, y, f"{graph.nodes[node]['label']}  N={graph.nodes[node]['visits']}", fontsize=6,
                    va="center", ha="left", parse_math=False)
        ax.set_xlim(-0.3, max(x for x, _ in pos.values()) + 2.4)
        ax.set_title(title, fontsize=8, loc="left")
        ax.axis("off")
    legend = [
        Line2D([], [], marker="o", linestyle="", markerfacecolor="#cccccc", markeredgecolor="black", label="action parsed"),
        Line2D([], [], marker="s", linestyle="", markerfacecolor="#cccccc", markeredgecolor="black", label="parse error"),
        Line2D([], [], marker="o", linestyle="", markerfacecolor="white", markeredgecolor="green", markeredgewidth=2,
               label="terminal: success"),
        Line2D([], [], marker="o", linestyle="", markerfacecolor="white", markeredgecolor="red", markeredgewidth=2,
               label="terminal: failure"),
    ]
    fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=7, frameon=False)
    if drawn is not None:
        fig.colorbar(drawn, ax=list(axes[0]), label="Q", fraction=0.02, pad=0.01)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path
