"""Derivation speed: Polars step pairs against a plain-Python loop over the same node rows,
and the time of every derived dataset on synthetic trees.

    .venv/bin/python benchmarks/bench_derive.py            # 400 trees x 85 nodes (~34k nodes)
    .venv/bin/python benchmarks/bench_derive.py --quick    # 20 trees

Trees: fan-out 4, depth 3 (1 + 4 + 16 + 64 nodes); leaves are terminal, succeed with
probability 0.3, and every leaf is one trajectory. Q values are seeded uniform numbers.
The Python baseline must find exactly the same pairs (checked). Decontamination of each
dataset's rows (dataengine.derive.decontam, the cached eval index) is timed against its derivation.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl

from dataengine.derive import DeriveOptions, derive_frame
from dataengine.derive.decontam import decontaminate, eval_index
from dataengine.derive.pairs import step_pairs
from dataengine.derive.store import FORMAT_OF

FANOUT, DEPTH = 4, 3


def synthetic(trees: int, seed: int = 0) -> dict[str, pl.LazyFrame]:
    rng = random.Random(seed)
    nodes, trajs, tasks = [], [], []
    for t in range(trees):
        tree, task = f"tree{t}", f"task{t}"
        tasks.append({"run_id": "r", "shard_id": "s", "task_id": task, "task_json": json.dumps(
            {"id": task, "messages": [{"role": "user", "content": f"question {t}"}],
             "tools": [{"name": "add", "description": "", "parameters": {"type": "object"}}]})})
        messages = {0: [{"role": "user", "content": f"question {t}"}]}
        parents, frontier, next_id = {0: None}, [0], 1
        rows: dict[int, dict] = {0: {"depth": 0}}
        for depth in range(1, DEPTH + 1):
            new = []
            for p in frontier:
                for a in range(FANOUT):
                    n = next_id
                    next_id += 1
                    parents[n] = p
                    text = f"action {a} at {p}"
                    messages[n] = messages[p] + [{"role": "assistant", "content": text},
                                                 {"role": "tool", "name": "add", "content": str(n)}]
                    rows[n] = {"depth": depth, "text": text}
                    new.append(n)
            frontier = new
        for n, info in rows.items():
            leaf = info["depth"] == DEPTH
            success = rng.random() < 0.3 if leaf else None
            nodes.append({"run_id": "r", "tree_id": tree, "task_id": task, "suite": "synthetic", "node_id": n,
                          "parent_id": parents[n], "action_text": info.get("text"), "action_key": info.get("text"),
                          "q": rng.random(), "critic_score": None, "visits": rng.randint(0, 6),
                          "logprob": -rng.random() * 10, "terminal": leaf, "success": success, "env_hash": "e",
                          "messages_json": json.dumps(messages[n])})
            if leaf:
                path, x = [], n
                while x is not None:
                    path.append(x)
                    x = parents[x]
                trajs.append({"run_id": "r", "task_id": task, "suite": "synthetic", "tree_id": tree,
                              "traj_id": f"{tree}/{n}", "node_ids": path[::-1], "messages_json": json.dumps(messages[n]),
                              "reward": float(success), "success": success, "num_steps": DEPTH})
    return {"nodes": pl.DataFrame(nodes).lazy(), "trajectories": pl.DataFrame(trajs).lazy(),
            "tasks": pl.DataFrame(tasks).lazy()}


def python_step_pairs(rows: list[dict], tasks: list[dict], margin: float, min_visits: int) -> list[dict]:
    """The plain-Python baseline doing the same work: group children by parent, compare every
    ordered pair, attach the parent's conversation, both actions as messages and the tools."""
    from dataengine.derive.common import _openai_tools

    tools = {t["task_id"]: _openai_tools(t["task_json"]) for t in tasks}
    prompts = {(r["tree_id"], r["node_id"]): r["messages_json"] for r in rows}
    children: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        if r["parent_id"] is not None and r["q"] is not None and (r["visits"] or 0) >= min_visits:
            children.setdefault((r["tree_id"], r["parent_id"]), []).append(r)
    out = []
    for (tree, parent), kids in children.items():
        for a in kids:
            for b in kids:
                gap = a["q"] - b["q"]
                if gap > 0 and gap >= margin and a["action_key"] != b["action_key"]:
                    out.append({
                        "tree_id": tree, "chosen": a["node_id"], "rejected": b["node_id"], "margin": gap,
                        "prompt_json": prompts[(tree, parent)], "tools_json": tools[a["task_id"]],
                        "chosen_json": json.dumps([{"role": "assistant", "content": a["action_text"]}]),
                        "rejected_json": json.dumps([{"role": "assistant", "content": b["action_text"]}]),
                        "chosen_logprob": a["logprob"], "rejected_logprob": b["logprob"],
                    })
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trees", type=int, default=None)
    args = parser.parse_args()
    trees = args.trees or (20 if args.quick else 400)
    frames = synthetic(trees)
    frames = {k: v.collect().lazy() for k, v in frames.items()}
    n_nodes = frames["nodes"].select(pl.len()).collect().item()
    print(f"{trees} trees, {n_nodes} nodes")

    start = time.perf_counter()
    ours = step_pairs(frames["nodes"], frames["tasks"], rule="margin", margin=0.2, min_visits=1).collect()
    polars_s = time.perf_counter() - start
    rows = frames["nodes"].collect().to_dicts()
    start = time.perf_counter()
    baseline = python_step_pairs(rows, frames["tasks"].collect().to_dicts(), 0.2, 1)
    python_s = time.perf_counter() - start
    baseline = {(p["tree_id"], p["chosen"], p["rejected"]) for p in baseline}
    got = {(r["tree_id"], int(r["pair_id"].split("/")[-1].split(">")[0]), int(r["pair_id"].split(">")[1]))
           for r in ours.select("tree_id", "pair_id").to_dicts()}
    assert got == baseline, "Polars and the Python baseline disagree"
    print(f"step pairs: {ours.height} pairs; polars {polars_s:.3f} s (incl. prompts and tools), "
          f"python loop {python_s:.3f} s (same columns); ratio python/polars {python_s / polars_s:.2f}")
    options = DeriveOptions(pair_rule="margin", margin=0.2)
    index = eval_index()
    index.refusals([["warm the faiss index up"]], [[]])
    for kind in ("step-pairs", "trajectory-pairs", "sft", "recovery", "replay"):
        start = time.perf_counter()
        frame = derive_frame(kind, frames, options)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        kept, _ = decontaminate(frame, FORMAT_OF[kind].store_message_columns, index)
        decontam_s = time.perf_counter() - start
        assert kept.height == frame.height, "a synthetic question matched an eval item"
        print(f"{kind:17s} {frame.height:7d} rows  {seconds:6.3f} s  {n_nodes / seconds:10.0f} nodes/s  "
              f"decontamination / derivation {decontam_s / seconds:.2f}")


if __name__ == "__main__":
    main()
