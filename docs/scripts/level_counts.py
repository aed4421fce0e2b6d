"""Per-level counts of an experiment's store (docs/results.md "Learning rounds"):

- search on train tasks: tasks, tasks solved, trees holding the gold first call / both gold calls,
  successful trajectories, clean ones (as many tool calls as the gold, the answer right after)
  and the tasks that have one, node tokens (`--run R`: only generate run R's search);
- greedy held-out evaluation per model: (level, tool calls made, success) -> trajectories.

    .venv/bin/python docs/scripts/level_counts.py runs/exp-ref/store [--heldout-tasks 100 --seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dataengine.suites import generate_suite  # noqa: E402
from storage import Store  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store")
    parser.add_argument("--suite", default="arithmetic")
    parser.add_argument("--heldout-tasks", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run", default=None, help="only this generate run's search (default: every run)")
    args = parser.parse_args()
    store = Store(args.store)
    runs = pl.lit(True) if args.run is None else pl.col("run_id") == args.run

    tasks = {r["task_id"]: json.loads(r["task_json"]) for r in store.tasks().filter(runs).collect().iter_rows(named=True)}
    level = {t: (j.get("metadata") or {}).get("level") for t, j in tasks.items()}
    nodes = store.nodes().filter(runs & pl.col("task_id").is_in(list(tasks))).collect()
    first, both = set(), set()
    for r in nodes.filter(pl.col("action_json").is_not_null()).iter_rows(named=True):
        gold = tasks[r["task_id"]]["gold"]["calls"]
        calls = [
            c for m in json.loads(r["messages_json"]) if m["role"] == "assistant" for c in m.get("tool_calls") or []
        ]
        match = [c["name"] == g["name"] and c["arguments"] == g["arguments"] for c, g in zip(calls, gold)]
        if match[:1] == [True]:
            first.add(r["task_id"])
        if len(match) >= 2 and all(match[:2]):
            both.add(r["task_id"])
    solved = set(nodes.filter(pl.col("success").fill_null(False))["task_id"].unique())
    trajs = store.trajectories().collect()
    won = trajs.filter(runs & pl.col("success") & pl.col("task_id").is_in(list(tasks)))
    successes = Counter(level[t] for t in won["task_id"])
    clean = {(r["task_id"], r["traj_id"]) for r in won.iter_rows(named=True)
             if r["num_tool_calls"] == len(tasks[r["task_id"]]["gold"]["calls"])
             and r["num_steps"] == r["num_tool_calls"] + 1}
    clean_count = Counter(level[t] for t, _ in clean)
    clean_tasks = {t for t, _ in clean}
    print("search on train tasks")
    for lv in sorted(set(level.values()), key=str):
        ids = {t for t, v in level.items() if v == lv}
        tokens = nodes.filter(pl.col("task_id").is_in(list(ids)))["num_tokens"].sum()
        print(
            f"  level {lv}: tasks {len(ids)}, solved {len(ids & solved)}, gold first call {len(ids & first)}, "
            f"both gold calls {len(ids & both)}, successful trajectories {successes[lv]} (clean {clean_count[lv]}, "
            f"tasks with a clean one {len(ids & clean_tasks)}), node tokens {tokens}"
        )

    heldout = generate_suite(args.suite, n_train=0, n_heldout=args.heldout_tasks, seed=args.seed)
    held_level = {t.id: (t.metadata or {}).get("level") for t in heldout}
    evals = trajs.filter((pl.col("split") == "heldout") & pl.col("task_id").is_in(list(held_level)))
    print("held-out greedy evaluation: (level, tool calls, success) -> trajectories")
    for model in evals["model_id"].unique().sort():
        rows = evals.filter(pl.col("model_id") == model).iter_rows(named=True)
        counts = Counter((held_level[r["task_id"]], r["num_tool_calls"], r["success"]) for r in rows)
        print(f"  {model}: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=str)))


if __name__ == "__main__":
    main()
