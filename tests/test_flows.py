"""Prefect flows on the ephemeral API with the tiny model: generate per shard, a rerun that
skips committed shards, retries of transient errors, derive and export."""

from __future__ import annotations

import pytest

from dataengine.config import EngineConfig


@pytest.fixture(scope="module", autouse=True)
def prefect_home(tmp_path_factory):
    """A private PREFECT_HOME (and so a private ephemeral API database) for these tests."""
    from flows.runtime import private_prefect_home, release_resources

    with private_prefect_home(tmp_path_factory.mktemp("prefect")):
        yield
    release_resources()


def tiny_config(store, num_tasks=4, **search) -> EngineConfig:
    return EngineConfig.model_validate({
        "store": str(store),
        "suites": ["arithmetic"],
        "num_tasks": num_tasks,
        "shard_size": 2,
        "sandbox": {"workers": 1},
        "policy": {"model": "tiny", "device": "cpu", "max_new_tokens": 12},
        "search": {"num_simulations": 3, "num_actions": 2, "max_depth": 2, "value": "zero", "trees_per_batch": 2, **search},
    })


def test_generate_then_rerun_skips_committed_shards(tmp_path):
    from flows.generate import run_generate
    from storage import Store

    config = tiny_config(tmp_path / "store")
    first = run_generate(config, run_id="g1")
    assert [s["shard_id"] for s in first["shards"]] == ["tasks-000000-000001", "tasks-000002-000003"]
    assert all(not s["skipped"] and s["trees"] == 2 for s in first["shards"])
    store = Store(tmp_path / "store")
    assert store.committed_shards("tasks", "g1") == {"tasks-000000-000001", "tasks-000002-000003"}
    nodes_version = store.version("nodes")
    # Two more tasks: only the new third shard is searched; the first two are skipped.
    second = run_generate(tiny_config(tmp_path / "store", num_tasks=6), run_id="g1")
    assert [s["shard_id"] for s in second["shards"]] == ["tasks-000004-000005"]
    assert second["skipped"] == 2
    assert store.version("nodes") == nodes_version + 1
    counts = store.tasks().collect().group_by("shard_id").len()
    assert sorted(counts["len"].to_list()) == [2, 2, 2]
