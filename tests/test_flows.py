"""Prefect flows on the ephemeral API with the tiny model: generate per shard, a rerun that
skips committed shards, retries of transient errors, derive and export."""

from __future__ import annotations

import polars as pl
import pytest

from dataengine.config import EngineConfig

pytestmark = pytest.mark.usefixtures("prefect_api")


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
    # Two more tasks: only the new third shard is searched; the first two are skipped, their
    # counts read back from the store equal to what the first call reported.
    second = run_generate(tiny_config(tmp_path / "store", num_tasks=6), run_id="g1")
    assert [s["shard_id"] for s in second["shards"]] == [s["shard_id"] for s in first["shards"]] + ["tasks-000004-000005"]
    assert [s["skipped"] for s in second["shards"]] == [True, True, False] and second["skipped"] == 2
    counted = ("trees", "nodes", "trajectories", "successes", "solved", "generated_tokens")
    for before, again in zip(first["shards"], second["shards"][:2]):
        assert {k: again[k] for k in counted} == {k: before[k] for k in counted}
    assert sum(first["shards"][0]["task_tokens"].values()) == first["shards"][0]["generated_tokens"]
    assert store.version("nodes") == nodes_version + 1
    counts = store.tasks().collect().group_by("shard_id").len()
    assert sorted(counts["len"].to_list()) == [2, 2, 2]
    run = store.runs().filter(pl.col("run_id") == "g1").collect().to_dicts()
    assert len(run) == 1 and run[0]["model_id"]  # the pre-shard row (no model id) was rewritten after

    # The same run id with another search setting is refused before any shard, nothing written.
    from storage.errors import StoreError

    with pytest.raises(StoreError, match="'g1' was written with other settings"):
        run_generate(tiny_config(tmp_path / "store", num_tasks=8, num_simulations=2), run_id="g1")
    assert store.version("nodes") == nodes_version + 1
    assert store.runs().filter(pl.col("run_id") == "g1").collect().to_dicts() == run

    # Rescore: the same verifiers over replayed episodes give the same rewards, shard by shard.
    from flows.derived import rescore_flow

    rescored = rescore_flow(config=tiny_config(tmp_path / "store", num_tasks=6), run_id="g1")
    assert rescored["run_id"] == "g1/rescore" and len(rescored["shards"]) == 3
    assert sum(s["trajectories"] for s in rescored["shards"]) == store.trajectories().filter(
        pl.col("run_id") == "g1").collect().height
    assert all(s["changed"] == 0 for s in rescored["shards"])
    assert rescore_flow(config=tiny_config(tmp_path / "store", num_tasks=6), run_id="g1")["skipped"] == 3


def test_rescore_records_its_run_alike_from_the_cli_and_the_flow(tmp_path):
    """One driver: the lineage row is recorded before the shards, with the verifier versions,
    by `dataengine rescore`'s in-process path and the flow alike; a rerun with every shard done
    leaves it as it was."""
    import json

    import typer
    from typer.testing import CliRunner

    from dataengine.commands import derive_eval
    from dataengine.stages.generate import generate
    from flows.derived import rescore_flow
    from storage import Store

    config = tiny_config(tmp_path / "store", num_tasks=2)
    generate(config, run_id="g", progress=False)
    store = Store(tmp_path / "store")

    def row(run_id: str) -> dict:
        rows = store.runs().filter(pl.col("run_id") == run_id).collect().to_dicts()
        assert len(rows) == 1, rows
        return {"kind": rows[0]["kind"], "versions": json.loads(rows[0]["verifier_versions_json"]),
                "source": json.loads(rows[0]["config_json"])["source_run"]}

    app = typer.Typer()
    derive_eval.register(app)

    def cli() -> str:
        out = CliRunner().invoke(app, ["rescore", "--run", "g", "--out-run", "g/cli", "--store", str(store.root)])
        assert out.exit_code == 0, out.output
        return out.output

    shards = [json.loads(line) for line in cli().splitlines()]
    flow = rescore_flow(config=config, run_id="g", out_run_id="g/flow")
    assert [s["trajectories"] for s in shards] == [s["trajectories"] for s in flow["shards"]]
    assert row("g/cli") == row("g/flow") and row("g/cli")["versions"] and row("g/cli")["kind"] == "rescore"
    before = {r: row(r) for r in ("g/cli", "g/flow")}
    assert "nothing to do" in cli()
    assert rescore_flow(config=config, run_id="g", out_run_id="g/flow")["skipped"] == 1
    assert {r: row(r) for r in before} == before


def test_importing_flows_creates_a_nested_prefect_home(tmp_path):
    """Prefect makes only PREFECT_HOME's last level; without its parent the embedded API cannot
    open its database and a flow waits on it. Importing `flows` creates the whole path."""
    import os
    import subprocess
    import sys

    home = tmp_path / "a" / "b" / "prefect"
    env = {**os.environ, "PREFECT_HOME": str(home)}
    subprocess.run([sys.executable, "-c", "import flows"], env=env, check=True, timeout=120)
    assert home.is_dir()


def test_transient_classification():
    from flows.runtime import transient
    from storage import RetryableStoreError

    assert transient(RetryableStoreError("lost a commit race"))
    assert transient(TimeoutError("tool call timed out"))
    wrapped = RuntimeError("shard failed")
    wrapped.__cause__ = ConnectionError("worker went away")
    assert transient(wrapped)
    assert not transient(ValueError("bad config"))
    assert not transient(KeyError("suite"))


def test_shard_retry_policy_retries_transient_errors_only(tmp_path):
    """A shard task with the flows' retry options: a lost commit race is retried (with backoff)
    and the shard ends committed once; bad input fails at once, without retries."""
    from prefect import flow, task

    from flows.runtime import RuntimeConfig, shard_options
    from storage import RetryableStoreError, Store

    store = Store(tmp_path / "store")
    attempts = {"flaky": 0, "bad": 0}

    def flaky_shard(shard_id: str) -> int:
        attempts["flaky"] += 1
        if attempts["flaky"] == 1:
            raise RetryableStoreError("append lost 12 commit races; retry it")
        return store.append("tasks", [{"task_id": "t1"}], run_id="retry", shard_id=shard_id)

    def bad_shard(shard_id: str) -> int:
        attempts["bad"] += 1
        raise ValueError(f"shard {shard_id}: unknown suite 'nope'")

    options = shard_options(RuntimeConfig(retries=2, retry_delay_s=0.1))
    flaky = task(flaky_shard, name="flaky-shard").with_options(**options)
    bad = task(bad_shard, name="bad-shard").with_options(**options)

    @flow(name="retry-test")
    def run(fn) -> int:
        return fn.submit("s0").result()

    run(flaky)
    assert attempts["flaky"] == 2
    assert store.tasks().collect().height == 1 and store.committed_shards("tasks", "retry") == {"s0"}
    with pytest.raises(ValueError, match="unknown suite"):
        run(bad)
    assert attempts["bad"] == 1


def test_export_then_train_dpo_flow_resumes(tmp_path):
    """Hand-built pairs -> export flow (TRL preference parquet) -> train_dpo flow (tiny model,
    one step) -> checkpoint registered; a rerun finds the checkpoint and does not train again."""
    import json

    from dataengine.config import DPOTrainConfig
    from flows.derived import export_flow
    from flows.train import train_dpo_flow
    from storage import Store

    store = Store(tmp_path / "store")
    prompt = [{"role": "user", "content": "What is 2 plus 3?"}]
    good = [{"role": "assistant", "content": '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'}]
    worse = [{"role": "assistant", "content": "6"}]
    rows = [{"pair_id": f"p{i}", "kind": "step", "task_id": f"t{i}", "prompt_json": json.dumps(prompt),
             "chosen_json": json.dumps(good), "rejected_json": json.dumps(worse), "tools_json": "[]", "margin": 0.5,
             "chosen_logprob": -1.0, "rejected_logprob": -2.0} for i in range(2)]
    store.append("pairs", rows, run_id="p/r1", shard_id="derive/step-pairs")
    store.append("pairs", rows[:1], run_id="other", shard_id="derive/step-pairs")
    exported = export_flow(store=str(store.root), out_dir=str(tmp_path / "data"), kinds=["pairs", "sft"], run_ids=["p/r1"])
    assert exported["pairs"]["rows"] == 1  # two equal pairs: exact dedup keeps one; run "other" left out
    assert exported["sft"]["rows"] == 0 and exported["sft"]["path"] is None
    # balance_by reaches the export: the one pair of task t0 (level 1) stays one row.
    store.append("tasks", [{"task_id": "t0", "task_json": json.dumps({"metadata": {"level": 1}})}], run_id="p/r1",
                 shard_id="0")
    balanced = export_flow(store=str(store.root), out_dir=str(tmp_path / "bal"), kinds=["pairs"], run_ids=["p/r1"],
                           balance_by="level")
    assert balanced["pairs"]["balance"] == {"by": "level", "rows_before": {"1": 1}}
    # balance_kinds leaves the other exports as derived.
    unbalanced = export_flow(store=str(store.root), out_dir=str(tmp_path / "unbal"), kinds=["pairs"], run_ids=["p/r1"],
                             balance_by="level", balance_kinds=["sft"])
    assert unbalanced["pairs"]["balance"] == {} and unbalanced["pairs"]["rows"] == 1
    settings = DPOTrainConfig(init="tiny", out_dir=str(tmp_path / "ckpt"), run_id="p/r1", max_steps=1, batch_size=1,
                              max_length=128, device="cpu")
    args = {"data": exported["pairs"]["path"], "store": str(store.root), "config": settings}
    info = train_dpo_flow(**args)
    assert info["kind"] == "dpo" and not info["resumed"]
    assert store.models().collect()["model_id"].to_list() == [info["model_id"]]
    again = train_dpo_flow(**args)
    assert again["resumed"] and again["model_id"] == info["model_id"]

    # One model id across train, models and evals: the loaded checkpoint reports the id it was
    # registered under, and it moved the weights.
    from dataengine.models import load_model, model_id

    assert model_id(load_model(info["path"])[0]) == info["model_id"]
    assert info["metrics"]["weights_changed"] is True

    # The checkpoint records what it learned from: evaluating it on that question is refused.
    from dataengine.stages.evaluate import check_not_trained_on
    from dataengine.suites import generate_suite

    task = generate_suite("arithmetic", n_train=0, n_heldout=1, seed=0)[0]
    check_not_trained_on(info["path"], [task])
    leaked = task.model_copy(update={"messages": [task.messages[0].model_copy(update={"content": "what is 2  plus 3?"})]})
    with pytest.raises(ValueError, match="training data of checkpoint"):
        check_not_trained_on(info["path"], [task, leaked])


def test_train_section_names_unknown_fields():
    """Trainer settings live in the one config tree: a typo in a YAML file is an error naming
    the dotted field, and every trainer's section carries its own defaults."""
    from dataengine.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="train.dpo.betta"):
        load_config(None, train__dpo__betta=0.3)
    config = load_config(None, train__dpo__beta=0.3)
    assert config.train.dpo.beta == 0.3 and config.train.grpo.learning_rate == 1e-6
    assert config.train.for_kind("dpo").replace(init="tiny", out_dir="x").beta == 0.3
    with pytest.raises(ConfigError, match="num_generations"):
        load_config(None, train__grpo__batch_size=6, train__grpo__num_generations=4)
