"""Query helpers and the store CLI (query, export, store info/check/schema/reexport)."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from dataengine.cli import app
from storage import Store
from storage.queries import (
    histogram,
    node_stats,
    success_rate,
    tree_graph,
    verifier_pass_rates,
)


def verdict(name: str, passed: bool | None, score: float) -> dict:
    return {"name": name, "version": "1", "score": score, "passed": passed, "confidence": 0.9, "details_json": "{}"}


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store(tmp_path / "store")
    trajectories = []
    for i in range(6):
        ok = i % 3 != 0
        trajectories.append({
            "task_id": f"t{i % 2}", "suite": "arith" if i < 4 else "orders", "traj_id": f"x{i}", "source": "mcts",
            "success": ok if i != 5 else None, "reward": 1.0 if ok else 0.0, "model_id": "m0",
            "verdicts": [verdict("format", True, 1.0), verdict("final_answer", ok, float(ok)), verdict("end_state", None, 0.0)],
        })
    store.append("trajectories", trajectories, run_id="g1", shard_id="0")
    # Tree: 0 -> (1, 2), 1 -> 3.
    nodes = [
        {"task_id": "t0", "tree_id": "tr", "node_id": 0, "parent_id": None, "depth": 0, "visits": 8, "q": 0.5},
        {"task_id": "t0", "tree_id": "tr", "node_id": 1, "parent_id": 0, "depth": 1, "visits": 6, "q": 0.7,
         "action_index": 0, "action_text": "<tool_call>a</tool_call>", "prior": 0.6},
        {"task_id": "t0", "tree_id": "tr", "node_id": 2, "parent_id": 0, "depth": 1, "visits": 2, "q": 0.1,
         "action_index": 1, "action_text": "guess", "prior": 0.4, "terminal": True},
        {"task_id": "t0", "tree_id": "tr", "node_id": 3, "parent_id": 1, "depth": 2, "visits": 6, "q": 0.9,
         "action_index": 0, "action_text": "42", "prior": 1.0, "terminal": True, "success": True},
    ]
    store.append("nodes", nodes, run_id="g1", shard_id="0")
    return store


def test_success_rate_by_suite_and_task(store):
    by_suite = success_rate(store).collect()
    assert by_suite["suite"].to_list() == ["arith", "orders"]
    assert by_suite["episodes"].to_list() == [4, 2]
    assert by_suite["success_rate"].to_list() == [0.5, 0.5]  # i=5 has success null: counted as failure
    by_two = success_rate(store, by=["suite", "task_id"]).collect()
    assert by_two.height == 4
    with pytest.raises(ValueError, match="cannot group by colour"):
        success_rate(store, by=["colour"])


def test_verifier_pass_rates(store):
    rates = verifier_pass_rates(store).collect()
    by_name = {r["verifier"]: r for r in rates.to_dicts()}
    assert by_name["format"]["pass_rate"] == 1.0
    assert by_name["final_answer"]["passed"] == 4 and by_name["final_answer"]["applicable"] == 6
    assert by_name["end_state"]["applicable"] == 0 and by_name["end_state"]["pass_rate"] is None


def test_node_stats_and_histogram(store):
    stats = node_stats(store).collect()
    assert stats["depth"].to_list() == [0, 1, 2]
    assert stats["nodes"].to_list() == [1, 2, 1]
    assert stats.filter(pl.col("depth") == 1)["visits_mean"].item() == 4.0
    hist = histogram(store, "visits", bins=3)
    assert int(hist["count"].sum()) == 4


def test_tree_graph(store):
    graph = tree_graph(store, "g1", "tr")
    assert sorted(graph.edges) == [(0, 1), (0, 2), (1, 3)]
    assert graph.nodes[3]["success"] is True
    assert graph.edges[0, 2]["action_text"] == "guess"
    with pytest.raises(Exception, match="no nodes of tree 'nope'"):
        tree_graph(store, "g1", "nope")


def test_cli_query_formats(store, tmp_path):
    runner = CliRunner()
    sql = "SELECT suite, count(*) AS n FROM trajectories GROUP BY suite ORDER BY suite"
    result = runner.invoke(app, ["query", sql, "--store", str(store.root), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"suite": "arith", "n": 4}, {"suite": "orders", "n": 2}]
    result = runner.invoke(app, ["query", sql, "--store", str(store.root), "--format", "csv"])
    assert result.stdout.splitlines() == ["suite,n", "arith,4", "orders,2"]
    out = tmp_path / "q.parquet"
    result = runner.invoke(app, ["query", sql, "--store", str(store.root), "--format", "parquet", "--out", str(out)])
    assert result.exit_code == 0 and pl.read_parquet(out).height == 2
    result = runner.invoke(app, ["query", "SELECT * FROM nodes JOIN trajectories USING (task_id)", "--store", str(store.root)])
    assert result.exit_code == 0 and "shape" in result.stdout


def test_cli_errors_name_the_problem(store, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["query", "SELECT * FROM pairs", "--store", str(store.root)])
    assert result.exit_code == 1 and "pairs" in result.stderr and "not written" in result.stderr
    result = runner.invoke(app, ["query", "SELECT 1", "--store", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "no store at" in result.stderr
    result = runner.invoke(app, ["export", "pairs", "--store", str(store.root), "--out", str(tmp_path / "p.parquet")])
    assert result.exit_code == 1 and "'pairs' does not exist" in result.stderr


def test_cli_export_and_reexport(store, tmp_path):
    runner = CliRunner()
    store.append("pairs", [{"pair_id": "p", "task_id": "t0", "kind": "step", "prompt_json": '[{"role": "user", "content": "q"}]',
                            "chosen_json": '[{"role": "assistant", "content": "a"}]',
                            "rejected_json": '[{"role": "assistant", "content": "b"}]', "margin": 0.5}],
                 run_id="d", shard_id="0")
    out, data = tmp_path / "pairs", "data/train-00000-of-00001.jsonl"  # jsonl exports are dataset folders
    result = runner.invoke(app, ["export", "pairs", "--store", str(store.root), "--out", str(out), "--format", "jsonl",
                                 "--min-margin", "0.3", "--kind", "step"])
    assert result.exit_code == 0, result.output
    assert "wrote 1 pairs rows" in result.stdout and "removed 0 exact" in result.stdout
    assert json.loads((out / data).read_text())["chosen"] == [{"role": "assistant", "content": "a"}]
    result = runner.invoke(app, ["store", "reexport", str(out), "--out", str(tmp_path / "again"),
                                 "--store", str(store.root)])
    assert result.exit_code == 0 and (tmp_path / "again" / data).read_text() == (out / data).read_text()


def test_cli_store_info_check_schema(store):
    runner = CliRunner()
    result = runner.invoke(app, ["store", "info", "--store", str(store.root)])
    assert result.exit_code == 0 and "trajectories" in result.stdout and "not written" in result.stdout
    result = runner.invoke(app, ["store", "check", "--store", str(store.root), "--full"])
    assert result.exit_code == 0 and "nodes: ok" in result.stdout
    (data,) = list((store.root / "nodes").glob("*.parquet"))
    data.write_bytes(data.read_bytes()[:100])
    result = runner.invoke(app, ["store", "check", "--store", str(store.root)])
    assert result.exit_code == 1 and data.name in result.stderr and "trajectories: ok" in result.stdout
    result = runner.invoke(app, ["store", "schema", "nodes"])
    assert "| prefix_hash | string |" in result.stdout


def test_cli_time_travel_and_history(store):
    runner = CliRunner()
    store.append("nodes", [{"task_id": "t9", "tree_id": "other", "node_id": 0}], run_id="g2", shard_id="7")
    sql = "SELECT count(*) AS n FROM nodes"
    now = runner.invoke(app, ["query", sql, "--store", str(store.root), "--format", "csv"])
    before = runner.invoke(app, ["query", sql, "--store", str(store.root), "--format", "csv", "--at", "nodes=1"])
    assert now.stdout.split() == ["n", "5"] and before.stdout.split() == ["n", "4"]
    bad = runner.invoke(app, ["query", sql, "--store", str(store.root), "--at", "nodez=1"])
    assert bad.exit_code == 1 and "no table 'nodez'" in bad.stderr
    history = runner.invoke(app, ["store", "history", "nodes", "--store", str(store.root)])
    newest = history.stdout.splitlines()[0].split("\t")
    assert newest[0] == "2" and newest[2] == "WRITE" and newest[3:] == ["g2", "7", "1"]


def test_queries_leave_out_half_written_shards(store):
    """A shard declared with a `tasks` marker that was never written is invisible to every
    helper and to SQL (the commit-marker protocol of multi-table shards)."""
    extra = {"task_id": "t0", "suite": "arith", "traj_id": "late", "source": "mcts", "success": True, "reward": 1.0,
             "verdicts": [verdict("final_answer", True, 1.0)]}
    store.append("trajectories", [extra], run_id="g1", shard_id="1", marker="tasks")
    store.append("nodes", [{"task_id": "t0", "tree_id": "late", "node_id": 0, "depth": 0, "visits": 99}],
                 run_id="g1", shard_id="1", marker="tasks")
    assert success_rate(store).collect()["episodes"].to_list() == [4, 2]
    assert verifier_pass_rates(store).collect().filter(pl.col("verifier") == "final_answer")["verdicts"].item() == 6
    assert node_stats(store).collect()["nodes"].to_list() == [1, 2, 1]
    with pytest.raises(Exception, match="no nodes of tree 'late'"):
        tree_graph(store, "g1", "late")
    assert store.sql("SELECT count(*) AS n FROM trajectories").collect()["n"].item() == 6
    # Once the marker is written the shard is there.
    store.append("tasks", [{"task_id": "t0"}], run_id="g1", shard_id="1")
    assert success_rate(store).collect()["episodes"].to_list() == [5, 2]
    assert tree_graph(store, "g1", "late").number_of_nodes() == 1
