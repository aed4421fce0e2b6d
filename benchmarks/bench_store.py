"""Store benchmarks, each with a baseline measured in the same run:

1. append throughput: `Store.append` per shard (a Delta commit that replaces the shard) vs
   writing the same Arrow table with `pyarrow.parquet.write_table`;
2. a group-by over 1,000,000 node rows with Polars: `Store.nodes()` (scan_delta) vs
   `pl.scan_parquet` of one plain Parquet file with the same rows;
3. a filtered export of 100,000 pairs to TRL parquet (JSON -> message lists, exact dedup) vs
   the same filter through Polars writing the raw rows.

Run: .venv/bin/python benchmarks/bench_store.py [--quick] [--nodes N] [--pairs N] [--shards N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataengine.derive.export import export
from storage import Store
from storage.export import ExportFilters
from storage.queries import node_stats


def node_table(n: int, seed: int = 0) -> pa.Table:
    """n synthetic node rows: 100-node trees, depth 0-9, visits, Q, short action text."""
    rng = np.random.default_rng(seed)
    idx = np.arange(n)
    frame = pl.DataFrame({
        "task_id": pl.Series((idx // 1000).astype(str)).str.replace(r"^", "task-"),
        "suite": np.where(idx % 3 == 0, "arith", "orders"),
        "tree_id": pl.Series((idx // 100).astype(str)),
        "node_id": idx % 100,
        "parent_id": pl.Series((idx % 100 - 1) // 4).set(pl.Series(idx % 100 == 0), None),
        "depth": (idx % 100) // 10,
        "action_text": pl.Series((idx % 997).astype(str)).str.replace(r"^", '<tool_call>{"name": "add", "arguments": {"a": '),
        "visits": rng.integers(0, 64, n),
        "q": rng.random(n),
        "value_estimate": rng.random(n),
        "prior": rng.random(n),
        "terminal": idx % 10 == 9,
        "model_id": "smollm2-135m",
    })
    return frame.to_arrow()


def pair_rows(n: int, seed: int = 0) -> pl.DataFrame:
    """n synthetic step pairs over 2,000 tasks; about 10% repeat the previous row exactly."""
    rng = np.random.default_rng(seed)
    tools = json.dumps([{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}])
    task = np.arange(n) % 2000
    b = rng.integers(0, 10**9, n)
    repeat = np.flatnonzero(rng.random(n) < 0.1)
    repeat = repeat[repeat > 0]
    task[repeat] = task[repeat - 1]
    b[repeat] = b[repeat - 1]

    def call(a: int, x: int) -> str:
        content = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {x}}}}}</tool_call>'
        return json.dumps([{"role": "assistant", "content": content}])

    return pl.DataFrame({
        "pair_id": [f"p{i}" for i in range(n)],
        "kind": np.where(np.arange(n) % 4 == 0, "trajectory", "step"),
        "task_id": [f"t{t}" for t in task],
        "suite": "arith",
        "prompt_json": [json.dumps([{"role": "system", "content": "You can call add and multiply."},
                                    {"role": "user", "content": f"What is {t} plus 25?"}]) for t in task],
        "chosen_json": [call(t, 25) for t in task],
        "rejected_json": [call(t, x) for t, x in zip(task, b)],
        "tools_json": tools,
        "margin": rng.random(n),
    })


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_append(root: Path, rows: int, shards: int) -> dict:
    table = node_table(rows)
    store = Store(root / "store")
    per = rows // shards
    parts = [table.slice(i * per, per) for i in range(shards)]
    plain = root / "plain"
    plain.mkdir()
    # Warm-up outside the timings: imports, table creation, first file writes.
    store.append("nodes", parts[0].slice(0, 10), run_id="warmup", shard_id="0")
    pq.write_table(parts[0].slice(0, 10), plain / "warmup.parquet")
    t_pq = timed(lambda: [pq.write_table(p, plain / f"{i}.parquet") for i, p in enumerate(parts)])
    t_store = timed(lambda: [store.append("nodes", p, run_id="bench", shard_id=str(i)) for i, p in enumerate(parts)])
    t_again = timed(lambda: store.append("nodes", parts[0], run_id="bench", shard_id="0"))
    assert store.nodes().filter(pl.col("run_id") == "bench").select(pl.len()).collect().item() == per * shards
    return {"rows": per * shards, "shards": shards, "pyarrow_s": t_pq, "store_s": t_store,
            "store_rows_per_s": per * shards / t_store, "pyarrow_rows_per_s": per * shards / t_pq,
            "ratio_store_over_pyarrow": t_store / t_pq, "rewrite_one_shard_s": t_again}


def bench_groupby(root: Path, rows: int) -> dict:
    store = Store(root / "gb")
    table = node_table(rows, seed=1)
    chunk = max(1, rows // 10)
    for i in range(0, rows, chunk):
        store.append("nodes", table.slice(i, chunk), run_id="bench", shard_id=str(i))
    plain = root / "nodes.parquet"
    pq.write_table(store.to_arrow("nodes", table, run_id="bench", shard_id="0"), plain)

    def query(frame: pl.LazyFrame) -> pl.DataFrame:
        return (frame.group_by("suite", "depth")
                .agg(nodes=pl.len(), visits=pl.col("visits").sum(), q=pl.col("q").mean(),
                     q_p90=pl.col("q").quantile(0.9), terminal=pl.col("terminal").mean())
                .sort("suite", "depth").collect())

    query(pl.scan_parquet(plain))  # warm the file cache for both
    t_plain = min(timed(lambda: query(pl.scan_parquet(plain))) for _ in range(3))
    t_store = min(timed(lambda: query(store.nodes())) for _ in range(3))
    t_stats = timed(lambda: node_stats(store).collect())
    a, b = query(pl.scan_parquet(plain)), query(store.nodes())
    assert a.select("suite", "depth", "nodes", "visits").equals(b.select("suite", "depth", "nodes", "visits"))
    return {"rows": rows, "parquet_s": t_plain, "store_s": t_store, "ratio_store_over_parquet": t_store / t_plain,
            "node_stats_s": t_stats}


def bench_export(root: Path, rows: int) -> dict:
    store = Store(root / "ex")
    pairs = pair_rows(rows)
    chunk = max(1, rows // 4)
    for i in range(0, rows, chunk):
        store.append("pairs", pairs.slice(i, chunk), run_id="bench", shard_id=str(i))
    filters = ExportFilters(min_margin=0.2, kinds=["step"])
    t_raw = timed(lambda: store.pairs().filter((pl.col("margin") >= 0.2) & (pl.col("kind") == "step"))
                  .collect().write_parquet(root / "raw.parquet"))
    result = {}
    t_export = timed(lambda: result.update(r=export(store, "pairs", root / "trl.parquet", filters=filters)))
    t_near = timed(lambda: result.update(n=export(store, "pairs", root / "near.parquet", filters=filters, dedup="near")))
    r, n = result["r"], result["n"]
    return {"pairs": rows, "kept": r.rows, "exact_removed": r.dedup["exact_removed"], "raw_filter_s": t_raw,
            "export_s": t_export, "ratio_export_over_raw": t_export / t_raw, "export_near_s": t_near,
            "near_removed": n.dedup["near_removed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds)")
    parser.add_argument("--append-rows", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--pairs", type=int, default=100_000)
    args = parser.parse_args()
    if args.quick:
        args.append_rows, args.shards, args.nodes, args.pairs = 20_000, 5, 50_000, 5_000
    root = Path(tempfile.mkdtemp(prefix="bench_store_"))
    try:
        results = {
            "append": bench_append(root, args.append_rows, args.shards),
            "groupby": bench_groupby(root, args.nodes),
            "export": bench_export(root, args.pairs),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, values in results.items():
        print(name + ": " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
