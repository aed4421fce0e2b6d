"""Search-tree pictures for the run report.

`labelled_tree` turns a stored tree (storage.queries.tree_graph) into the graph that is drawn:
every node carries `label`, a short text of the action into it (tool calls with abbreviated
arguments, `answer: ...`, or `parse error: <raw text>`), `parse_error` (bool) and `outcome`
("success" / "failure" for terminal nodes, else None). `pick_trees` chooses a solved tree
(one that also holds a failed leaf when there is one) and an unsolved tree; `draw_trees` draws
them side by side: depth left to right, colour = Q, parse errors as squares, terminal successes
outlined green and failures red, with a legend. Labels are measured with matplotlib's renderer
and the grid is sized to them (`tree_geometry`), so no two labels overlap and no edge crosses
a label.
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


# Picture geometry, in inches (1 data unit = 1 inch in every panel, so measured text fits).
FONT_SIZE = 6
MARKER_SIZE = 110  # points squared (scatter's unit)
ROW_GAP = 0.04  # between label boxes of neighbouring rows
LABEL_GAP = 0.06  # marker edge to its label
COLUMN_GAP = 0.35  # end of one depth's longest label to the next depth's markers, where edges run
DPI = 110  # text is measured at the dpi it is saved at (hinting makes widths dpi-dependent)


def node_text(graph: Any, node: int) -> str:
    """The text drawn beside a node: its label and visit count."""
    return f"{graph.nodes[node]['label']}  N={graph.nodes[node]['visits']}"


def _text_extents(texts: list[str]) -> list[tuple[float, float]]:
    """(width, height) in inches of each text as drawn (FONT_SIZE, no mathtext), measured by
    matplotlib's own renderer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(dpi=DPI)
    renderer = fig.canvas.get_renderer()
    out = []
    for text in texts:
        t = fig.text(0, 0, text, fontsize=FONT_SIZE, parse_math=False)
        box = t.get_window_extent(renderer)
        out.append((box.width / fig.dpi, box.height / fig.dpi))
        t.remove()
    plt.close(fig)
    return out


def tree_geometry(graph: Any) -> dict[str, Any]:
    """Where each part of a labelled tree goes, in inches, with no two labels overlapping.

    tree_layout's order (x = depth, y = leaf order) on a measured grid: every row is as tall as
    the tallest label (or marker) plus ROW_GAP, and each depth's column is as wide as its
    longest label, so a label ends before the next depth begins; nodes of one depth never
    share a row (their leaf ranges are disjoint). An edge runs from the end of its parent's
    column to the child's marker, in the gap between columns, with a leader line along the
    parent's row from its label to the column's end.
    Returns {"node": {id: (x, y) marker centre}, "text": {id: (x, y) left, centre of the
    label}, "box": {id: (x0, y0, x1, y1) label box}, "edges": [((x0, y0), (x1, y1), (x2, y2))
    leader start, column end, child marker], "size": (width, height)}.
    """
    order = tree_layout(graph)
    nodes = sorted(order)
    extents = dict(zip(nodes, _text_extents([node_text(graph, n) for n in nodes])))
    radius = (MARKER_SIZE ** 0.5) / 2 / 72  # scatter's size is the marker's area in points^2
    row = max([h for _, h in extents.values()] + [2 * radius]) + ROW_GAP
    depths = sorted({int(x) for x, _ in order.values()})
    column_width = {d: max(extents[n][0] for n in nodes if int(order[n][0]) == d) for d in depths}
    left, x = {}, radius + 0.03  # the marker's outline stays inside the panel
    for d in depths:
        left[d] = x
        x += radius + LABEL_GAP + column_width[d] + COLUMN_GAP + radius
    pos, text, box = {}, {}, {}
    for n in nodes:
        d, leaf = int(order[n][0]), -order[n][1]
        cx, cy = left[d], -(leaf + 0.5) * row
        pos[n] = (cx, cy)
        text[n] = (cx + radius + LABEL_GAP, cy)
        w, h = extents[n]
        box[n] = (text[n][0], cy - h / 2, text[n][0] + w, cy + h / 2)
    edges = []
    for parent, child in graph.edges:
        d = int(order[parent][0])
        end = left[d] + radius + LABEL_GAP + column_width[d] + COLUMN_GAP / 4
        start = (box[parent][2] + LABEL_GAP, pos[parent][1])
        edges.append((start, (end, pos[parent][1]), (pos[child][0] - radius, pos[child][1])))
    leaves = max((-y for _, y in order.values()), default=0) + 1
    return {"node": pos, "text": text, "box": box, "edges": edges,
            "size": (x - COLUMN_GAP - radius, leaves * row)}


def tree_figure(panels: list[tuple[Any, str]]) -> Any:
    """A matplotlib Figure of labelled trees (labelled_tree) side by side, one titled panel
    each; every panel's axes map one data unit to one inch (tree_geometry's coordinates)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    geometries = [tree_geometry(g) for g, _ in panels]
    margin, title, legend_h, bar_w, gap = 0.15, 0.3, 0.45, 0.9, 0.3
    widths = [max(g["size"][0], 2.5) for g in geometries]
    height = max(g["size"][1] for g in geometries)
    fig_w = margin + sum(widths) + gap * (len(panels) - 1) + bar_w
    fig_h = legend_h + height + title + margin
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=DPI)
    drawn = None
    x0 = margin
    for (graph, name), geo, w in zip(panels, geometries, widths):
        h = geo["size"][1]
        ax = fig.add_axes((x0 / fig_w, (fig_h - title - h) / fig_h, w / fig_w, h / fig_h))
        ax.set_xlim(0, w)
        ax.set_ylim(-h, 0)
        ax.axis("off")
        ax.set_title(name, fontsize=8, loc="left")
        ax.add_collection(LineCollection([list(e) for e in geo["edges"]], colors="#999999", linewidths=0.8))
        for shape, parse_error in (("o", False), ("s", True)):
            nodes = [n for n in graph.nodes if graph.nodes[n]["parse_error"] == parse_error]
            if not nodes:
                continue
            outline = ["green" if graph.nodes[n]["outcome"] == "success" else
                       "red" if graph.nodes[n]["outcome"] == "failure" else "black" for n in nodes]
            q = [graph.nodes[n]["q"] if graph.nodes[n]["q"] is not None else 0.0 for n in nodes]
            drawn = ax.scatter([geo["node"][n][0] for n in nodes], [geo["node"][n][1] for n in nodes], s=MARKER_SIZE,
                               c=q, cmap="coolwarm_r", vmin=0.0, vmax=1.0, marker=shape, edgecolors=outline,
                               linewidths=2.0, zorder=3)
        for node, (x, y) in geo["text"].items():
            # Model text is drawn as is: parse_math=False keeps a "$" from starting mathtext.
            ax.text(x, y, node_text(graph, node), fontsize=FONT_SIZE, va="center", ha="left", parse_math=False)
        x0 += w + gap
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
        bar = fig.add_axes(((fig_w - bar_w + 0.2) / fig_w, (fig_h - title - height) / fig_h, 0.12 / fig_w, height / fig_h))
        fig.colorbar(drawn, cax=bar, label="Q")
    return fig


def draw_trees(panels: list[tuple[Any, str]], path: Path) -> Path:
    """Draw labelled trees (labelled_tree) side by side, one titled panel each, to a PNG."""
    import matplotlib.pyplot as plt

    fig = tree_figure(panels)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
