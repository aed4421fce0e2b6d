"""The generate flow on a real two-node Ray cluster started on this machine: a head node and a
worker node (`ray start`, each with its own temp dir, ports and session; tests/ray_nodes.py),
shards spread over both, the worker node killed (SIGKILL of its whole session) while it runs a
shard, and a rerun that writes exactly the shards the killed run did not commit."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import polars as pl
import pytest
from ray_nodes import alive_nodes, api_for_all_nodes, cluster, wait_for


def test_ray_options_follow_the_runtime_config():
    from pydantic import ValidationError

    from flows.runtime import RuntimeConfig, node_info, ray_options

    assert ray_options(RuntimeConfig()) == {}
    runtime = RuntimeConfig(task_runner="ray", gpus_per_shard=1, shard_resources={"worker": 1}, ray_spread=True,
                            ray_max_retries=0)
    assert ray_options(runtime) == {"num_gpus": 1, "resources": {"worker": 1}, "scheduling_strategy": "SPREAD",
                                    "max_retries": 0}
    with pytest.raises(ValidationError, match="ray_max_retries"):
        RuntimeConfig(ray_max_retries=-1)
    here = node_info()
    assert here["ray_node_id"] is None and here["pid"] > 0 and here["hostname"]


def _config(store: Path, tasks: int):
    from dataengine.config import EngineConfig

    return EngineConfig.model_validate({
        "store": str(store), "suites": ["arithmetic"], "num_tasks": tasks, "shard_size": 1, "sandbox": {"workers": 1},
        "policy": {"model": "tiny", "device": "cpu", "max_new_tokens": 8},
        "search": {"num_simulations": 2, "num_actions": 2, "max_depth": 2, "value": "zero"},
    })


def _assert_each_shard_once(store, run_id: str, shards: set[str]) -> None:
    tasks = store.tasks().filter(pl.col("run_id") == run_id).collect()
    assert sorted(tasks["shard_id"].to_list()) == sorted(shards)  # one task per shard, each once
    nodes = store.nodes().filter(pl.col("run_id") == run_id).collect()
    assert set(nodes["shard_id"]) == shards
    assert nodes.select("shard_id", "tree_id", "node_id").is_duplicated().sum() == 0
    assert nodes.group_by("shard_id").agg(pl.col("tree_id").n_unique())["tree_id"].to_list() == [1] * len(shards)
    trajectories = store.trajectories().filter(pl.col("run_id") == run_id).collect()
    assert trajectories["traj_id"].is_duplicated().sum() == 0


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_generate_on_two_nodes_survives_losing_the_worker_node(tmp_path):
    from flows.generate import run_generate
    from flows.runtime import RuntimeConfig
    from storage import Store

    store_path = tmp_path / "store"
    with cluster(workers=1, cpus=1) as c, api_for_all_nodes():
        head, worker = c.nodes
        # One CPU per node and SPREAD: two shards at a time, one on each node. No retries: a shard
        # lost with its node fails the run, and the rerun must redo it.
        spread = RuntimeConfig(task_runner="ray", ray_address=c.address, ray_spread=True, accelerator_slots=2,
                               retries=0, ray_max_retries=0)

        # 1. Both shards run at once, one on each node; each result names its node.
        first = run_generate(_config(store_path, 2), run_id="spread", runtime=spread)
        ran_on = {s["shard_id"]: s["node"]["ray_node_id"] for s in first["shards"]}
        assert len(ran_on) == 2 and set(ran_on.values()) == {c.node_of["head"], c.node_of["worker"]}, ran_on
        _assert_each_shard_once(Store(store_path), "spread", set(ran_on))

        # 2. The worker node dies (SIGKILL of its raylet, agents and workers) while it runs a shard.
        killed: dict[str, object] = {}

        def kill_when_busy() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                if worker.busy_task():
                    time.sleep(1.0)  # into the shard: the model loads, the search runs
                    killed["busy"] = worker.busy_task()
                    killed["committed"] = Store(store_path).committed_shards("tasks", "cut")
                    worker.kill()
                    return
                time.sleep(0.2)

        killer = threading.Thread(target=kill_when_busy, daemon=True)
        killer.start()
        with pytest.raises(Exception, match="node") as failure:  # Ray's NodeDiedError (WorkerCrashedError)
            run_generate(_config(store_path, 4), run_id="cut", runtime=spread)
        killer.join(30)
        assert killed.get("busy"), f"the worker node ran no shard to kill: {killed}"
        print(f"killed the worker node while it ran {killed['busy']}; the run failed with "
              f"{type(failure.value).__name__}; committed before the kill: {sorted(killed['committed'])}")

        # 3. Once the cluster knows the node is gone, the rerun (Ray's default task retries)
        # skips the committed shards and writes exactly the others, all on the head node.
        wait_for(lambda: list(alive_nodes(c.address).values()) == ["head"], "the worker node marked dead", 120,
                 c.nodes)
        committed = Store(store_path).committed_shards("tasks", "cut")
        assert len(committed) < 4
        rerun = run_generate(_config(store_path, 4), run_id="cut",
                             runtime=spread.model_copy(update={"ray_max_retries": None}))
        # The result lists every shard of the run; those committed before come back skipped=True.
        ran = [s for s in rerun["shards"] if not s["skipped"]]
        written = {s["shard_id"] for s in ran}
        assert {s["shard_id"] for s in rerun["shards"] if s["skipped"]} == committed
        assert rerun["skipped"] == len(committed) and not written & committed and len(written | committed) == 4
        assert {s["node"]["ray_node_id"] for s in ran} == {c.node_of["head"]}
        _assert_each_shard_once(Store(store_path), "cut", written | committed)
    # Everything the test started is gone (the cluster stops however the block ends).
    assert not head.processes() and not worker.processes()
