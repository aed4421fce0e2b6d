"""CLI of derive and eval, registered on a fresh typer app."""

from __future__ import annotations

import json

import polars as pl
import pytest
import typer
from test_derive import RUN, task_row, tree_nodes, tree_trajectories
from typer.testing import CliRunner

from dataengine.commands import derive_eval
from storage import Store


@pytest.fixture
def app():
    app = typer.Typer()
    derive_eval.register(app)
    return app


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store")
    s.append("nodes", tree_nodes(), run_id=RUN, shard_id="s0")
    s.append("trajectories", tree_trajectories(), run_id=RUN, shard_id="s0")
    s.append("tasks", [task_row()], run_id=RUN, shard_id="s0")
    return s


def test_derive_all(app, store):
    result = CliRunner().invoke(app, ["derive", "all", "--store", str(store.root), "--run", RUN, "--rule", "margin", "--margin", "0.8"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    # The audit: this task has no gold, so its one step pair has no gold action to judge.
    audit = [line for line in lines if "audit" in line]
    assert [(a["suite"], a["pairs"], a["no_gold"], a["trees"]) for a in audit] == [("arith", 1, 1, 1)]
    lines = [line for line in lines if "audit" not in line]
    assert {line["kind"]: line["rows"] for line in lines} == {
        "step-pairs": 1, "trajectory-pairs": 2, "sft": 1, "recovery": 1, "replay": 2}
    assert store.pairs().filter(pl.col("kind") == "step").collect()["margin"].to_list() == [1.0]


def test_derive_errors_are_named(app, store, tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["derive", "sft", "--store", str(tmp_path / "nowhere"), "--run", RUN])
    assert missing.exit_code == 1 and "no store" in missing.output
    bad_run = runner.invoke(app, ["derive", "sft", "--store", str(store.root), "--run", "zzz"])
    assert bad_run.exit_code == 1 and "zzz" in bad_run.output
    bad_kind = runner.invoke(app, ["derive", "pairs", "--store", str(store.root), "--run", RUN])
    assert bad_kind.exit_code == 2


def test_eval_rejects_bad_settings(app, tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["eval", "--suite", "nope", "--store", str(tmp_path / "s")])
    assert out.exit_code == 1 and "unknown suite" in out.output
    out = runner.invoke(app, ["eval", "--k", "4", "--samples", "2", "--store", str(tmp_path / "s")])
    assert out.exit_code == 1 and "samples" in out.output
    out = runner.invoke(app, ["eval", "--search", "--value", "guess", "--store", str(tmp_path / "s")])
    assert out.exit_code == 1 and "search.value" in out.output and "zero" in out.output


@pytest.mark.slow
def test_eval_tiny_writes_evals(app, tmp_path):
    out = CliRunner().invoke(app, ["eval", "--model", "tiny", "--suite", "arithmetic", "--tasks", "2", "--k", "2",
                                   "--max-new-tokens", "6", "--max-steps", "2", "--search", "--sims", "2",
                                   "--search-k", "2", "--store", str(tmp_path / "s"), "--device", "cpu"])
    assert out.exit_code == 0, out.output
    evals = Store(tmp_path / "s").evals().collect()
    assert set(evals["metric"]) >= {"greedy_success", "pass@2", "search_success", "search_found",
                                    "search_deployable_success", "axis/when"}
