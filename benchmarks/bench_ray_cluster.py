"""Throughput of the generate flow on a local Ray cluster: the same run (tiny model, one task per
shard) on one node, then on two nodes (a head and a worker node started with `ray start` on this
machine, one CPU each, shards spread with SPREAD), each cluster started fresh.

Prints wall seconds of each run (flow start to end: the Ray job's worker processes import the
code and load the model inside it) and shards per minute, in all and per node. Both nodes share
this machine's cores, so two nodes can be at most as fast as the cores allow.

    .venv/bin/python benchmarks/bench_ray_cluster.py             # 8 tasks
    .venv/bin/python benchmarks/bench_ray_cluster.py --tasks 4
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def config(store: Path, tasks: int):
    from dataengine.config import EngineConfig

    return EngineConfig.model_validate({
        "store": str(store), "suites": ["arithmetic"], "num_tasks": tasks, "shard_size": 1, "sandbox": {"workers": 1},
        "policy": {"model": "tiny", "device": "cpu", "max_new_tokens": 8},
        "search": {"num_simulations": 4, "num_actions": 2, "max_depth": 2, "value": "zero"},
    })


def timed_run(root: Path, tasks: int, workers: int) -> tuple[float, int]:
    """(wall seconds, nodes that ran shards) of one generate run on a fresh cluster."""
    from ray_nodes import api_for_all_nodes, cluster

    from flows.generate import run_generate
    from flows.runtime import RuntimeConfig

    with cluster(workers=workers, cpus=1) as c, api_for_all_nodes():
        runtime = RuntimeConfig(task_runner="ray", ray_address=c.address, ray_spread=True,
                                accelerator_slots=1 + workers)
        start = time.perf_counter()
        result = run_generate(config(root / f"store-{workers}", tasks), run_id=f"nodes-{1 + workers}", runtime=runtime)
        seconds = time.perf_counter() - start
    assert len(result["shards"]) == tasks
    return seconds, len({s["node"]["ray_node_id"] for s in result["shards"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8, help="tasks, one per shard")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from flows.runtime import private_prefect_home, release_resources

    with tempfile.TemporaryDirectory() as tmp, private_prefect_home(Path(tmp) / "prefect"):
        rows = []
        for workers in (0, 1):
            seconds, used = timed_run(Path(tmp), args.tasks, workers)
            rate = args.tasks / seconds * 60
            rows.append((1 + workers, used, seconds, rate))
        release_resources()
    print(f"load average before the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| nodes | nodes that ran shards | wall s | shards/min | shards/min per node |")
    print("|---|---|---|---|---|")
    for nodes, used, seconds, rate in rows:
        print(f"| {nodes} | {used} | {seconds:.1f} | {rate:.2f} | {rate / nodes:.2f} |")
    print(f"two nodes / one node: {rows[1][3] / rows[0][3]:.2f}x the shards per minute")


if __name__ == "__main__":
    main()
