"""GRPO replay prompts (rows of the store's `replay` table).

GRPO learns only from groups whose rollouts disagree: a prompt the policy always (or never)
solves gives every rollout the same reward and a zero advantage. So a prompt is kept when its
estimated success probability lies strictly between `low` and `high`.

The estimate comes from the stored trajectories: for a task, the share of its trajectories that
succeeded; for an internal tree node (a starting prefix), the share of the tree trajectories
passing through it that succeeded. They are the search's own samples, so they estimate the
search policy's success, which is what a prompt filter needs (not an unbiased plain-policy rate).
"""

from __future__ import annotations

import polars as pl

from dataengine.derive.common import keep_runs, task_info

# Trajectories a prompt needs before its estimate is trusted.
MIN_SAMPLES = 2

REPLAY_COLUMNS = ["run_id", "prompt_id", "task_id", "suite", "prompt_json", "tools_json", "task_json", "p_success"]


def grpo_replay(
    trajectories: pl.LazyFrame,
    tasks: pl.LazyFrame,
    nodes: pl.LazyFrame | None = None,
    *,
    low: float = 0.0,
    high: float = 1.0,
    min_samples: int = MIN_SAMPLES,
    prefixes: bool = True,
    same_state: bool = False,
    run_ids: list[str] | None = None,
) -> pl.LazyFrame:
    """Prompts with low < p_success < high (module docstring).

    tasks: the `tasks` table (needed: GRPO rebuilds the task from task_json to verify rollouts).
    nodes: the `nodes` table; with `prefixes`, non-root, non-terminal nodes become prompts too
        (prompt = the node's conversation; GRPO's environment replays its tool calls at reset, see
        dataengine.train.environment, so a rollout continues from the node's tool state).
        same_state: only nodes whose tool state equals the root's (env_hash); not needed for
        our GRPO, kept for trainers that restart the tools from the task's initial state.
    Columns: the `replay` columns; prompt_id "task/<run>/<task>" or "node/<run>/<tree>/<node>".
    """
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"need 0 <= low < high <= 1, got low={low}, high={high}")
    if min_samples < 1:
        raise ValueError(f"min_samples must be >= 1, got {min_samples}")
    trajectories = keep_runs(trajectories, run_ids).filter(pl.col("success").is_not_null())
    info = task_info(keep_runs(tasks, run_ids))
    per_task = (
        trajectories.group_by("run_id", "task_id")
        .agg(n=pl.len(), successes=pl.col("success").sum(), suite=pl.col("suite").first())
        .join(info, on=["run_id", "task_id"])
        .select(
            "run_id",
            pl.format("task/{}/{}", "run_id", "task_id").alias("prompt_id"),
            "task_id", "suite",
            pl.col("task_prompt_json").alias("prompt_json"),
            "tools_json", "task_json", "n", "successes",
        )
    )
    frames = [per_task]
    if prefixes and nodes is not None:
        nodes = keep_runs(nodes, run_ids)
        through = (
            trajectories.filter(pl.col("tree_id").is_not_null() & pl.col("node_ids").is_not_null())
            .select("run_id", "tree_id", "success", pl.col("node_ids").list.slice(1).alias("node_id"))
            .explode("node_id")
            .filter(pl.col("node_id").is_not_null())
            .group_by("run_id", "tree_id", "node_id")
            .agg(n=pl.len(), successes=pl.col("success").sum())
        )
        roots = nodes.filter(pl.col("parent_id").is_null()).select("run_id", "tree_id", root_env=pl.col("env_hash"))
        inner = (
            nodes.filter(pl.col("parent_id").is_not_null() & ~pl.col("terminal").fill_null(False))
            .join(roots, on=["run_id", "tree_id"], how="left")
        )
        if same_state:
            inner = inner.filter(pl.col("env_hash").eq_missing(pl.col("root_env")))
        frames.append(
            inner.join(through, on=["run_id", "tree_id", "node_id"])
            .join(info, on=["run_id", "task_id"])
            .select(
                "run_id",
                pl.format("node/{}/{}/{}", "run_id", "tree_id", "node_id").alias("prompt_id"),
                "task_id", "suite",
                pl.col("messages_json").alias("prompt_json"),
                "tools_json", "task_json", "n", "successes",
            )
        )
    prompts = pl.concat(frames, how="vertical_relaxed")
    return (
        prompts.filter(pl.col("n") >= min_samples)
        .with_columns(p_success=pl.col("successes").cast(pl.Float64) / pl.col("n"))
        .filter((pl.col("p_success") > low) & (pl.col("p_success") < high))
        .select(REPLAY_COLUMNS)
        .sort("run_id", "prompt_id")
    )
