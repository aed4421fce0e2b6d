"""Writing derived datasets to the store, with lineage.

`derive(store, kinds, run_ids=[...])` reads the committed shards of the nodes, trajectories and
tasks tables at their current Delta versions (a shard whose `tasks` commit marker was never
written is left out, read with the marker table at the same recorded version), derives each dataset with the pure functions of this package, and writes
it as one shard `derive/<kind>` of the output run (default: the source run itself) to `pairs`,
`sft` or `replay`, every row carrying `source_versions_json` = the versions read; a `runs` row
(kind "derive/<kind>") records the settings. Deriving again replaces the shard (one copy).
Storage's exports then turn the tables into TRL datasets (`dataengine store export ...`).
With `options.decontaminate` (the default) rows whose user question matches an eval-only item
are refused before the write and counted per source (dataengine.derive.decontam).
A damaged or unreadable source file raises a one-line `StoreError` naming the table and file.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from dataengine.derive.common import with_parsed_calls
from dataengine.derive.decontam import THRESHOLD, EvalIndex, decontaminate
from dataengine.derive.pairs import (
    BOUND_C,
    BOUND_MIN_GAP,
    MARGIN,
    MIN_VISITS,
    PAIR_COLUMNS,
    PAIRS_PER_TASK,
    step_pairs,
    trajectory_pairs,
)
from dataengine.derive.replay import MIN_SAMPLES, REPLAY_COLUMNS, grpo_replay
from dataengine.derive.sft import (
    SFT_COLUMNS,
    SFT_PER_TASK,
    recovery_examples,
    rejection_sft,
)
from storage.formats import PAIRS, REPLAY, SFT

KINDS = ("step-pairs", "trajectory-pairs", "sft", "recovery", "replay")
# The dataset kind (storage.formats) each derivation writes; its name is the store table.
FORMAT_OF = {"step-pairs": PAIRS, "trajectory-pairs": PAIRS, "sft": SFT, "recovery": SFT, "replay": REPLAY}
TABLE_OF = {kind: spec.table for kind, spec in FORMAT_OF.items()}
SOURCES_OF = {
    "step-pairs": ("nodes", "tasks"),
    "trajectory-pairs": ("trajectories", "nodes", "tasks"),
    "sft": ("trajectories", "tasks"),
    "recovery": ("nodes", "trajectories", "tasks"),
    "replay": ("trajectories", "nodes", "tasks"),
}
REQUIRED_SOURCES = {
    "step-pairs": ("nodes",),
    "trajectory-pairs": ("trajectories",),
    "sft": ("trajectories",),
    "recovery": ("nodes", "trajectories"),
    "replay": ("trajectories", "tasks"),
}


@dataclass
class DeriveOptions:
    """Settings of every derivation (DeriveConfig's fields plus the finer ones).

    pair_rule, margin, min_visits, bound_c, bound_min_gap, critic_weight: step pairs (see
        step_pairs; margin applies under pair_rule "margin" only).
    pairs_per_task, pair_min_margin: trajectory pairs.
    sft_per_task, near_threshold, sft_fewest_steps: rejection-sampling SFT (near_threshold None:
        exact dedup only; sft_fewest_steps: only each task's shortest successes).
    same_state: recovery splices only where the tool state is unchanged (replay prefixes need no
        such filter: GRPO replays a prefix's tool calls).
    replay_low, replay_high, replay_min_samples, replay_prefixes: GRPO replay.
    decontaminate, decontam_threshold: refuse rows matching an eval-only item, exactly or as a
        near duplicate at this similarity (dataengine.derive.decontam).
    """

    pair_rule: str = "evidence"
    margin: float = MARGIN
    min_visits: int = MIN_VISITS
    bound_c: float = BOUND_C
    bound_min_gap: float = BOUND_MIN_GAP
    critic_weight: float = 0.0
    pairs_per_task: int = PAIRS_PER_TASK
    pair_min_margin: float = 0.0
    sft_per_task: int = SFT_PER_TASK
    sft_fewest_steps: bool = False
    near_threshold: float | None = None
    same_state: bool = True
    replay_low: float = 0.0
    replay_high: float = 1.0
    replay_min_samples: int = MIN_SAMPLES
    replay_prefixes: bool = True
    decontaminate: bool = True
    decontam_threshold: float = THRESHOLD

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> DeriveOptions:
        """From a config.DeriveConfig (pair_rule, margin, min_visits, bound_c, bound_min_gap,
        sft_per_task, sft_fewest_steps, replay_low/high, decontaminate, decontam_threshold)."""
        base = {"pair_rule": config.pair_rule, "margin": config.margin, "min_visits": config.min_visits,
                "bound_c": config.bound_c, "bound_min_gap": config.bound_min_gap, "sft_per_task": config.sft_per_task,
                "sft_fewest_steps": config.sft_fewest_steps,
                "replay_low": config.replay_low, "replay_high": config.replay_high,
                "decontaminate": config.decontaminate, "decontam_threshold": config.decontam_threshold}
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


@dataclass
class DeriveResult:
    """One derived dataset as written: kind, table, output run and shard, rows, the table
    version after the write, the source versions read, the seconds it took and the rows
    refused as eval items per source ({} when decontamination is off)."""

    kind: str
    table: str
    run_id: str
    shard_id: str
    rows: int
    version: int
    source_versions: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    decontaminated: dict[str, int] = field(default_factory=dict)


def derive_frame(kind: str, sources: dict[str, pl.LazyFrame | None], options: DeriveOptions,
                 run_ids: list[str] | None = None) -> pl.DataFrame:
    """The rows of one derived dataset (before writing) from the source LazyFrames; every
    assistant turn of their message lists carries its parsed `tool_calls`."""
    frame = _derive_frame(kind, sources, options, run_ids)
    return frame.with_columns(
        pl.col(c).map_elements(with_parsed_calls, return_dtype=pl.String)
        for c in FORMAT_OF[kind].store_message_columns
    )


def _derive_frame(kind: str, sources: dict[str, pl.LazyFrame | None], options: DeriveOptions,
                  run_ids: list[str] | None = None) -> pl.DataFrame:
    o = options
    nodes, trajs, tasks = sources.get("nodes"), sources.get("trajectories"), sources.get("tasks")
    if kind == "step-pairs":
        frame = step_pairs(nodes, tasks, rule=o.pair_rule, margin=o.margin, min_visits=o.min_visits,
                           bound_c=o.bound_c, bound_min_gap=o.bound_min_gap, critic_weight=o.critic_weight, run_ids=run_ids).select(PAIR_COLUMNS)
    elif kind == "trajectory-pairs":
        frame = trajectory_pairs(trajs, tasks, nodes, per_task=o.pairs_per_task, min_margin=o.pair_min_margin,
                                 run_ids=run_ids).select(PAIR_COLUMNS)
    elif kind == "sft":
        return rejection_sft(trajs, tasks, per_task=o.sft_per_task, near_threshold=o.near_threshold,
                             fewest_steps=o.sft_fewest_steps,
                             run_ids=run_ids).select(SFT_COLUMNS)
    elif kind == "recovery":
        frame = recovery_examples(nodes, trajs, tasks, same_state=o.same_state, run_ids=run_ids).select(SFT_COLUMNS)
    elif kind == "replay":
        frame = grpo_replay(trajs, tasks, nodes, low=o.replay_low, high=o.replay_high,
                            min_samples=o.replay_min_samples, prefixes=o.replay_prefixes,
                            run_ids=run_ids).select(REPLAY_COLUMNS)
    else:
        raise ValueError(f"unknown derived dataset {kind!r}; choose from {', '.join(KINDS)}")
    return frame.collect()


def derive(
    store: Any,
    kinds: list[str] | tuple[str, ...] = KINDS,
    *,
    run_ids: list[str] | None = None,
    out_run_id: str | None = None,
    options: DeriveOptions | None = None,
    eval_index: EvalIndex | None = None,
) -> list[DeriveResult]:
    """Derive `kinds` from the trees and trajectories of `run_ids` and write them (module doc).

    run_ids: source runs (None or empty: every run in the store, then `out_run_id` is needed).
    out_run_id: run id of the written rows; default the single source run.
    eval_index: the eval-only items refused under options.decontaminate (None: decontam.index_for()).
    """
    options = options or DeriveOptions()
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown derived dataset(s) {', '.join(bad)}; choose from {', '.join(KINDS)}")
    if out_run_id is None:
        if not run_ids or len(run_ids) != 1:
            raise ValueError("give out_run_id when deriving from several runs (or from all runs)")
        out_run_id = run_ids[0]
    written = set(store.tables())
    versions = {t: store.version(t) for t in ("nodes", "trajectories", "tasks") if t in written}

    markers = {"tasks": versions["tasks"]} if "tasks" in versions else None

    def scan(table: str) -> pl.LazyFrame:
        # Committed shards only, judged by the tasks marker at the version recorded as lineage.
        return store.committed(table, versions[table], marker_versions=markers)

    if run_ids and "trajectories" in versions:
        present = set(_run_ids(store, scan("trajectories"), ["trajectories"], versions))
        if "nodes" in versions:
            present |= set(_run_ids(store, scan("nodes"), ["nodes"], versions))
        missing = [r for r in run_ids if r not in present]
        if missing:
            pending = sorted({k for t in ("nodes", "trajectories") if t in versions
                              for k in store.pending_shards(t, markers) if k[0] in missing})
            hint = (f"; {len(pending)} shard(s) of them were written without their tasks commit marker "
                    f"(e.g. run {pending[0][0]!r} shard {pending[0][1]!r}): rerun the generate run to complete them"
                    if pending else "")
            raise ValueError(f"run(s) {', '.join(missing)} have no nodes or trajectories in committed shards of {store.root}; "
                             f"runs there: {', '.join(sorted(present)) or 'none'}{hint}")
    if "tasks" in versions:
        _check_one_tree_per_task(store, scan("tasks"), run_ids, versions)
    if options.decontaminate and eval_index is None:
        from dataengine.derive.decontam import index_for

        eval_index = index_for()
    results = []
    for kind in kinds:
        lacking = [t for t in REQUIRED_SOURCES[kind] if t not in versions]
        if lacking:
            raise ValueError(f"{kind}: the store at {store.root} has no {', '.join(lacking)} table; "
                             "run `dataengine generate` first")
        start = time.perf_counter()
        used = {t: versions[t] for t in SOURCES_OF[kind] if t in versions}
        sources = {t: scan(t) for t in used}
        try:
            frame = derive_frame(kind, sources, options, run_ids)
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:
            raise store.read_error(exc, list(used), used) from exc
        refused: dict[str, int] = {}
        if options.decontaminate:
            frame, refused = decontaminate(frame, FORMAT_OF[kind].store_message_columns, eval_index,
                                           threshold=options.decontam_threshold)
        frame = frame.drop("run_id").with_columns(source_versions_json=pl.lit(json.dumps(used, sort_keys=True)))
        table, shard = TABLE_OF[kind], f"derive/{kind}"
        version = store.append(table, frame, run_id=out_run_id, shard_id=shard)
        config = {"options": asdict(options), "run_ids": run_ids}
        if options.decontaminate:
            config["decontaminated"] = {"refused": refused, "eval_index": eval_index.digest}
        store.record_run(out_run_id, kind=f"derive/{kind}", config=config, source_versions=used, shard_id=shard)
        results.append(DeriveResult(kind, table, out_run_id, shard, frame.height, version, used,
                                    time.perf_counter() - start, refused))
    return results


def _check_one_tree_per_task(store: Any, tasks: pl.LazyFrame, run_ids: list[str] | None,
                             versions: dict[str, int]) -> None:
    """A run with two committed shards of one task holds two trees under one tree id (written
    with two shard layouts, or by two processes); deriving from it would count that task twice."""
    if run_ids:
        tasks = tasks.filter(pl.col("run_id").is_in(run_ids))
    twice = store.collect(tasks.group_by("run_id", "task_id").agg(pl.col("shard_id").unique().sort())
                          .filter(pl.col("shard_id").list.len() > 1).sort("run_id", "task_id"),
                          tables=["tasks"], versions=versions)
    if twice.height:
        row = twice.row(0, named=True)
        raise ValueError(f"run {row['run_id']!r} holds task {row['task_id']!r} in shards {', '.join(row['shard_id'])} "
                         f"({twice.height} task(s) in more than one shard): it was written with two shard layouts or "
                         "by two processes; regenerate it under a fresh run id")


def _run_ids(store: Any, frame: pl.LazyFrame, tables: list[str], versions: dict[str, int]) -> list[str]:
    return store.collect(frame.select("run_id").unique(), tables=tables, versions=versions)["run_id"].to_list()
