"""What changed between two rounds of an experiment (docs/results.md, shop rerun from seed 1): the train
tasks each round's search solved, by level; how many held-out episodes the two evaluations
share token for token and how many flip success; the tool errors the held-out episodes hit most;
with --find, where a string (a made-up argument, say) occurs: in how many episodes of each run,
SFT rows and preference pairs (either side) of each round, and tasks.

    .venv/bin/python docs/scripts/compare_rounds.py runs/exp-shop-seed1/store --find '#W8417589'
    .venv/bin/python docs/scripts/compare_rounds.py runs/exp-shop-seed1-r2t80/store \
      --runs experiment/r2,exp-shop-seed1-r2t80/r2          # a fork's round 2 against the original's
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import polars as pl  # noqa: E402

from storage import Store  # noqa: E402


def first_tool_error(messages_json: str) -> str | None:
    """The first tool reply of an episode when it is an error, without its source location."""
    for message in json.loads(messages_json):
        if message.get("role") == "tool":
            text = str(message.get("content"))
            return text.split(" (at ")[0] if text.startswith("Error") else None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store")
    parser.add_argument("--runs", default="experiment/r1,experiment/r2",
                        help="two rounds' search run ids (their evaluations are RUN/eval)")
    parser.add_argument("--top", type=int, default=5, help="tool errors to list per round")
    parser.add_argument("--find", help="a string to count in the store's episodes, SFT rows, pairs and tasks")
    args = parser.parse_args()
    store = Store(args.store)
    rounds = args.runs.split(",")
    episodes = store.trajectories().filter(pl.col("run_id").is_in(rounds + [f"{r}/eval" for r in rounds])).collect()
    level = {
        row["task_id"]: json.loads(row["task_json"])["metadata"].get("level")
        for row in store.tasks().collect().iter_rows(named=True)
    }
    for run in rounds:
        solved = (
            episodes.filter(pl.col("run_id") == run)
            .group_by("task_id").agg(pl.col("success").any())
            .with_columns(pl.col("task_id").replace_strict(level, default=None).alias("level"))
            .group_by("level").agg(pl.len().alias("tasks"), pl.col("success").sum().alias("solved")).sort("level")
        )
        print(f"{run} search, solved / train tasks by level: "
              + ", ".join(f"level {lv}: {s}/{n}" for lv, n, s in solved.iter_rows()))
    a, b = (episodes.filter(pl.col("run_id") == f"{r}/eval").select("task_id", "messages_json", "success") for r in rounds)
    both = a.join(b, on="task_id", suffix="_b")
    print(f"held-out episodes in both evaluations: {both.height}; token-identical: "
          f"{int((both['messages_json'] == both['messages_json_b']).sum())}; success flips: "
          f"{int((both['success'] != both['success_b']).sum())} "
          f"({int((both['success_b'] & ~both['success']).sum())} gained, {int((both['success'] & ~both['success_b']).sum())} lost)")
    for run, rows in zip(rounds, (a, b)):
        errors = Counter(e for e in map(first_tool_error, rows["messages_json"].to_list()) if e)
        print(f"{run}/eval: {rows.height} episodes, first tool reply an error in {sum(errors.values())}; most common:")
        for text, n in errors.most_common(args.top):
            print(f"  {n:4d}  {text[:120]}")
    if args.find:
        hit = lambda *cols: pl.any_horizontal(pl.col(c).str.contains(args.find, literal=True) for c in cols)  # noqa: E731
        tables = {
            "episodes": store.trajectories().filter(hit("messages_json")),
            "SFT rows": store.sft().filter(hit("messages_json")),
            "pairs": store.pairs().filter(hit("chosen_json", "rejected_json", "prompt_json")),
        }
        for name, rows in tables.items():
            counts = rows.group_by("run_id").len().sort("run_id").collect()
            print(f"{name} holding {args.find!r}: " + (", ".join(f"{r} {n}" for r, n in counts.iter_rows()) or "none"))
        print(f"tasks holding {args.find!r}: {store.tasks().filter(hit('task_json')).collect().height}")


if __name__ == "__main__":
    main()
