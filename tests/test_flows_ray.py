"""The generate flow's shards on a local Ray instance (prefect-ray's RayTaskRunner)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def test_generate_shards_on_local_ray(tmp_path):
    import ray

    from dataengine.config import EngineConfig
    from flows.generate import run_generate
    from flows.runtime import RuntimeConfig
    from storage import Store

    config = EngineConfig.model_validate({
        "store": str(tmp_path / "store"), "suites": ["arithmetic"], "num_tasks": 4, "shard_size": 2,
        "sandbox": {"workers": 1}, "policy": {"model": "tiny", "device": "cpu", "max_new_tokens": 8},
        "search": {"num_simulations": 2, "num_actions": 2, "max_depth": 2, "value": "zero"},
    })
    result = run_generate(config, run_id="ray", runtime=RuntimeConfig(task_runner="ray", ray_num_cpus=2))
    assert sorted(s["shard_id"] for s in result["shards"]) == ["tasks-000000-000001", "tasks-000002-000003"]
    assert Store(tmp_path / "store").committed_shards("tasks", "ray") == {"tasks-000000-000001", "tasks-000002-000003"}
    # The Ray instance was started for the flow and shut down with it.
    assert not ray.is_initialized()
