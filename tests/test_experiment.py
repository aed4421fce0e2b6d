"""`dataengine experiment` on the tiny model: the per-round results, and a kill -9 mid-run
after which the rerun resumes at the stage it reached without redoing finished stages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SIZES = ["--suite", "arithmetic", "--rounds", "1", "--train-tasks", "2", "--heldout-tasks", "2", "--model", "tiny",
         "--trainers", "sft,dpo,grpo",
         "--set", "engine.search.num_simulations=2", "--set", "engine.search.num_actions=2",
         "--set", "engine.search.max_depth=2", "--set", "engine.search.value=zero",
         "--set", "engine.policy.max_new_tokens=6", "--set", "engine.policy.device=cpu",
         "--set", "engine.eval.max_new_tokens=6", "--set", "engine.eval.search_simulations=2",
         "--set", "engine.eval.search_actions=2", "--set", "engine.env.max_steps=2",
         "--set", "engine.sandbox.workers=1",
         # From round 1 on: the round's search must use it (checked in the store's runs table).
         "--round-set", "1:search.num_simulations=3"]


def test_experiment_resumes_after_kill(tmp_path):
    out = tmp_path / "exp"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    cmd = [sys.executable, "-m", "dataengine.cli", "experiment", "--out", str(out), *SIZES]
    journal = out / "pipeline" / "journal.json"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.is_file() and "r1/generate" in json.loads(journal.read_text())["stages"]:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the experiment ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = json.loads(journal.read_text())
    done = set(killed["stages"])
    assert {"r0/evaluate", "r1/generate"} <= done and "r1/evaluate" not in done
    assert killed["seconds"] >= killed["stages"]["r0/evaluate"]["seconds"] + killed["stages"]["r1/generate"]["seconds"]

    from storage import Store

    nodes_version = Store(out / "store").version("nodes")
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    # The finished stages were not run again: no new search shard was written.
    assert Store(out / "store").version("nodes") == nodes_version
    stages = json.loads(journal.read_text())["stages"]
    assert {"r0/evaluate", "r1/generate", "r1/derive", "r1/export", "r1/evaluate"} <= set(stages)
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rows"]] == [0, 1]
    assert all(r["greedy"] is not None and r["search_deployable"] is not None for r in results["rows"])
    assert results["rows"][1]["trees"] == 2 and "generate" in results["rows"][1]["seconds"]
    # Wall time: this call's, and every call's (the killed one up to its last finished stage).
    assert results["journal_seconds"] >= results["seconds"] + killed["seconds"] - 1
    text = (out / "results.md").read_text()
    assert "min over every call" in text
    assert "search, deployable" in text and "oracle bound" in text and "greedy by level" in text
    assert all(r["by_level"] and set(r["by_level"]) <= {"1", "2", "3"} for r in results["rows"])
    assert (out / "success.png").stat().st_size > 0 and (out / "report" / "report.html").is_file()
    import polars as pl

    searched = Store(out / "store").runs().filter(pl.col("run_id") == "experiment/r1", pl.col("kind") == "generate")
    configs = [json.loads(c) for c in searched.collect()["config_json"]]
    assert configs and all(c["engine"]["search"]["num_simulations"] == 3 for c in configs)


def test_journal_refuses_another_config(tmp_path):
    from dataengine.evaluation.experiment import experiment_config
    from flows.pipeline import Journal

    a = experiment_config(out=str(tmp_path), suites=["arithmetic"], model="tiny")
    b = experiment_config(out=str(tmp_path), suites=["arithmetic"], model="tiny", train_tasks=5)
    more_rounds = experiment_config(out=str(tmp_path), suites=["arithmetic"], model="tiny", rounds=5)
    journal = Journal(tmp_path / "journal.json", a)
    calls = []
    assert journal.run("r1/x", lambda: calls.append(1) or {"v": 1}) == {"v": 1}
    assert Journal(tmp_path / "journal.json", a).run("r1/x", lambda: calls.append(2)) == {"v": 1}
    assert calls == [1]
    # More rounds extend a finished experiment: its stages are kept.
    assert Journal(tmp_path / "journal.json", more_rounds).run("r1/x", lambda: calls.append(3)) == {"v": 1}
    assert calls == [1]
    with pytest.raises(ValueError, match="another pipeline config"):
        Journal(tmp_path / "journal.json", b)


def test_fork_starts_from_the_first_rounds_of_another_experiment(tmp_path):
    """A fork copies the store and reuses the source's journal stages of the rounds it takes,
    keyed to its own config; the source's later rounds and a clashing run id are refused."""
    from dataengine.evaluation.experiment import experiment_config
    from flows.pipeline import Journal, fork_pipeline, forked_from
    from storage import Store

    source = experiment_config(out=str(tmp_path / "a"), suites=["arithmetic"], model="tiny", rounds=2)
    store = Store(source.engine.store)
    for run in ("experiment", "experiment/r1", "experiment/r2"):
        store.record_run(run, kind="generate", seed=0)
    journal = Journal(Path(source.out_dir) / "journal.json", source)
    for key in ("r0/evaluate", "r1/generate", "r1/evaluate", "r2/generate"):
        journal.run(key, lambda key=key: {"stage": key})

    def fork(name: str, rounds: int = 1, **overrides):
        cfg = experiment_config(out=str(tmp_path / name), suites=["arithmetic"], model="tiny", rounds=2,
                                overrides={"engine__search__objective": "efficient_success", **overrides})
        return cfg, fork_pipeline(source.out_dir, source.engine.store, cfg, rounds)

    with pytest.raises(ValueError, match="experiment/r2"):
        fork("same-id")
    assert not (tmp_path / "same-id" / "store").exists()
    with pytest.raises(ValueError, match=r"unfinished stages \['r2/evaluate'\]"):
        fork("too-far", rounds=2, run_id="fork")
    cfg, forked = fork("b", run_id="fork")
    assert sorted(forked.done) == ["r0/evaluate", "r1/evaluate", "r1/generate"]
    assert forked.key != journal.key and forked_from(cfg.out_dir)["rounds"] == 1
    reopened = Journal(Path(cfg.out_dir) / "journal.json", cfg)
    assert reopened.run("r1/generate", lambda: 1 / 0) == {"stage": "r1/generate"}
    reopened.run("r2/generate", lambda: {"stage": "new"})
    assert forked_from(cfg.out_dir)["out_dir"] == source.out_dir
    assert Store(cfg.engine.store).runs().collect().height == store.runs().collect().height
    with pytest.raises(ValueError, match="exists; choose a new folder"):
        fork_pipeline(source.out_dir, source.engine.store, cfg, 1)


def test_chained_training_stages_on_derived_sets(tmp_path):
    """The experiment's chain on a hand-built tree with successes and pairs (the tiny model finds
    none by itself): derive -> export -> SFT -> DPO from the SFT checkpoint, both registered."""
    from test_derive import RUN, task_row, tree_nodes, tree_trajectories

    from dataengine.config import DPOTrainConfig, SFTTrainConfig
    from dataengine.stages.datasets import derive_datasets, export_dataset
    from dataengine.stages.train import train_checkpoint
    from storage import Store
    from storage.export import ExportFilters

    store = Store(tmp_path / "store")
    store.append("nodes", tree_nodes(), run_id=RUN, shard_id="s0", marker="tasks")
    store.append("trajectories", tree_trajectories(), run_id=RUN, shard_id="s0", marker="tasks")
    store.append("tasks", [task_row()], run_id=RUN, shard_id="s0")
    derive_datasets(store, ["sft", "step-pairs"], run_ids=[RUN])
    only = ExportFilters(run_ids=[RUN])
    sft = export_dataset(store, "sft", str(tmp_path / "sft.parquet"), filters=only)
    pairs = export_dataset(store, "pairs", str(tmp_path / "pairs.parquet"), filters=only)
    assert sft.rows == 1 and pairs.rows == 2
    common = {"max_steps": 1, "batch_size": 1, "max_length": 256, "device": "cpu", "run_id": RUN}
    first, _ = train_checkpoint("sft", SFTTrainConfig(init="tiny", out_dir=str(tmp_path / "c-sft"), **common),
                                sft.path, store=store)
    second, _ = train_checkpoint("dpo", DPOTrainConfig(init=first.path, out_dir=str(tmp_path / "c-dpo"), **common),
                                 pairs.path, store=store)
    models = store.models().collect()
    assert set(models["kind"]) == {"sft", "dpo"}
    assert models.filter(models["kind"] == "dpo")["parent_id"][0] == first.model_id
    assert Path(second.path, "config.json").is_file()
