"""Why greedy evaluation episodes fail, by the first tool call (docs/search.md, schema edits):
success; no call; a call cut off at the token limit; a call missing a required argument; an argument outside the tool's enum; a
call that ran (then a wrong answer, or the wrong arguments of the right type).

    .venv/bin/dataengine eval --model smollm2 --suite units --tasks 30 --max-new-tokens 48 \\
      --no-search --k 0 --seed 0 --store S
    .venv/bin/python docs/scripts/call_failures.py S
    .venv/bin/python docs/scripts/call_failures.py runs/exp-units/store --run-id experiment/r1/eval
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


def kind(messages: list[dict]) -> str:
    calls = [c for m in messages if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
    tools = [m.get("content") or "" for m in messages if m["role"] == "tool"]
    if not calls:
        # A call whose closing tag fell past the token limit parses as no call.
        return "call cut off (unclosed tag)" if any("unclosed <tool_call>" in t for t in tools) else "no call"
    if "is a required property" in tools[0]:
        return "call missing a required argument"
    if "is not one of" in tools[0]:
        return "argument outside the enum"
    return "call ran, then wrong" if not tools[0].startswith("Error") else f"other error: {tools[0][:50]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store")
    parser.add_argument("--run-id", help="only this run's episodes (an experiment's store holds every round's)")
    args = parser.parse_args()
    rows = Store(args.store).trajectories()
    if args.run_id:
        rows = rows.filter(pl.col("run_id") == args.run_id)
    rows = rows.collect()
    counts = Counter("success" if r["success"] else kind(json.loads(r["messages_json"])) for r in rows.iter_rows(named=True))
    for name, n in counts.most_common():
        print(f"{n:4d}  {name}")
    print(f"{len(rows):4d}  episodes")


if __name__ == "__main__":
    main()
