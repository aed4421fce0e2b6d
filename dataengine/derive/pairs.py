"""Preference pairs from search trees and trajectories (rows of the store's `pairs` table).

- `step_pairs` (Agent Q): at every expanded node, two sibling actions give one pair when the
  evidence says the better one is better (`rule`): under "evidence" (default) the chosen side
  has a verified success in its subtree and the rejected side none, or, from value estimates,
  the chosen side's lower confidence bound lies above the rejected side's upper bound
  (visits-aware) with a gap wider than shaping can make; under "margin" (the earlier rule) a
  mixed-value gap of at least `margin` is enough. prompt = the conversation up to the node,
  chosen/rejected = the better/worse action (one assistant message each), with the margin,
  the visits and the behaviour log-probs kept.
- `trajectory_pairs` (ETO): a successful and a failed trajectory of the same task: prompt = the
  task's messages (before the first assistant turn), chosen/rejected = the rest of each episode.

Both are pure Polars over the store's LazyFrames and return LazyFrames with the `pairs` columns
(run_id is the source run; `derive.store` rewrites it to the output run).
"""

from __future__ import annotations

import polars as pl

from dataengine.derive.common import (
    assistant_message_json,
    decode_messages,
    encode_messages,
    first_assistant_index,
    keep_runs,
    task_info,
)

# theta: least value gap of a step pair (Agent Q uses a margin on the mixed Q).
MARGIN = 0.2
# Least visits of both siblings, so pairs rest on backed-up values and not on one rollout.
MIN_VISITS = 1
# Half-width of a side's confidence interval on its value is BOUND_C / sqrt(visits): Hoeffding's
# for values in a range of 1 at about e^-2 = 0.14 per side.
BOUND_C = 1.0
# Least value gap of a bound pair: wider than the composite reward's widest gap between two
# failures (shaping 0.15 above zero, the syntax penalty 0.1 below it), so shaping alone never
# makes a pair.
BOUND_MIN_GAP = 0.3
RULES = ("evidence", "margin")
# Trajectory pairs kept per task at most (largest margins first).
PAIRS_PER_TASK = 4

PAIR_COLUMNS = [
    "run_id", "pair_id", "kind", "task_id", "suite", "prompt_json", "chosen_json", "rejected_json",
    "tools_json", "margin", "chosen_value", "rejected_value", "chosen_visits", "rejected_visits",
    "chosen_logprob", "rejected_logprob", "node_id", "tree_id",
]


def node_value(critic_weight: float = 0.0) -> pl.Expr:
    """The mixed value of a node: (1 - w) * q + w * critic_score (critic missing: q alone).

    w = 0 (default) takes `q` as the search stored it; Agent Q's mix a*Q_mcts + (1-a)*Q_critic
    has w = 1 - a (use it only when the search stored the unmixed Q).
    """
    if not 0.0 <= critic_weight <= 1.0:
        raise ValueError(f"critic_weight must be in [0, 1], got {critic_weight}")
    q = pl.col("q").cast(pl.Float64)
    if critic_weight == 0.0:
        return q
    return (1.0 - critic_weight) * q + critic_weight * pl.col("critic_score").cast(pl.Float64).fill_null(q)


def subtree_outcomes(nodes: pl.LazyFrame) -> pl.LazyFrame:
    """Verified outcomes below every node that has a terminal in its subtree (itself included).

    nodes: the `nodes` table (run_id, tree_id, node_id, parent_id, terminal, success).
    Columns: run_id, tree_id, node_id, solved (successful terminals in the subtree), ended
    (terminals in the subtree). The tree's parent links are collected (five small columns) and
    walked up from each terminal, one join per level.
    """
    links = nodes.select("run_id", "tree_id", "node_id", "parent_id").collect()
    up = links.lazy().filter(pl.col("parent_id").is_not_null())
    frontier = (nodes.filter(pl.col("terminal").fill_null(False))
                .select("run_id", "tree_id", "node_id", solved=pl.col("success").fill_null(False).cast(pl.Int64))
                .collect())
    levels = [frontier]
    while frontier.height:
        frontier = (frontier.lazy().join(up, on=["run_id", "tree_id", "node_id"])
                    .select("run_id", "tree_id", pl.col("parent_id").alias("node_id"), "solved").collect())
        levels.append(frontier)
    return (pl.concat(levels).lazy().group_by("run_id", "tree_id", "node_id")
            .agg(solved=pl.col("solved").sum(), ended=pl.len().cast(pl.Int64)))


def step_pairs(
    nodes: pl.LazyFrame,
    tasks: pl.LazyFrame | None = None,
    *,
    rule: str = "evidence",
    margin: float = MARGIN,
    min_visits: int = MIN_VISITS,
    bound_c: float = BOUND_C,
    bound_min_gap: float = BOUND_MIN_GAP,
    critic_weight: float = 0.0,
    run_ids: list[str] | None = None,
) -> pl.LazyFrame:
    """Sibling pairs of every expanded node of every tree in `nodes` (module docstring).

    nodes: the `nodes` table (columns run_id, tree_id, node_id, parent_id, task_id, suite,
        action_text, action_key, q, critic_score, visits, logprob, terminal, success,
        messages_json).
    tasks: the `tasks` table, for the tool list of each pair (tools_json null without it).
    rule "evidence": a pair (c, r) is kept when c has a verified success in its subtree and r
        none, or both have one and value(c) - value(r) >= bound_min_gap (a verified pair), or
        r has none and value(c) - bound_c / sqrt(visits(c)) > value(r) + bound_c /
        sqrt(visits(r)) with value(c) - value(r) >= bound_min_gap (a bound pair); `margin` is
        not used. rule "margin": value(c) - value(r) >= margin.
    Under both rules both sides have `visits >= min_visits`, only strictly better actions are
    chosen (chosen_value > rejected_value), and siblings with the same action key (one action
    sampled twice) never form a pair.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if min_visits < 0:
        raise ValueError(f"min_visits must be >= 0, got {min_visits}")
    if bound_c < 0 or bound_min_gap < 0:
        raise ValueError(f"bound_c and bound_min_gap must be >= 0, got {bound_c} and {bound_min_gap}")
    nodes = keep_runs(nodes, run_ids)
    edge = ["run_id", "tree_id", "parent_id"]
    children = (
        nodes.filter(pl.col("parent_id").is_not_null())
        .with_columns(value=node_value(critic_weight))
        .filter(pl.col("value").is_not_null() & (pl.col("visits").fill_null(0) >= min_visits))
        .join(subtree_outcomes(nodes), on=["run_id", "tree_id", "node_id"], how="left")
        .with_columns(pl.col("solved").fill_null(0))
        .select(*edge, "task_id", "suite", "node_id", "action_text", "action_key", "value", "visits", "logprob",
                "solved")
    )
    rejected = children.select(
        *edge,
        pl.col("node_id").alias("rejected_id"),
        pl.col("action_text").alias("rejected_text"),
        pl.col("action_key").alias("rejected_key"),
        pl.col("value").alias("rejected_value"),
        pl.col("visits").alias("rejected_visits"),
        pl.col("logprob").alias("rejected_logprob"),
        pl.col("solved").alias("rejected_solved"),
    )
    parents = nodes.select(
        "run_id", "tree_id", pl.col("node_id").alias("parent_id"), pl.col("messages_json").alias("prompt_json")
    )
    if rule == "margin":
        evidence = pl.col("margin") >= margin
    else:
        half = lambda visits: bound_c / pl.col(visits).cast(pl.Float64).clip(lower_bound=1).sqrt()  # noqa: E731
        bound = ((pl.col("chosen_value") - half("chosen_visits") > pl.col("rejected_value") + half("rejected_visits"))
                 & (pl.col("margin") >= bound_min_gap))
        # Two verified sides differ by more than shaping only where the objective ranks
        # successes (efficient_success: a success that wastes steps is worth less).
        verified = (pl.col("chosen_solved") > 0) & ((pl.col("rejected_solved") == 0)
                                                    | (pl.col("margin") >= bound_min_gap))
        evidence = verified | ((pl.col("rejected_solved") == 0) & bound)
    pairs = (
        children.rename({"node_id": "chosen_id", "value": "chosen_value", "visits": "chosen_visits",
                         "logprob": "chosen_logprob", "action_text": "chosen_text", "action_key": "chosen_key",
                         "solved": "chosen_solved"})
        .join(rejected, on=edge)
        .with_columns(margin=pl.col("chosen_value") - pl.col("rejected_value"))
        .filter(
            (pl.col("margin") > 0)
            & evidence
            & pl.col("chosen_key").ne_missing(pl.col("rejected_key"))
        )
        .join(parents, on=edge, how="left")
        .join(task_info(tasks).select("run_id", "task_id", "tools_json"), on=["run_id", "task_id"], how="left")
    )
    return pairs.select(
        "run_id",
        pl.format("step/{}/{}/{}/{}>{}", "run_id", "tree_id", "parent_id", "chosen_id", "rejected_id").alias("pair_id"),
        pl.lit("step").alias("kind"),
        "task_id",
        "suite",
        "prompt_json",
        assistant_message_json(pl.col("chosen_text")).alias("chosen_json"),
        assistant_message_json(pl.col("rejected_text")).alias("rejected_json"),
        "tools_json",
        "margin",
        "chosen_value",
        "rejected_value",
        pl.col("chosen_visits").cast(pl.Int64),
        pl.col("rejected_visits").cast(pl.Int64),
        pl.col("chosen_logprob").cast(pl.Float64),
        pl.col("rejected_logprob").cast(pl.Float64),
        pl.col("parent_id").cast(pl.Int64).alias("node_id"),
        "tree_id",
    ).sort("run_id", "tree_id", "node_id", "pair_id")


def path_logprobs(trajectories: pl.LazyFrame, nodes: pl.LazyFrame | None) -> pl.LazyFrame:
    """Behaviour log-prob of each tree trajectory: the sum over its non-root nodes' `logprob`.

    Columns: run_id, traj_id, logprob (null when the trajectory has no tree path, or any action
    on it lacks a log-prob).
    """
    if nodes is None:
        return trajectories.select("run_id", "traj_id", logprob=pl.lit(None, dtype=pl.Float64))
    steps = (
        trajectories.filter(pl.col("tree_id").is_not_null() & pl.col("node_ids").is_not_null())
        .select("run_id", "traj_id", "tree_id", pl.col("node_ids").list.slice(1).alias("node_id"))
        .explode("node_id")
        .filter(pl.col("node_id").is_not_null())
        .join(nodes.select("run_id", "tree_id", "node_id", "logprob"), on=["run_id", "tree_id", "node_id"], how="left")
        .group_by("run_id", "traj_id")
        .agg(logprob=pl.when(pl.col("logprob").null_count() == 0).then(pl.col("logprob").sum()))
    )
    return trajectories.select("run_id", "traj_id").join(steps, on=["run_id", "traj_id"], how="left")


def trajectory_pairs(
    trajectories: pl.LazyFrame,
    tasks: pl.LazyFrame | None = None,
    nodes: pl.LazyFrame | None = None,
    *,
    per_task: int = PAIRS_PER_TASK,
    min_margin: float = 0.0,
    run_ids: list[str] | None = None,
) -> pl.LazyFrame:
    """ETO-style pairs: each successful trajectory against each failed one of the same task
    (same run), distinct episodes only (exact duplicates by normalised messages dropped first),
    the `per_task` with the largest reward margin kept (ties: fewer chosen steps, then ids).

    trajectories: the `trajectories` table (run_id, task_id, suite, traj_id, messages_json,
        reward, success, num_steps, tree_id, node_ids).
    nodes: optional, to sum each side's behaviour log-probs along its tree path.
    """
    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    trajectories = keep_runs(trajectories, run_ids)
    logprobs = path_logprobs(trajectories, None if nodes is None else keep_runs(nodes, run_ids))
    episodes = (
        trajectories.filter(pl.col("success").is_not_null() & pl.col("messages_json").is_not_null())
        .join(logprobs, on=["run_id", "traj_id"], how="left")
        .with_columns(messages=decode_messages("messages_json"))
        .with_columns(start=first_assistant_index(pl.col("messages")))
        # An episode without an assistant turn has nothing to prefer.
        .filter(pl.col("messages").list.eval(pl.element().struct.field("role") == "assistant").list.any())
        .with_columns(
            prompt_json=encode_messages(pl.col("messages").list.head(pl.col("start"))),
            answer_json=encode_messages(pl.col("messages").list.slice(pl.col("start"))),
        )
        .sort("run_id", "task_id", "traj_id")
        .unique(["run_id", "task_id", "prompt_json", "answer_json"], keep="first", maintain_order=True)
        .select("run_id", "task_id", "suite", "traj_id", "success", "reward", "num_steps", "logprob",
                "prompt_json", "answer_json")
    )
    # Pair on ids and scalars only; the message texts are joined back to the kept pairs.
    key = ["run_id", "task_id", "prompt_json"]
    good = episodes.filter(pl.col("success")).select(*key, "traj_id", "reward", "num_steps")
    bad = episodes.filter(~pl.col("success")).select(
        *key, pl.col("traj_id").alias("traj_id_r"), pl.col("reward").alias("reward_r")
    )
    texts = episodes.select("run_id", "traj_id", "suite", "answer_json", "logprob")
    pairs = (
        good.join(bad, on=key)
        .with_columns(margin=pl.col("reward").cast(pl.Float64) - pl.col("reward_r").cast(pl.Float64))
        .filter(pl.col("margin") >= min_margin)
        .sort(["run_id", "task_id", "margin", "num_steps", "traj_id", "traj_id_r"],
              descending=[False, False, True, False, False, False])
        .group_by(["run_id", "task_id"], maintain_order=True)
        .head(per_task)
        .join(texts, on=["run_id", "traj_id"], how="left", maintain_order="left")
        .join(texts.select("run_id", pl.col("traj_id").alias("traj_id_r"), pl.col("answer_json").alias("answer_json_r"),
                           pl.col("logprob").alias("logprob_r")),
              on=["run_id", "traj_id_r"], how="left", maintain_order="left")
        .join(task_info(tasks).select("run_id", "task_id", "tools_json"), on=["run_id", "task_id"], how="left",
              maintain_order="left")
    )
    return pairs.select(
        "run_id",
        pl.format("trajectory/{}/{}>{}", "run_id", "traj_id", "traj_id_r").alias("pair_id"),
        pl.lit("trajectory").alias("kind"),
        "task_id",
        "suite",
        "prompt_json",
        pl.col("answer_json").alias("chosen_json"),
        pl.col("answer_json_r").alias("rejected_json"),
        "tools_json",
        "margin",
        pl.col("reward").cast(pl.Float64).alias("chosen_value"),
        pl.col("reward_r").cast(pl.Float64).alias("rejected_value"),
        pl.lit(None, dtype=pl.Int64).alias("chosen_visits"),
        pl.lit(None, dtype=pl.Int64).alias("rejected_visits"),
        pl.col("logprob").alias("chosen_logprob"),
        pl.col("logprob_r").alias("rejected_logprob"),
        pl.lit(None, dtype=pl.Int64).alias("node_id"),
        pl.lit(None, dtype=pl.String).alias("tree_id"),
    )
