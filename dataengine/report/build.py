"""The run report: one HTML page (plus the same in markdown, and the figures as PNG files).

`build_report(store, runs, out_dir)` covers any set of run ids (dataengine.report.runs): the
rows of each run and of its sub-runs (a pipeline writes `<run>/r<round>` for each round's search
and `<run>/r<round>/eval` for the evaluation after it; round 0 is the starting model), the models
trained on their data or from those models, and the evals of those models. It writes:

- success by round and suite of the generated trajectories, and every evaluation metric with
  its 95% interval (by round for a pipeline, by model for separate commands);
- training curves of the joined checkpoints (loss per logged step; reward for GRPO) from the
  `log_history` recorded in their metrics;
- distributions: trajectory rewards, node Q and leaf value estimates (histograms);
- verifier pass rates, why episodes fail, derived datasets, preference pair margins, checkpoints, runs;
- a solved and an unsolved search tree side by side (dataengine.report.trees), nodes labelled
  with their actions, parse errors marked.

`report_tables` returns the same numbers as Polars DataFrames, for tests and notebooks.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from dataengine.report.failures import failure_kinds
from dataengine.report.runs import Selection, run_filter, select_runs

ROUND = re.compile(r"/r(\d+)(?:/|$)")
CURVE_KEYS = ("loss", "reward", "grad_norm", "learning_rate")

__all__ = ["Report", "build_report", "report_tables", "round_of", "run_filter", "select_runs", "training_curves"]


def round_of(run_id: str) -> int | None:
    """The round number in a pipeline run id (`<run>/r2` or `<run>/r2/eval` -> 2); None for a
    run id without one (a single generate run)."""
    found = ROUND.search(run_id)
    return int(found.group(1)) if found else None


def with_round(frame: pl.LazyFrame) -> pl.LazyFrame:
    """Add `round` (i64; null when the run id has none) parsed from run_id."""
    return frame.with_columns(round=pl.col("run_id").str.extract(r"/r(\d+)(?:/|$)", 1).cast(pl.Int64))


@dataclass
class Report:
    """What `build_report` wrote: the html and markdown paths, the PNG figures, the tables, and
    the trees drawn ({"solved" | "unsolved": (run_id, tree_id)})."""

    html: Path
    markdown: Path
    figures: dict[str, Path] = field(default_factory=dict)
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    trees: dict[str, tuple[str, str] | None] = field(default_factory=dict)


def _metrics(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def training_curves(models: pl.DataFrame) -> pl.DataFrame:
    """One row per logged training step of each model in `models` (columns model_id, kind,
    metrics_json): model_id, kind, step, loss, reward, grad_norm, learning_rate (f64, null
    where not logged), from metrics_json's `log_history` (dataengine.train.base.log_history).
    Checkpoints written before log histories were recorded contribute no rows."""
    rows: list[dict[str, Any]] = []
    for model in models.iter_rows(named=True):
        history = _metrics(model.get("metrics_json")).get("log_history")
        if not isinstance(history, dict) or not isinstance(history.get("step"), list):
            continue
        for i, step in enumerate(history["step"]):
            row = {"model_id": model["model_id"], "kind": model.get("kind"), "step": step}
            for key in CURVE_KEYS:
                values = history.get(key)
                row[key] = values[i] if isinstance(values, list) and i < len(values) else None
            rows.append(row)
    schema = {"model_id": pl.String, "kind": pl.String, "step": pl.Int64, **{k: pl.Float64 for k in CURVE_KEYS}}
    return pl.DataFrame(rows, schema=schema, strict=False)


def report_tables(store: Any, runs: str | Iterable[str], selection: Selection | None = None) -> dict[str, pl.DataFrame]:
    """The report's numbers for `runs` (one id or several; each with its sub-runs, joined as
    dataengine.report.runs.select_runs says).

    Returns DataFrames:
      runs: run_id, shard_id, kind, model_id, created_at (sorted by time);
      search_success: run_id, round, suite, source, episodes, successes, mean_reward, success_rate;
      evals: run_id, round, model_id, suite, metric, value, ci_low, ci_high, n;
      verifiers: verifier, version, verdicts, applicable, passed, mean_score (over applicable
        verdicts; every score is in [0, 1]), pass_rate;
      failures: run_id, suite, kind, episodes, share (dataengine.report.failures: why episodes fail,
        by their first tool turn);
      datasets: table, run_id, kind, rows (derived pairs / sft / replay rows);
      pair_counts: run_id, kind, pairs, mean_margin;
      pair_audit: run_id, suite, pairs and one column per verdict of dataengine.derive.audit
        (the step pairs against the tasks' gold), gold_share;
      models: model_id, parent_id, kind, via (why it is in the report), run_id, steps,
        first_loss, last_loss, path;
      training: model_id, kind, step, loss, reward, grad_norm, learning_rate (training_curves).
    Raises ValueError naming a run the store holds no rows of.
    """
    sel = selection or select_runs(store, runs)
    scan = store.scan_or_empty
    trajs = with_round(scan("trajectories").filter(sel.rows()))
    tables: dict[str, pl.DataFrame] = {}
    tables["runs"] = (scan("runs").filter(sel.run_rows())
                      .select("run_id", "shard_id", "kind", "model_id", "created_at").sort("created_at").collect())
    tables["search_success"] = (
        trajs.group_by("run_id", "round", "suite", "source")
        .agg(
            episodes=pl.len(),
            successes=pl.col("success").fill_null(False).sum().cast(pl.Int64),
            mean_reward=pl.col("reward").mean(),
        )
        .with_columns(success_rate=pl.col("successes") / pl.col("episodes"))
        .sort("round", "run_id", "suite", "source", nulls_last=True)
        .collect()
    )
    tables["evals"] = (
        with_round(scan("evals").filter(sel.eval_rows()))
        .select("run_id", "round", "model_id", "suite", "metric", "value", "ci_low", "ci_high", "n")
        .sort("round", "run_id", "model_id", "suite", "metric", nulls_last=True)
        .collect()
    )
    tables["verifiers"] = (
        trajs.select("verdicts")
        .explode("verdicts")
        .drop_nulls("verdicts")
        .unnest("verdicts")
        # one row per version: a version may change the score's scale (arguments_numeric 1 -> 2)
        .group_by(pl.col("name").alias("verifier"), "version")
        .agg(
            verdicts=pl.len(),
            applicable=pl.col("passed").is_not_null().sum().cast(pl.Int64),
            passed=pl.col("passed").fill_null(False).sum().cast(pl.Int64),
            # a verdict that does not apply scores 0 by convention: not part of the mean
            mean_score=pl.col("score").filter(pl.col("passed").is_not_null()).mean(),
        )
        .with_columns(pass_rate=pl.when(pl.col("applicable") > 0).then(pl.col("passed") / pl.col("applicable")))
        .sort("verifier", "version")
        .collect()
    )
    tables["failures"] = failure_kinds(trajs.select("run_id", "suite", "success", "messages_json").collect())
    derived = [
        scan(t).filter(sel.rows()).select(pl.lit(t).alias("table"), "run_id",
                                          (pl.col("kind") if t != "replay" else pl.lit(None, pl.String)).alias("kind"))
        for t in ("pairs", "sft", "replay")
    ]
    tables["datasets"] = (pl.concat(derived).group_by("table", "run_id", "kind").agg(rows=pl.len())
                          .sort("table", "run_id", "kind", nulls_last=True).collect())
    tables["pair_counts"] = (
        scan("pairs").filter(sel.rows())
        .group_by("run_id", "kind")
        .agg(pairs=pl.len(), mean_margin=pl.col("margin").mean())
        .sort("run_id", "kind")
        .collect()
    )
    from dataengine.derive.audit import report_audit

    tables["pair_audit"] = report_audit(scan("pairs").filter(sel.rows()), scan("tasks"))
    models = (scan("models").filter(sel.model_rows())
              .select("model_id", "parent_id", "kind", "run_id", "path", "metrics_json", "created_at")
              .sort("created_at", "model_id").collect().unique("model_id", keep="last", maintain_order=True))
    curves = training_curves(models)
    tables["training"] = curves
    summary = curves.drop_nulls("loss").group_by("model_id").agg(first_loss=pl.col("loss").first(),
                                                                 last_loss=pl.col("loss").last())
    steps = pl.Series("steps", [_metrics(m).get("steps") for m in models["metrics_json"].to_list()], dtype=pl.Int64)
    tables["models"] = (
        models.with_columns(steps, via=pl.col("model_id").replace_strict(sel.models, default="", return_dtype=pl.String))
        .join(summary, on="model_id", how="left")
        .select("model_id", "parent_id", "kind", "via", "run_id", "steps", "first_loss", "last_loss", "path")
    )
    return tables


def _values(store: Any, table: str, column: str, sel: Selection) -> list[float]:
    return (
        store.scan_or_empty(table).filter(sel.rows()).select(pl.col(column).cast(pl.Float64)).drop_nulls()
        .collect().to_series().to_list()
    )


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


def _short(model_id: str, width: int = 26) -> str:
    name, _, digest = model_id.partition("@")
    return (name[: width - 8] + "@" + digest[:6]) if digest else model_id[:width]


def _curves_plot(curves: pl.DataFrame, path: Path) -> Path | None:
    """Loss per step for every model; reward per step beside it when any model logged one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if curves.drop_nulls("loss").is_empty() and curves.drop_nulls("reward").is_empty():
        return None
    keys = [k for k in ("loss", "reward") if not curves.drop_nulls(k).is_empty()]
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 3.5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for (model, kind), part in curves.drop_nulls(key).group_by("model_id", "kind", maintain_order=True):
            part = part.sort("step")
            ax.plot(part["step"].to_list(), part[key].to_list(), marker="." if part.height < 30 else None,
                    label=f"{kind}: {_short(model)}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(f"training {key} per logged step", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _evals_plot(evals: pl.DataFrame, order: list[str], path: Path) -> Path | None:
    """Greedy success with its 95% interval per model and suite (evals without a round)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    greedy = evals.filter((pl.col("metric") == "greedy_success") & pl.col("round").is_null())
    if greedy.is_empty():
        return None
    models = sorted(set(greedy["model_id"].to_list()), key=lambda m: (order.index(m) if m in order else len(order), m))
    suites = sorted(set(greedy["suite"].drop_nulls().to_list()))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(models) * max(len(suites), 1)), 3.6))
    width = 0.8 / max(len(suites), 1)
    for j, suite in enumerate(suites):
        part = greedy.filter(pl.col("suite") == suite).unique("model_id", keep="last")
        by_model = {r["model_id"]: r for r in part.iter_rows(named=True)}
        xs = [i + j * width for i, m in enumerate(models) if m in by_model]
        rows = [by_model[m] for m in models if m in by_model]
        values = [r["value"] for r in rows]
        low = [max(r["value"] - (r["ci_low"] if r["ci_low"] is not None else r["value"]), 0) for r in rows]
        high = [max((r["ci_high"] if r["ci_high"] is not None else r["value"]) - r["value"], 0) for r in rows]
        ax.bar(xs, values, width=width, yerr=[low, high], capsize=3, label=suite)
    ax.set_xticks([i + width * (len(suites) - 1) / 2 for i in range(len(models))])
    ax.set_xticklabels([_short(m) for m in models], fontsize=7)
    ax.set_ylabel("greedy success (held-out)")
    ax.set_ylim(0, 1.05)
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
    ("Success by round and suite (generated episodes)", "search_success", "success"),
    ("Evaluation (held-out tasks, 95% intervals)", "evals", "evals"),
    ("Training curves", None, "curves"),
    ("Reward and value distributions", None, "distributions"),
    ("Verifier pass rates", "verifiers", None),
    ("Why episodes fail (by the first tool turn)", "failures", None),
    ("Derived datasets", "datasets", None),
    ("Preference pairs", "pair_counts", "margins"),
    ("Step pairs against the gold (read to report only: prefer gold, inverted, wrong over wrong)", "pair_audit", None),
    ("Checkpoints (how each is joined to the runs: via)", "models", None),
    ("Search trees: a solved and an unsolved tree", None, "trees"),
    ("Runs", "runs", None),
]


def _tree_figure(store: Any, sel: Selection, out: Path) -> tuple[Path | None, dict[str, tuple[str, str] | None], str]:
    """The side-by-side tree picture, the trees chosen, and a note on what is missing."""
    from dataengine.report.trees import draw_trees, labelled_tree, pick_trees
    from storage.queries import tree_graph

    chosen = pick_trees(with_round(store.scan_or_empty("nodes").filter(sel.rows())))
    panels = []
    for name, tree in chosen.items():
        if tree is None:
            continue
        graph = labelled_tree(tree_graph(store, *tree))
        shown = graph.graph["nodes_drawn"]
        size = f"{shown} of {graph.graph['nodes_total']} nodes" if shown < graph.graph["nodes_total"] else f"{shown} nodes"
        panels.append((graph, f"{name}: {tree[0]} tree {tree[1]} ({size}; labels: action, N = visits)"))
    missing = [name for name, tree in chosen.items() if tree is None]
    note = ("" if not panels or not missing else
            f"No {missing[0]} tree in these runs; only the {'unsolved' if missing[0] == 'solved' else 'solved'} one is drawn.")
    if not panels:
        return None, chosen, ""
    return draw_trees(panels, out / "search_trees.png"), chosen, note


def build_report(store: Any, runs: str | Iterable[str], out_dir: str | Path) -> Report:
    """Write `out_dir/report.html`, `out_dir/report.md` and the PNG figures for `runs` (one run
    id or several); see the module docstring."""
    out = Path(out_dir)
    sel = select_runs(store, runs)
    out.mkdir(parents=True, exist_ok=True)
    tables = report_tables(store, sel.runs, sel)
    figures: dict[str, Path] = {}

    def keep(name: str, made: Path | None) -> None:
        if made is not None:
            figures[name] = made

    keep("success", _success_plot(tables["search_success"], tables["evals"], out / "success_by_round.png"))
    order = sel.starting + tables["models"]["model_id"].to_list()
    keep("evals", _evals_plot(tables["evals"], order, out / "evals_by_model.png"))
    keep("curves", _curves_plot(tables["training"], out / "training_curves.png"))
    keep("distributions", _histograms(
        [
            ("trajectory reward", _values(store, "trajectories", "reward", sel)),
            ("node Q", _values(store, "nodes", "q", sel)),
            ("leaf value estimate", _values(store, "nodes", "value_estimate", sel)),
        ],
        out / "distributions.png",
    ))
    keep("margins", _histograms([("pair margin", _values(store, "pairs", "margin", sel))], out / "pair_margins.png"))
    tree_png, trees, tree_note = _tree_figure(store, sel, out)
    keep("trees", tree_png)

    name = ", ".join(sel.runs)
    md = [f"# Run report: {name}\n", f"Store: `{store.root}`\n"]
    body = [f"<h1>Run report: {html.escape(name)}</h1>", f"<p>Store: <code>{html.escape(str(store.root))}</code></p>"]
    for title, key, figure in SECTIONS:
        pictures = [figures[figure]] if figure in figures else []
        if key is None and not pictures:
            continue
        md.append(f"## {title}\n")
        body.append(f"<h2>{html.escape(title)}</h2>")
        if key is not None:
            md.append(_markdown_table(tables[key]))
            body.append(_html_table(tables[key]))
        if figure == "trees" and tree_note:
            md.append(tree_note + "\n")
            body.append(f"<p>{html.escape(tree_note)}</p>")
        for picture in pictures:
            md.append(f"![{picture.stem}]({picture.name})\n")
            body.append(f'<img src="{picture.name}" alt="{picture.stem}" style="max-width:100%">')
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;"
             "margin-bottom:1em}td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}th{background:#eee}")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>dataengine report {html.escape(name)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(page)
    md_path.write_text("\n".join(md))
    return Report(html=html_path, markdown=md_path, figures=figures, tables=tables, trees=trees)
