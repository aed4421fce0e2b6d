"""The run report on a hand-built store: the numbers it shows and the files it writes."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dataengine.report import build_report, largest_tree, report_tables, round_of
from storage import Store

VERDICT_OK = {"name": "final_answer", "version": "1", "score": 1.0, "passed": True, "confidence": 1.0, "details_json": "{}"}
VERDICT_BAD = {**VERDICT_OK, "score": 0.0, "passed": False}
FORMAT_NA = {"name": "format", "version": "1", "score": 1.0, "passed": None, "confidence": 1.0, "details_json": "{}"}


def node(i, parent, q, visits, *, terminal=False, success=None):
    return {"task_id": "t1", "suite": "arithmetic", "tree_id": "tree-0", "node_id": i, "parent_id": parent,
            "depth": 0 if parent is None else 1, "q": q, "visits": visits, "value_estimate": q,
            "terminal": terminal, "success": success, "messages_json": "[]"}


def traj(tid, success, reward, task="t1"):
    return {"task_id": task, "suite": "arithmetic", "traj_id": tid, "source": "mcts", "messages_json": "[]",
            "reward": reward, "success": success, "verdicts": [VERDICT_OK if success else VERDICT_BAD, FORMAT_NA]}


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store")
    # Round 1: 1 of 4 episodes succeeds; round 2: 3 of 4.
    s.append("trajectories", [traj("a", True, 1.0), traj("b", False, 0.0), traj("c", False, 0.1), traj("d", False, 0.0)],
             run_id="demo/r1", shard_id="s0")
    s.append("trajectories", [traj("a", True, 1.0), traj("b", True, 0.9), traj("c", True, 1.0), traj("d", False, 0.0)],
             run_id="demo/r2", shard_id="s0")
    s.append("nodes", [node(0, None, 0.5, 4), node(1, 0, 1.0, 3, terminal=True, success=True),
                       node(2, 0, 0.0, 1, terminal=True, success=False)], run_id="demo/r2", shard_id="s0")
    s.append("nodes", [node(0, None, 0.2, 2), node(1, 0, 0.0, 1, terminal=True, success=False)],
             run_id="demo/r1", shard_id="s0")
    for rnd, value in ((0, 0.25), (1, 0.5)):
        s.append("evals", [{"model_id": f"m{rnd}", "suite": "arithmetic", "split": "heldout", "metric": "greedy_success",
                            "value": value, "ci_low": value - 0.2, "ci_high": value + 0.2, "n": 8}],
                 run_id=f"demo/r{rnd}/eval", shard_id="arithmetic")
    s.append("pairs", [{"pair_id": "p1", "kind": "step", "task_id": "t1", "margin": 0.6},
                       {"pair_id": "p2", "kind": "step", "task_id": "t1", "margin": 0.4}],
             run_id="demo/r1", shard_id="derive/step-pairs")
    # Another run in the same store must not leak into the report.
    s.append("trajectories", [traj("z", True, 1.0)], run_id="other", shard_id="s0")
    s.record_run("demo", kind="pipeline", config={"rounds": 2}, code_version="test")
    return s


def test_round_of():
    assert round_of("demo/r2") == 2 and round_of("demo/r12/eval") == 12
    assert round_of("demo") is None and round_of("demo/rx") is None


def test_tables_hold_the_runs_numbers(store):
    t = report_tables(store, "demo")
    success = t["search_success"].select("round", "episodes", "successes").rows()
    assert success == [(1, 4, 1), (2, 4, 3)]
    assert t["evals"].select("round", "value").rows() == [(0, 0.25), (1, 0.5)]
    verifiers = {r["verifier"]: r for r in t["verifiers"].to_dicts()}
    assert verifiers["final_answer"]["pass_rate"] == pytest.approx(4 / 8)
    # A verifier that never applies has no pass rate, not 0.
    assert verifiers["format"]["applicable"] == 0 and verifiers["format"]["pass_rate"] is None
    assert t["pair_counts"].rows() == [("step", 2, pytest.approx(0.5))]


def test_report_files(store, tmp_path):
    report = build_report(store, "demo", tmp_path / "out")
    page = report.html.read_text()
    assert "Run report: demo" in page and "greedy_success" in page
    assert set(report.figures) == {"success", "distributions", "margins", "tree"}
    for fig in report.figures.values():
        assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="{fig.name}"' in page
    # The rendered tree is the latest round's (round 2: 3 nodes).
    assert largest_tree(store, "demo") == ("demo/r2", "tree-0")
    assert "other" not in report.tables["runs"]["run_id"].to_list()
    assert "| 2 | arithmetic | mcts | 4 | 3 |" in report.markdown.read_text()


def test_unknown_run_is_named(store, tmp_path):
    with pytest.raises(ValueError, match="no rows of run 'nope'.*demo"):
        build_report(store, "nope", tmp_path / "x")


def test_report_command(store, tmp_path):
    from dataengine.cli import app

    result = CliRunner().invoke(app, ["report", "--run", "demo", "--store", str(store.root), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "report.html").exists()
    bad = CliRunner().invoke(app, ["report", "--run", "demo", "--store", str(tmp_path / "missing"), "--out", str(tmp_path / "r")])
    assert bad.exit_code != 0 and "no store" in bad.output
