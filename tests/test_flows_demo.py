"""`dataengine demo --quick`: gold table, best-of-N and the whole pipeline on the tiny model,
the report, and the demo's table."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def test_quick_demo_end_to_end(tmp_path):
    from dataengine.cli import app
    from storage import Store

    result = CliRunner().invoke(app, ["demo", "--quick", "--tasks", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # The table's first column is never wrapped; its other cells may be, so they are read from the report.
    for text in ("gold", "store:", "datasets:", "checkpoint:", "report:", "dataengine query",
                 "search, 4 train tasks", "solved per M tokens", "solved per wall-minute", "held-out greedy, 3 tasks"):
        assert text in result.output
    assert (tmp_path / "report" / "report.html").exists()
    report = (tmp_path / "report" / "report.md").read_text()
    assert "What the engine is for" in report and "| solved per M tokens |" in report
    assert "| **held-out greedy, 3 tasks [95% CI]** | **before (tiny)** | **after" in report
    store = Store(tmp_path / "store")
    runs = set(store.runs().collect()["run_id"].to_list())
    assert {"demo", "demo/best-of-n", "demo/r0/eval", "demo/r1", "demo/r1/eval"} <= runs
    assert store.committed_shards("tasks", "demo/r1")
    # Best-of-N searched the same train tasks as round 1's MCTS.
    tasks = store.sql("SELECT run_id, task_id FROM tasks").collect()
    searched = {run: set(tasks.filter(tasks["run_id"] == run)["task_id"].to_list()) for run in ("demo/r1", "demo/best-of-n")}
    assert searched["demo/r1"] == searched["demo/best-of-n"] and len(searched["demo/r1"]) == 4
    # The store answers questions about the run, as the demo's last line suggests.
    frame = store.sql("SELECT run_id, count(*) AS n FROM trajectories GROUP BY run_id ORDER BY run_id").collect()
    assert "demo/r1" in frame["run_id"].to_list()


def test_pipeline_command_takes_set_settings(tmp_path):
    """`dataengine pipeline --set a.b=value` reaches the runs it writes; a malformed or unknown
    setting is a one-line error before anything runs."""
    import json

    import polars as pl

    from dataengine.cli import app
    from storage import Store

    store_dir = tmp_path / "store"
    base = ["pipeline", "--suite", "arithmetic", "--tasks", "2", "--rounds", "1", "--model", "tiny",
            "--trainer", "dpo", "--train-steps", "1", "--eval-tasks", "2", "--store", str(store_dir),
            "--out", str(tmp_path / "out")]
    bad = CliRunner().invoke(app, [*base, "--set", "engine.search.num_simulations"])
    assert bad.exit_code == 2 and "--set takes dotted.name=value" in bad.output
    unknown = CliRunner().invoke(app, [*base, "--set", "engine.search.nonsense=1"])
    assert unknown.exit_code != 0 and "nonsense" in unknown.output and not store_dir.exists()

    small = ["--set", "engine.search.max_generated_tokens=40", "--set", "engine.search.num_simulations=2",
             "--set", "engine.policy.max_new_tokens=6", "--set", "engine.eval.max_new_tokens=6",
             "--set", "engine.search.max_depth=2", "--set", "engine.env.max_steps=2", "--set", "engine.policy.device=cpu"]
    result = CliRunner().invoke(app, [*base, *small])
    assert result.exit_code == 0, result.output
    config = json.loads(Store(store_dir).runs().filter(pl.col("kind") == "generate").collect()["config_json"][0])["engine"]
    assert config["search"]["max_generated_tokens"] == 40 and config["policy"]["max_new_tokens"] == 6
