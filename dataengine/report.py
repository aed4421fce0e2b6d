"""The run report: one HTML page (plus the same in markdown, and the figures as PNG files).

`build_report(store, run, out_dir)` reads every table row whose run_id is `run` or starts with
`run + "/"` (a pipeline writes `<run>/r<round>` for each round's search and
`<run>/r<round>/eval` for the evaluation after it; round 0 is the starting model), and writes:

- success by round and suite: search success of the generated trajectories and the
  evaluation metrics (greedy success with its 95% interval, ...) of each round;
- distributions: trajectory rewards, node Q and leaf value estimates (histograms);
- verifier pass rates per verifier (over the run's trajectories);
- preference pair margins (histogram and counts by kind);
- one rendered search tree (networkx + matplotlib, Agg backend): the largest tree of the
  latest round, nodes coloured by Q, terminal successes outlined green, failures red.

`report_tables` returns the same numbers as Polars DataFrames, for tests and notebooks.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

ROUND = re.compile(r"/r(\d+)(?:/|$)")


def round_of(run_id: str) -> int | None:
    """The round number in a pipeline run id (`<run>/r2` or `<run>/r2/eval` -> 2); None for a
    run id without one (a single generate run)."""
    found = ROUND.search(run_id)
    return int(found.group(1)) if found else None


def run_filter(run: str) -> pl.Expr:
    """Rows of `run` and of its sub-runs (`run/...`)."""
    return (pl.col("run_id") == run) | pl.col("run_id").str.starts_with(run + "/")


def with_round(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Add `round` (i64; null when the run id has none) parsed from run_id."""
    return frame.with_columns(round=pl.col("run_id").str.extract(r"/r(\d+)(?:/|$)", 1).cast(pl.Int64))


@dataclass
class Report:
    """What `build_report` wrote: the html and markdown paths, the PNG figures, the tables."""

    html: Path
    markdown: Path
    figures: dict[str, Path] = field(default_factory=dict)
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)


def _scan(store: Any, table: str, run: str) -> pl.LazyFrame:
    return store.scan_or_empty(table).filter(run_filter(run))


def report_tables(store: Any, run: str) -> dict[str, pl.DataFrame]:
    """The report's numbers for `run` (and its sub-runs).

    Returns DataFrames:
      runs: run_id, shard_id, kind, model_id, created_at (sorted by time);
      search_success: round, suite, source, episodes, successes, success_rate, mean_reward;
      evals: round, model_id, suite, metric, value, ci_low, ci_high, n;
      verifiers: verifier, verdicts, applicable, passed, pass_rate, mean_score;
      pair_counts: kind, pairs, mean_margin;
      models: model_id, parent_id, kind, path.
    Raises ValueError when the store holds no rows of `run`.
    """
    runs = _scan(store, "runs", run).collect()
    trajs = with_round(_scan(store, "trajectories", run))
    if runs.is_empty() and trajs.select(pl.len()).collect().item() == 0:
        have = []
        if store.has_table("runs"):
            have = store.runs().select("run_id").unique().collect()["run_id"].sort().to_list()
        raise ValueError(f"store {store.root} has no rows of run {run!r}; runs there: {', '.join(have[:20]) or 'none'}")
    tables: dict[str, pl.DataFrame] = {}
    tables["runs"] = runs.select("run_id", "shard_id", "kind", "model_id", "created_at").sort("created_at")
    tables["search_success"] = (
        trajs.group_by("round", "suite", "source")
        .agg(
            episodes=pl.len(),
            successes=pl.col("success").fill_null(False).sum().cast(pl.Int64),
            mean_reward=pl.col("reward").mean(),
        )
        .with_columns(success_rate=pl.col("successes") / pl.col("episodes"))
        .sort("round", "suite", "source", nulls_last=True)
        .collect()
    )
    tables["evals"] = (
        with_round(_scan(store, "evals", run))
        .select("round", "model_id", "suite", "metric", "value", "ci_low", "ci_high", "n")
        .sort("round", "suite", "metric", nulls_last=True)
        .collect()
    )
    tables["verifiers"] = (
        trajs.select("verdicts")
        .explode("verdicts")
        .drop_nulls("verdicts")
        .unnest("verdicts")
        .group_by(pl.col("name").alias("verifier"))
        .agg(
            verdicts=pl.len(),
            applicable=pl.col("passed").is_not_null().sum().cast(pl.Int64),
            passed=pl.col("passed").fill_null(False).sum().cast(pl.Int64),
            mean_score=pl.col("score").mean(),
        )
        .with_columns(pass_rate=pl.when(pl.col("applicable") > 0).then(pl.col("passed") / pl.col("applicable")))
        .sort("verifier")
        .collect()
    )
    tables["pair_counts"] = (
        _scan(store, "pairs", run)
        .group_by("kind")
        .agg(pairs=pl.len(), mean_margin=pl.col("margin").mean())
        .sort("kind")
        .collect()
    )
    tables["models"] = _scan(store, "models", run).select("model_id", "parent_id", "kind", "path").collect()
    return tables


def _values(store: Any, table: str, column: str, run: str) -> list[float]:
    return (
        _scan(store, table, run).select(pl.col(column).cast(pl.Float64)).drop_nulls().collect().to_series().to_list()
    )


def largest_tree(store: Any, run: str) -> tuple[str, str] | None:
    """(run_id, tree_id) of the tree with the most nodes in the latest round of `run`, or None."""
    counts = (
        with_round(_scan(store, "nodes", run))
        .group_by("run_id", "round", "tree_id")
        .agg(n=pl.len(), successes=pl.col("success").fill_null(False).sum())
        .sort(["round", "successes", "n", "tree_id"], descending=[True, True, True, False], nulls_last=True)
        .collect()
    )
    if counts.is_empty():
        return None
    return counts["run_id"][0], counts["tree_id"][0]


def draw_tree(graph: Any, path: Path, *, title: str = "", max_nodes: int = 300) -> Path:
    """Render a search tree (storage.queries.tree_graph) to a PNG: one row per depth, nodes
    coloured by Q, terminal successes outlined green and failures red, labels = visits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    if graph.number_of_nodes() > max_nodes:
        # Keep the most visited nodes (and so their ancestors, which have at least their visits).
        keep = sorted(graph.nodes, key=lambda n: (-(graph.nodes[n].get("visits") or 0), n))[:max_nodes]
        graph = graph.subgraph(keep).copy()
    root = min(graph.nodes)
    pos = nx.bfs_layout(graph, root, align="horizontal")
    # bfs_layout puts depth on the y axis growing downward only after a flip.
    pos = {n: (x, -y) for n, (x, y) in pos.items()}
    q = [graph.nodes[n].get("q") for n in graph.nodes]
    colours = [v if v is not None else 0.0 for v in q]
    edge = ["green" if graph.nodes[n].get("success") else ("red" if graph.nodes[n].get("terminal") else "black")
            for n in graph.nodes]
    width = max(6.0, min(30.0, 0.35 * graph.number_of_nodes()))
    fig, ax = plt.subplots(figsize=(width, 5))
    nx.draw_networkx_edges(graph, pos, ax=ax, arrows=False, edge_color="#999999")
    drawn = nx.draw_networkx_nodes(graph, pos, ax=ax, node_color=colours, cmap="coolwarm_r", vmin=0.0, vmax=1.0,
                                   edgecolors=edge, linewidths=2.0, node_size=220)
    nx.draw_networkx_labels(graph, pos, ax=ax, labels={n: str(graph.nodes[n].get("visits") or 0) for n in graph.nodes},
                            font_size=7, font_color="black")
    fig.colorbar(drawn, ax=ax, label="Q")
    ax.set_title(title or "search tree (labels: visits)", fontsize=9, loc="left")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _histograms(panels: list[tuple[str, list[float]]], path: Path, *, bins: int = 20) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t, v) for t, v in panels if v]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (title, values) in zip(axes[0], panels):
        ax.hist(values, bins=bins, color="#4477aa")
        ax.set_title(f"{title} (n={len(values)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _success_plot(success: pl.DataFrame, evals: pl.DataFrame, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    greedy = evals.filter(pl.col("metric") == "greedy_success").drop_nulls("round")
    # Evaluation episodes are already the greedy line; the dashed lines are the generated data.
    search = success.drop_nulls("round").filter(~pl.col("source").fill_null("").str.starts_with("eval"))
    if greedy.is_empty() and search.is_empty():
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for suite in sorted(set(greedy["suite"].drop_nulls().to_list())):
        part = greedy.filter(pl.col("suite") == suite).sort("round")
        # Clipped at 0: a Wilson bound at 0 or 1 may differ from the value by rounding only.
        low = (part["value"] - part["ci_low"]).fill_null(0).clip(lower_bound=0).to_list()
        high = (part["ci_high"] - part["value"]).fill_null(0).clip(lower_bound=0).to_list()
        ax.errorbar(part["round"].to_list(), part["value"].to_list(), yerr=[low, high], marker="o", capsize=3,
                    label=f"{suite}: greedy (held-out)")
    for (suite, source), part in search.group_by("suite", "source", maintain_order=True):
        part = part.sort("round")
        ax.plot(part["round"].to_list(), part["success_rate"].to_list(), linestyle="--", marker="x",
                label=f"{suite}: {source} episodes")
    rounds = sorted(set(greedy["round"].to_list()) | set(search["round"].to_list()))
    ax.set_xticks(rounds)
    ax.set_xlabel("round")
    ax.set_ylabel("success")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _markdown_table(frame: pl.DataFrame, digits: int = 3) -> str:
    if frame.is_empty():
        return "_none_\n"
    def cell(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.{digits}f}"
        return str(v).replace("|", "\\|")
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join(lines) + "\n"


def _html_table(frame: pl.DataFrame, digits: int = 3) -> str:
    if frame.is_empty():
        return "<p><em>none</em></p>"
    def cell(v: Any) -> str:
        if v is None:
            return ""
        return f"{v:.{digits}f}" if isinstance(v, float) else html.escape(str(v))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in frame.iter_rows())
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


SECTIONS = [
    ("Success by round and suite (generated episodes)", "search_success"),
    ("Evaluation by round (held-out tasks, 95% intervals)", "evals"),
    ("Verifier pass rates", "verifiers"),
    ("Preference pairs", "pair_counts"),
    ("Checkpoints", "models"),
    ("Runs", "runs"),
]


def build_report(store: Any, run: str, out_dir: str | Path) -> Report:
    """Write `out_dir/report.html`, `out_dir/report.md` and the PNG figures for `run`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables = report_tables(store, run)
    figures: dict[str, Path] = {}
    success = _success_plot(tables["search_success"], tables["evals"], out / "success_by_round.png")
    if success:
        figures["success"] = success
    dists = _histograms(
        [
            ("trajectory reward", _values(store, "trajectories", "reward", run)),
            ("node Q", _values(store, "nodes", "q", run)),
            ("leaf value estimate", _values(store, "nodes", "value_estimate", run)),
        ],
        out / "distributions.png",
    )
    if dists:
        figures["distributions"] = dists
    margins = _histograms([("pair margin", _values(store, "pairs", "margin", run))], out / "pair_margins.png")
    if margins:
        figures["margins"] = margins
    tree = largest_tree(store, run)
    if tree is not None:
        from storage.queries import tree_graph

        run_id, tree_id = tree
        graph = tree_graph(store, run_id, tree_id)
        figures["tree"] = draw_tree(graph, out / "search_tree.png",
                                    title=f"{run_id} tree {tree_id}: {graph.number_of_nodes()} nodes (labels: visits)")

    placement = {"search_success": "success", "evals": None, "verifiers": None, "pair_counts": "margins"}
    md = [f"# Run report: {run}\n", f"Store: `{store.root}`\n"]
    body = [f"<h1>Run report: {html.escape(run)}</h1>", f"<p>Store: <code>{html.escape(str(store.root))}</code></p>"]
    for title, key in SECTIONS:
        md += [f"## {title}\n", _markdown_table(tables[key])]
        body += [f"<h2>{html.escape(title)}</h2>", _html_table(tables[key])]
        fig = figures.get(placement.get(key) or "")
        if fig is not None:
            md.append(f"![{key}]({fig.name})\n")
            body.append(f'<img src="{fig.name}" alt="{key}">')
        if key == "evals" and "distributions" in figures:
            md += ["## Reward and value distributions\n", f"![distributions]({figures['distributions'].name})\n"]
            body += ["<h2>Reward and value distributions</h2>", f'<img src="{figures["distributions"].name}" alt="distributions">']
    if "tree" in figures:
        md += ["## A search tree\n", f"![tree]({figures['tree'].name})\n"]
        body += ["<h2>A search tree</h2>", f'<img src="{figures["tree"].name}" alt="search tree" style="max-width:100%">']
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
             "margin-bottom:1em}td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}th{background:#eee}")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>dataengine report {html.escape(run)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(page)
    md_path.write_text("\n".join(md))
    return Report(html=html_path, markdown=md_path, figures=figures, tables=tables)
