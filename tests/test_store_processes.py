"""Store under real processes: concurrent appends and a writer killed mid-shard."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl

from storage import Store

ROOT = Path(__file__).resolve().parents[1]

WRITER = """
import sys
from storage import Store
root, who, shards = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = Store(root)
for i in range(shards):
    rows = [dict(task_id="t", tree_id=who, node_id=j) for j in range(3)]
    # A shard of its own, then a shard every writer writes too.
    store.append("nodes", rows, run_id="r", shard_id=f"{who}-{i}")
    store.append("nodes", rows, run_id="r", shard_id=f"s{i}")
"""

BIG_WRITER = """
import sys, time
import pyarrow as pa
from storage import Store

def batches():
    for k in range(1000):
        if k == 20:
            # Several data files of the shard are on disk now; wait here to be killed.
            print("mid-shard", flush=True)
            time.sleep(600)
        yield pa.RecordBatch.from_pylist(
            [dict(task_id="t", tree_id="big", node_id=j, observation="x" * 200 + str(j)) for j in range(20000)]
        )

stream = pa.RecordBatchReader.from_batches(next(batches()).schema, batches())
Store(sys.argv[1], target_file_size=1 << 20).append("nodes", stream, run_id="r", shard_id="big")
"""


def _spawn(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_concurrent_appends_lose_and_double_nothing(tmp_path):
    procs = [_spawn(WRITER, str(tmp_path), who, "5") for who in "abc"]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    frame = Store(tmp_path).nodes().collect()
    counts = frame.group_by("shard_id").agg(n=pl.len(), trees=pl.col("tree_id").n_unique()).sort("shard_id")
    own = counts.filter(pl.col("shard_id").str.contains("-"))
    shared = counts.filter(~pl.col("shard_id").str.contains("-"))
    # Every writer's own shards are all there, once.
    assert own.height == 15 and own["n"].to_list() == [3] * 15
    # Shards written by all three at once hold one writer's copy: 3 rows of one tree.
    assert shared["shard_id"].to_list() == [f"s{i}" for i in range(5)]
    assert shared["n"].to_list() == [3] * 5 and shared["trees"].to_list() == [1] * 5


def test_writer_killed_mid_shard_leaves_nothing_visible(tmp_path):
    store = Store(tmp_path)
    store.append("nodes", [{"task_id": "t", "tree_id": "small", "node_id": 0}], run_id="r", shard_id="small")
    log = tmp_path / "nodes" / "_delta_log"
    before = sorted(log.glob("*.json"))
    proc = _spawn(BIG_WRITER, str(tmp_path))
    assert proc.stdout.readline().strip() == "mid-shard", proc.stderr.read()
    written = list((tmp_path / "nodes").glob("*.parquet"))
    assert len(written) > 2, "the writer should have data files of the shard on disk"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert sorted(log.glob("*.json")) == before
    frame = Store(tmp_path).nodes().collect()
    assert frame["shard_id"].to_list() == ["small"]
    # The shard can be written again after the crash.
    Store(tmp_path).append("nodes", [{"task_id": "t", "tree_id": "big", "node_id": 0}], run_id="r", shard_id="big")
    assert Store(tmp_path).committed_shards("nodes", "r") == {"small", "big"}
