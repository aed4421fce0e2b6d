"""Common questions over the store, as Polars LazyFrames the caller can compose.

All functions take a `Store` and return a LazyFrame (call `.collect()`), except `tree_graph`.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import polars as pl

from storage.errors import StoreError
from storage.store import Store

SUCCESS_GROUPS = ("suite", "task_id", "run_id", "model_id", "split", "source")


def _check_by(by: Sequence[str], allowed: Sequence[str], what: str) -> list[str]:
    by = [by] if isinstance(by, str) else list(by)
    bad = [b for b in by if b not in allowed]
    if bad:
        raise ValueError(f"{what}: cannot group by {', '.join(bad)}; choose from {', '.join(allowed)}")
    return by


def success_rate(store: Store, by: Sequence[str] = ("suite",), *, source: str | None = None) -> pl.LazyFrame:
    """Success rate of trajectories per group.

    Columns: the `by` columns, `episodes` (u32), `successes` (u32), `success_rate` (f64, nulls in
    `success` count as failures), `mean_reward` (f64). `source` keeps one trajectory source
    (e.g. "greedy").
    """
    by = _check_by(by, SUCCESS_GROUPS, "success_rate")
    frame = store.trajectories()
    if source is not None:
        frame = frame.filter(pl.col("source") == source)
    return (
        frame.group_by(by)
        .agg(
            episodes=pl.len(),
            successes=pl.col("success").fill_null(False).sum().cast(pl.UInt32),
            mean_reward=pl.col("reward").mean(),
        )
        .with_columns(success_rate=pl.col("successes") / pl.col("episodes"))
        .sort(by)
    )


def verifier_pass_rates(store: Store, *, table: str = "trajectories", by: Sequence[str] = ()) -> pl.LazyFrame:
    """Pass rate of every verifier (verdicts exploded), per verifier name and version.

    Columns: the `by` columns, `verifier`, `version`, `verdicts` (u32: rows with that verdict),
    `applicable` (u32: passed not null), `passed` (u32), `pass_rate` (f64 over applicable; null when none applies),
    `mean_score` (f64), `mean_confidence` (f64).
    """
    if table not in ("trajectories", "nodes"):
        raise ValueError(f"verifier_pass_rates reads trajectories or nodes, not {table!r}")
    by = _check_by(by, SUCCESS_GROUPS, "verifier_pass_rates")
    frame = (
        store.scan(table)
        .select(*by, "verdicts")
        .explode("verdicts")
        .drop_nulls("verdicts")
        .unnest("verdicts")
        .rename({"name": "verifier"})
    )
    keys = [*by, "verifier", "version"]
    return (
        frame.group_by(keys)
        .agg(
            verdicts=pl.len(),
            applicable=pl.col("passed").is_not_null().sum().cast(pl.UInt32),
            passed=pl.col("passed").fill_null(False).sum().cast(pl.UInt32),
            mean_score=pl.col("score").mean(),
            mean_confidence=pl.col("confidence").mean(),
        )
        .with_columns(
            pass_rate=pl.when(pl.col("applicable") > 0).then(pl.col("passed") / pl.col("applicable"))
        )
        .sort(keys)
    )


def node_stats(store: Store, by: Sequence[str] = ("depth",)) -> pl.LazyFrame:
    """Visit and value distributions of tree nodes per group (default: per depth).

    Columns: the `by` columns, `nodes` (u32), and for each of visits, q, value_estimate,
    critic_score: `<col>_mean`, `<col>_p10`, `<col>_p50`, `<col>_p90` (f64), plus
    `terminal_rate` (f64).
    """
    allowed = ("depth", "suite", "task_id", "run_id", "model_id", "tree_id", "terminal")
    by = _check_by(by, allowed, "node_stats")
    stats = []
    for col in ("visits", "q", "value_estimate", "critic_score"):
        c = pl.col(col).cast(pl.Float64)
        stats += [
            c.mean().alias(f"{col}_mean"),
            c.quantile(0.1).alias(f"{col}_p10"),
            c.quantile(0.5).alias(f"{col}_p50"),
            c.quantile(0.9).alias(f"{col}_p90"),
        ]
    return (
        store.nodes()
        .group_by(by)
        .agg(pl.len().alias("nodes"), pl.col("terminal").cast(pl.Float64).mean().alias("terminal_rate"), *stats)
        .sort(by)
    )


def histogram(store: Store, column: str = "visits", *, bins: int = 10, table: str = "nodes") -> pl.DataFrame:
    """Histogram of a numeric column: columns `breakpoint`, `category`, `count` (Polars hist)."""
    series = store.scan(table).select(pl.col(column).cast(pl.Float64)).drop_nulls().collect().to_series()
    return series.hist(bin_count=bins)


def tree_graph(store: Store, run_id: str, tree_id: str) -> nx.DiGraph:
    """One search tree as a networkx DiGraph.

    Nodes are node_id ints with every column of the nodes table as attributes (verdicts as a
    list of dicts); edges go parent -> child with attributes action_index, action_text, prior.
    """
    frame = store.nodes().filter((pl.col("run_id") == run_id) & (pl.col("tree_id") == tree_id)).collect()
    if frame.is_empty():
        raise StoreError(f"no nodes of tree {tree_id!r} in run {run_id!r} in {store.root}")
    if frame["node_id"].n_unique() != frame.height:
        raise StoreError(f"tree {tree_id!r} of run {run_id!r} has duplicate node_ids")
    graph = nx.DiGraph(run_id=run_id, tree_id=tree_id)
    rows = frame.sort("node_id").to_dicts()
    for row in rows:
        graph.add_node(row["node_id"], **row)
    for row in rows:
        if row["parent_id"] is not None:
            if row["parent_id"] not in graph:
                raise StoreError(f"tree {tree_id!r}: node {row['node_id']} has missing parent {row['parent_id']}")
            graph.add_edge(row["parent_id"], row["node_id"], action_index=row["action_index"],
                           action_text=row["action_text"], prior=row["prior"])
    return graph
