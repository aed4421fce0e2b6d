"""Why episodes fail, by the first tool call (docs/search.md, schema edits; the kinds are
dataengine.report.failures'): success; no call; a call cut off at the token limit; an empty first reply;
an unknown tool; a call missing a required argument, with an argument outside the tool's enum or
an unexpected one; a tool that raised; a call that ran (then a wrong answer, or the wrong
arguments of the right type). `dataengine report` shows the same table per run and suite.

    .venv/bin/dataengine eval --model smollm2 --suite units --tasks 30 --max-new-tokens 48 \\
      --no-search --k 0 --seed 0 --store S
    .venv/bin/python docs/scripts/call_failures.py S
    .venv/bin/python docs/scripts/call_failures.py runs/exp-units/store --run-id experiment/r1/eval
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import polars as pl  # noqa: E402

from dataengine.report.failures import failure_kinds  # noqa: E402
from storage import Store  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store")
    parser.add_argument("--run-id", help="only this run's episodes (an experiment's store holds every round's)")
    args = parser.parse_args()
    rows = Store(args.store).trajectories()
    if args.run_id:
        rows = rows.filter(pl.col("run_id") == args.run_id)
    kinds = failure_kinds(rows.collect()).group_by("kind").agg(pl.col("episodes").sum()).sort("episodes", "kind", descending=[True, False])
    for kind, n in kinds.iter_rows():
        print(f"{n:4d}  {kind}")
    print(f"{kinds['episodes'].sum():4d}  episodes")


if __name__ == "__main__":
    main()
