"""Orchestration cost of the flows: the same generation run as plain Python
(`dataengine.search.generate`) and as the Prefect generate flow (a task per shard, the
accelerator concurrency slot, the store's committed-shard checks, the markdown artifact), on the
tiny model so that the model does not hide the overhead.

Prints wall seconds of each and the ratio flow / plain, for the first flow run (which pays for
starting Prefect's temporary API) and a second one in the same process (another run id), and
the cost of a rerun that finds every shard committed.

    .venv/bin/python benchmarks/bench_flows.py            # 16 tasks, 4 shards
    .venv/bin/python benchmarks/bench_flows.py --quick    # 4 tasks, 2 shards
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def config(store: Path, tasks: int, shard_size: int):
    from dataengine.config import EngineConfig

    return EngineConfig.model_validate({
        "store": str(store), "suites": ["arithmetic"], "num_tasks": tasks, "shard_size": shard_size,
        "sandbox": {"workers": 1}, "policy": {"model": "tiny", "device": "cpu", "max_new_tokens": 12},
        "search": {"num_simulations": 4, "num_actions": 2, "max_depth": 2, "value": "zero", "trees_per_batch": shard_size},
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 tasks in 2 shards")
    args = parser.parse_args()
    tasks, shard = (4, 2) if args.quick else (16, 4)
    from dataengine.search import generate
    from flows.generate import run_generate
    from flows.runtime import policy_for, private_prefect_home, release_resources

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = config(root / "store", tasks, shard)
        policy = policy_for(cfg)  # loaded once, outside every timing
        start = time.perf_counter()
        generate(cfg, method="mcts", run_id="plain", policy=policy, progress=False)
        plain = time.perf_counter() - start
        with private_prefect_home(root / "prefect"):
            start = time.perf_counter()
            run_generate(cfg, run_id="flow-1")
            first = time.perf_counter() - start
            start = time.perf_counter()
            run_generate(cfg, run_id="flow-2")
            second = time.perf_counter() - start
            start = time.perf_counter()
            run_generate(cfg, run_id="flow-2")
            rerun = time.perf_counter() - start
        release_resources()
    print(f"generation of {tasks} tasks in {tasks // shard} shards (tiny model, 4 simulations, K=2)")
    print(f"plain generate():                 {plain:7.1f} s   1.00x")
    print(f"flow, first run (starts the API): {first:7.1f} s   {first / plain:.2f}x")
    print(f"flow, second run:                 {second:7.1f} s   {second / plain:.2f}x")
    print(f"flow rerun, all shards committed: {rerun:7.1f} s   {rerun / plain:.2f}x")
    print(f"overhead per shard (second run):  {(second - plain) / (tasks // shard):7.2f} s")


if __name__ == "__main__":
    main()
