"""Supervised sets (rows of the store's `sft` table).

- `rejection_sft`: successful trajectories, deduplicated (exact, then optionally near with
  storage's faiss dedup), best first (reward, then fewer steps), at most `per_task` per task.
- `recovery_examples` (Agent-R): in a search tree, a failed path up to its first bad step
  (the first node from which the tree found no success), then the sibling path that succeeds
  from the bad step's parent: the model sees its own mistake and its observation, then the
  recovery; the mistake's turns carry weight 0, so SFT trains only the recovery. One example
  per (tree, first bad node).
"""

from __future__ import annotations

import json

import polars as pl

from dataengine.derive.common import (
    count_assistant,
    decode_messages,
    encode_messages,
    keep_runs,
    task_info,
)

# k: successful trajectories kept per task by rejection sampling.
SFT_PER_TASK = 2

SFT_COLUMNS = ["run_id", "example_id", "kind", "task_id", "suite", "messages_json", "tools_json", "score", "num_steps"]


def rejection_sft(
    trajectories: pl.LazyFrame,
    tasks: pl.LazyFrame | None = None,
    *,
    per_task: int = SFT_PER_TASK,
    near_threshold: float | None = None,
    embedder: str = "ngram",
    fewest_steps: bool = False,
    run_ids: list[str] | None = None,
) -> pl.DataFrame:
    """The rejection-sampling SFT set (eager: near dedup embeds the texts).

    Exact duplicates: equal normalised messages (whitespace collapsed; storage.dedup); near
    duplicates (with `near_threshold`, cosine of hashed n-gram embeddings): only within a task.
    The best copy is kept because rows are ranked before dedup. fewest_steps: only the
    successes with the task's fewest steps compete (a success that wastes a call is dropped
    when the task has a shorter one).
    """
    from storage.dedup import dedup_frame

    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    if near_threshold is not None and not 0.0 < near_threshold <= 1.0:
        raise ValueError(f"near_threshold must be in (0, 1], got {near_threshold}")
    trajectories = keep_runs(trajectories, run_ids)
    ranked = (
        trajectories.filter(pl.col("success").fill_null(False) & pl.col("messages_json").is_not_null())
        .with_columns(messages=decode_messages("messages_json"))
        .with_columns(
            key=encode_messages(
                pl.col("messages").list.eval(
                    pl.struct(
                        pl.element().struct.field("role"),
                        pl.element().struct.field("content").str.replace_all(r"\s+", " ").str.strip_chars(),
                        pl.element().struct.field("name"),
                    )
                )
            ),
            text=pl.col("messages")
            .list.eval(pl.concat_str(pl.element().struct.field("role"), pl.lit(": "),
                                     pl.element().struct.field("content").fill_null("")))
            .list.join("\n"),
            steps=pl.coalesce(pl.col("num_steps"), count_assistant(pl.col("messages"))).cast(pl.Int64),
        )
        .filter(~pl.lit(fewest_steps) | (pl.col("steps") == pl.col("steps").min().over("run_id", "task_id")))
        .sort(["run_id", "task_id", "reward", "steps", "traj_id"], descending=[False, False, True, False, False],
              nulls_last=True)
        .join(task_info(tasks).select("run_id", "task_id", "tools_json"), on=["run_id", "task_id"], how="left",
              maintain_order="left")
        .with_columns(group=pl.concat_str("run_id", pl.lit("/"), "task_id"))
        .collect()
    )
    kept, _report = dedup_frame(
        ranked, key=["group", "key"], text="text", group="group", exact=True,
        near_threshold=near_threshold, embedder=embedder,
    )
    kept = kept.group_by("group", maintain_order=True).head(per_task)
    return kept.select(
        "run_id",
        pl.format("rs/{}/{}", "run_id", "traj_id").alias("example_id"),
        pl.lit("rs").alias("kind"),
        "task_id",
        "suite",
        "messages_json",
        "tools_json",
        pl.col("reward").cast(pl.Float64).alias("score"),
        pl.col("steps").alias("num_steps"),
    )


def _failed_step_as_context(row: dict) -> str:
    """The spliced messages with the failed step's assistant turns (messages bad_from..bad_to)
    at weight 0: SFT shows the mistake and its observation as context and trains only the
    recovery (storage.formats), instead of teaching the mistake too."""
    messages = json.loads(row["json"])
    for m in messages[row["bad_from"]:row["bad_to"]]:
        if m["role"] == "assistant":
            m["weight"] = 0
    return json.dumps(messages, ensure_ascii=False)


def recovery_examples(
    nodes: pl.LazyFrame,
    trajectories: pl.LazyFrame,
    tasks: pl.LazyFrame | None = None,
    *,
    same_state: bool = True,
    run_ids: list[str] | None = None,
) -> pl.LazyFrame:
    """Agent-R error-recovery splices from the trees (module docstring).

    A node is *good* when some successful trajectory of its tree passes through it. On a failed
    tree trajectory (root, n1, ..., leaf) the first bad step is the first node that is not good;
    its parent is good, so a successful trajectory S goes through the parent and on through a
    sibling. The example is: the conversation up to and including the bad node (its action and
    observations), then S's messages after the parent's conversation.

    Bad steps that end the episode (terminal: a final answer or the step limit) are skipped: no
    turn can follow them. same_state: also skip bad steps that changed the tool state
    (env_hash differs from the parent's), because S's continuation assumed the parent's state.
    Columns: the `sft` columns (kind "recovery", score = S's reward).
    """
    nodes = keep_runs(nodes, run_ids)
    tree_trajs = keep_runs(trajectories, run_ids).filter(
        pl.col("tree_id").is_not_null() & pl.col("node_ids").is_not_null() & pl.col("success").is_not_null()
    )
    steps = (
        tree_trajs.select("run_id", "tree_id", "traj_id", "success", "reward", "num_steps", "messages_json",
                          pl.col("node_ids").alias("node_id"))
        .with_columns(position=pl.int_ranges(pl.col("node_id").list.len()))
        .explode("node_id", "position")
    )
    good = steps.filter(pl.col("success")).select("run_id", "tree_id", "node_id").unique().with_columns(good=pl.lit(True))
    node_cols = nodes.select("run_id", "tree_id", "node_id", "parent_id", "terminal", "env_hash", "messages_json",
                             "task_id", "suite")
    first_bad = (
        steps.filter(~pl.col("success") & (pl.col("position") > 0))
        .join(good, on=["run_id", "tree_id", "node_id"], how="left")
        .filter(pl.col("good").is_null())
        .group_by("run_id", "tree_id", "traj_id")
        .agg(pl.all().sort_by("position").first())
        .select("run_id", "tree_id", pl.col("node_id").alias("bad_id"), pl.col("position").alias("bad_position"))
        .unique()
        .join(node_cols.rename({"node_id": "bad_id", "messages_json": "bad_messages", "env_hash": "bad_env"}),
              on=["run_id", "tree_id", "bad_id"])
        .filter(~pl.col("terminal").fill_null(False))
        .join(
            node_cols.select("run_id", "tree_id", pl.col("node_id").alias("parent_id"),
                             pl.col("messages_json").alias("parent_messages"), pl.col("env_hash").alias("parent_env")),
            on=["run_id", "tree_id", "parent_id"],
        )
    )
    if same_state:
        first_bad = first_bad.filter(pl.col("bad_env").eq_missing(pl.col("parent_env")))
    # A successful trajectory through the parent (at the bad node's position - 1), best first.
    through = steps.filter(pl.col("success")).select(
        "run_id", "tree_id", pl.col("node_id").alias("parent_id"), pl.col("position").alias("parent_position"),
        pl.col("traj_id").alias("good_traj"), pl.col("reward").alias("good_reward"),
        pl.col("num_steps").alias("good_steps"), pl.col("messages_json").alias("good_messages"),
    )
    spliced = (
        first_bad.join(through, on=["run_id", "tree_id", "parent_id"])
        .filter(pl.col("parent_position") == pl.col("bad_position") - 1)
        .sort(["run_id", "tree_id", "bad_id", "good_reward", "good_steps", "good_traj"],
              descending=[False, False, False, True, False, False], nulls_last=True)
        .unique(["run_id", "tree_id", "bad_id"], keep="first", maintain_order=True)
        .with_columns(bad_from=decode_messages("parent_messages").list.len(),
                      bad_to=decode_messages("bad_messages").list.len())
        .with_columns(
            messages=pl.concat_list(
                decode_messages("bad_messages"),
                decode_messages("good_messages").list.slice(pl.col("bad_from")),
            ),
        )
        .join(task_info(tasks).select("run_id", "task_id", "tools_json"), on=["run_id", "task_id"], how="left")
    )
    return spliced.select(
        "run_id",
        pl.format("recovery/{}/{}/{}", "run_id", "tree_id", "bad_id").alias("example_id"),
        pl.lit("recovery").alias("kind"),
        "task_id",
        "suite",
        pl.struct(encode_messages(pl.col("messages")).alias("json"), "bad_from", "bad_to")
        .map_elements(_failed_step_as_context, return_dtype=pl.String).alias("messages_json"),
        "tools_json",
        pl.col("good_reward").cast(pl.Float64).alias("score"),
        count_assistant(pl.col("messages")).cast(pl.Int64).alias("num_steps"),
    ).sort("run_id", "example_id")
