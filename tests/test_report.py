"""The run report: its numbers and files on a hand-built store; tree pictures' data (action
labels, parse-error marks, the solved / unsolved trees chosen); and a report over runs made by
separate commands (generate, train dpo, eval with the tiny model), with training curves from
the real training run's log history and the training progress lines it printed."""

from __future__ import annotations

import io
import json
import math
import os
import sys

import polars as pl
import pytest
from typer.testing import CliRunner

from dataengine.report import build_report, report_tables, round_of, training_curves
from dataengine.report.runs import select_runs
from dataengine.report.trees import action_label, labelled_tree, pick_trees, tree_layout
from storage import Store
from storage.queries import tree_graph

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VERDICT_OK = {"name": "final_answer", "version": "1", "score": 1.0, "passed": True, "confidence": 1.0, "details_json": "{}"}
VERDICT_BAD = {**VERDICT_OK, "score": 0.0, "passed": False}
FORMAT_NA = {"name": "format", "version": "1", "score": 1.0, "passed": None, "confidence": 1.0, "details_json": "{}"}
ADD = json.dumps({"text": "<tool_call>...", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}],
                  "final_answer": None, "parse_error": None})
ANSWER = json.dumps({"text": "7", "tool_calls": [], "final_answer": "7", "parse_error": None})
BROKEN = 'calc $x$ <tool_call>{"name": add'


def node(i, parent, q, visits, *, tree="tree-0", terminal=False, success=None, action=None, text=None, error=None):
    return {"task_id": "t1", "suite": "arithmetic", "tree_id": tree, "node_id": i, "parent_id": parent,
            "depth": 0 if parent is None else 1, "action_index": None if parent is None else i - 1,
            "action_json": action, "action_text": text, "parse_error": error, "q": q, "visits": visits,
            "value_estimate": q, "terminal": terminal, "success": success, "messages_json": "[]"}


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
    # Round 2, tree-0: a success, a failure and a parse error (mixed); tree-1: unsolved.
    s.append("nodes", [node(0, None, 0.5, 4),
                       node(1, 0, 1.0, 3, terminal=True, success=True, action=ADD, text="<tool_call>..."),
                       node(2, 0, 0.0, 1, terminal=True, success=False, action=ANSWER, text="7"),
                       node(3, 0, 0.0, 1, text=BROKEN, error="no tool call or answer")],
             run_id="demo/r2", shard_id="s0")
    s.append("nodes", [node(0, None, 0.1, 2, tree="tree-1"),
                       node(1, 0, 0.0, 1, tree="tree-1", terminal=True, success=False, action=ANSWER, text="7")],
             run_id="demo/r2", shard_id="s1")
    s.append("nodes", [node(0, None, 0.2, 2), node(1, 0, 0.0, 1, terminal=True, success=False, action=ANSWER, text="7")],
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
    # ... nor a mean score: a verdict that does not apply scores 0 by convention.
    assert verifiers["format"]["mean_score"] is None
    assert verifiers["final_answer"]["mean_score"] == pytest.approx(4 / 8) and verifiers["final_answer"]["version"]
    assert t["pair_counts"].rows() == [("demo/r1", "step", 2, pytest.approx(0.5))]
    assert t["datasets"].rows() == [("pairs", "demo/r1", "step", 2)]
    # Why episodes fail: these hand-built episodes hold no messages, so every failure is "no call".
    assert t["failures"].select("run_id", "kind", "episodes").rows() == [
        ("demo/r1", "no call", 3), ("demo/r1", "success", 1), ("demo/r2", "success", 3), ("demo/r2", "no call", 1)]


def test_report_files(store, tmp_path):
    report = build_report(store, "demo", tmp_path / "out")
    page = report.html.read_text()
    assert "Run report: demo" in page and "greedy_success" in page
    assert set(report.figures) == {"success", "distributions", "margins", "trees"}
    for fig in report.figures.values():
        assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'src="{fig.name}"' in page
    # The latest round's mixed tree and its unsolved tree are the ones drawn.
    assert report.trees == {"solved": ("demo/r2", "tree-0"), "unsolved": ("demo/r2", "tree-1")}
    assert "other" not in report.tables["runs"]["run_id"].to_list()
    assert "| demo/r2 | 2 | arithmetic | mcts | 4 | 3 |" in report.markdown.read_text()
    assert "Why episodes fail" in page


def test_action_labels():
    assert action_label(ADD, "<tool_call>...", None) == "add(a=2, b=3)"
    assert action_label(ANSWER, "7", None) == "answer: 7"
    assert action_label(None, BROKEN, "bad json") == "parse error: calc $x$ <tool_cal…"
    two = json.dumps({"tool_calls": [{"name": "lookup", "arguments": {"query": "a very long search string"}},
                                     {"name": "add", "arguments": {"a": [1, 2, 3, 4, 5, 6, 7]}}]})
    label = action_label(two, "", None, width=60)
    assert label == 'lookup(query="a very long…"); add(a=[1,2,3,4,5,…)'
    assert len(action_label(two, "", None)) == 32
    # Unreadable action JSON falls back to the raw text, whitespace collapsed.
    assert action_label("{not json", "some\n  text", None) == "some text"


def test_labelled_tree_marks_actions_and_parse_errors(store):
    graph = labelled_tree(tree_graph(store, "demo/r2", "tree-0"))
    labels = {n: graph.nodes[n]["label"] for n in graph.nodes}
    assert labels == {0: "task t1", 1: "add(a=2, b=3)", 2: "answer: 7", 3: "parse error: calc $x$ <tool_cal…"}
    assert [n for n in graph.nodes if graph.nodes[n]["parse_error"]] == [3]
    assert {n: graph.nodes[n]["outcome"] for n in graph.nodes} == {0: None, 1: "success", 2: "failure", 3: None}
    assert graph.edges[0, 1]["label"] == "add(a=2, b=3)" and graph.edges[0, 3]["label"].startswith("parse error")
    assert graph.graph["nodes_drawn"] == graph.graph["nodes_total"] == 4
    # Depth runs left to right; children are stacked in action order.
    pos = tree_layout(graph)
    assert [pos[n][0] for n in (0, 1, 2, 3)] == [0.0, 1.0, 1.0, 1.0]
    assert pos[1][1] > pos[2][1] > pos[3][1]


def wide_deep_tree():
    """A stored-tree graph of depth 3, 3 x 2 x 3 children, long call labels and a long task id."""
    import networkx as nx

    g = nx.DiGraph(run_id="r", tree_id="t")
    g.add_node(0, parent_id=None, task_id="arithmetic-train-000123-level2-long-name", visits=40, q=0.5, depth=0)
    frontier, n = [0], 1
    for depth, k in ((1, 3), (2, 2), (3, 3)):
        nxt = []
        for parent in frontier:
            for j in range(k):
                call = {"name": "multiply", "arguments": {"a": 123456 * j, "b": 7.25, "note": "x" * j * 9}}
                g.add_node(n, parent_id=parent, visits=10 - j, q=j / k, depth=depth, action_index=j,
                           action_json=json.dumps({"tool_calls": [call]}), action_text="", terminal=depth == 3,
                           parse_error="bad" if j == 2 else None, success=depth == 3 and j == 0)
                g.add_edge(parent, n)
                nxt.append(n)
                n += 1
        frontier = nxt
    return g


def test_tree_picture_labels_never_overlap(store, tmp_path):
    """Every drawn label box, marker and edge measured in the rendered figure: no label
    overlaps another label or a marker, and no edge crosses a label."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection, PathCollection
    from matplotlib.path import Path as MPath

    from dataengine.report.trees import draw_trees, tree_figure

    panels = [(labelled_tree(wide_deep_tree()), "wide"), (labelled_tree(tree_graph(store, "demo/r2", "tree-0")), "mixed"),
              (labelled_tree(tree_graph(store, "demo/r2", "tree-1")), "unsolved")]
    fig = tree_figure(panels)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    checked = 0
    for ax in fig.axes[: len(panels)]:
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert len(boxes) == len(panels[fig.axes.index(ax)][0].nodes)
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), (a, b)
                checked += 1
        markers = [c for c in ax.collections if isinstance(c, PathCollection)]
        radius = (110 ** 0.5) / 2 / 72 * fig.dpi
        for c in markers:
            for x, y in ax.transData.transform(c.get_offsets()):
                for b in boxes:
                    assert not (b.x0 < x + radius and x - radius < b.x1 and b.y0 < y + radius and y - radius < b.y1)
        edges = [c for c in ax.collections if isinstance(c, LineCollection) and not isinstance(c, PathCollection)]
        for segment in edges[0].get_segments():
            line = MPath(ax.transData.transform(segment))
            assert not any(line.intersects_bbox(b, filled=True) for b in boxes), segment
    assert checked > 100
    plt.close(fig)
    png = draw_trees(panels, tmp_path / "trees.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_large_tree_keeps_the_success_path(tmp_path):
    s = Store(tmp_path / "store")
    rows = [node(0, None, 0.5, 100)] + [node(i, 0, 0.1, 10, action=ANSWER, text="7") for i in range(1, 80)]
    rows += [node(80, 0, 1.0, 1, terminal=True, success=True, action=ADD, text="x")]
    s.append("nodes", rows, run_id="big", shard_id="s0")
    graph = labelled_tree(tree_graph(s, "big", "tree-0"), max_nodes=20)
    assert graph.number_of_nodes() == graph.graph["nodes_drawn"] == 20 and graph.graph["nodes_total"] == 81
    assert 80 in graph and graph.nodes[80]["outcome"] == "success"
    assert all(graph.in_degree(n) == 1 for n in graph.nodes if n != 0)


def test_tree_choice():
    def tree(tree_id, *, successes, failures, others, run="g", rnd=None):
        n = 1 + successes + failures + others
        return [{"run_id": run, "round": rnd, "tree_id": tree_id, "node_id": i,
                 "success": True if 0 < i <= successes else (False if 0 < i <= successes + failures else None),
                 "terminal": 0 < i <= successes + failures} for i in range(n)]

    rows = (tree("only-success", successes=3, failures=0, others=20) + tree("mixed", successes=1, failures=1, others=0)
            + tree("failed", successes=0, failures=2, others=3) + tree("open", successes=0, failures=0, others=9))
    # A solved tree that also failed somewhere beats a bigger all-success tree; an unsolved
    # tree with a failed leaf beats a bigger one that never ended.
    assert pick_trees(pl.LazyFrame(rows)) == {"solved": ("g", "mixed"), "unsolved": ("g", "failed")}
    rows = tree("only-success", successes=3, failures=0, others=2) + tree("open", successes=0, failures=0, others=1)
    assert pick_trees(pl.LazyFrame(rows)) == {"solved": ("g", "only-success"), "unsolved": ("g", "open")}
    assert pick_trees(pl.LazyFrame(tree("open", successes=0, failures=0, others=1))) == {
        "solved": None, "unsolved": ("g", "open")}


def test_unknown_run_is_named(store, tmp_path):
    with pytest.raises(ValueError, match="no rows of run 'nope'.*demo"):
        build_report(store, "nope", tmp_path / "x")
    with pytest.raises(ValueError, match="no rows of run 'nope'"):
        build_report(store, ["demo", "nope"], tmp_path / "x")


def test_report_command(store, tmp_path):
    from dataengine.cli import app

    result = CliRunner().invoke(app, ["report", "--run", "demo", "--store", str(store.root), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "report.html").exists()
    bad = CliRunner().invoke(app, ["report", "--run", "demo", "--store", str(tmp_path / "missing"), "--out", str(tmp_path / "r")])
    assert bad.exit_code != 0 and "no store" in bad.output


# ---- training history and progress ---------------------------------------------------------


def test_log_history_is_small():
    from dataengine.train.base import log_history

    entries = [{"loss": 1.0 / (i + 1), "grad_norm": float("nan") if i == 3 else 2.0, "learning_rate": 1e-5,
                "epoch": 0.1, "step": i + 1, "rewards/chosen": 0.3} for i in range(1000)]
    entries.append({"train_loss": 0.5, "train_runtime": 3.0, "step": 1000})  # the summary entry
    history = log_history(entries, max_points=100)
    assert set(history) == {"step", "loss", "grad_norm", "learning_rate"}
    assert len(history["step"]) == 100 and history["step"][0] == 1 and history["step"][-1] == 1000
    assert history["loss"][1] == float(f"{1 / history['step'][1]:.6g}")
    # A non-finite value is recorded as None (the metrics are strict JSON).
    grpo = log_history([{"loss": 0.1, "reward": 0.5, "step": 1}, {"reward": 0.75, "grad_norm": float("nan"), "step": 2}])
    assert grpo == {"step": [1, 2], "loss": [0.1, None], "reward": [0.5, 0.75], "grad_norm": [None, None]}


def test_training_curves_read_the_recorded_history():
    from dataengine.train.base import log_history

    grpo = log_history([{"loss": 0.02, "reward": 0.25, "grad_norm": 1.5, "learning_rate": 1e-6, "step": 1},
                        {"loss": 0.01, "reward": 0.75, "grad_norm": 1.0, "learning_rate": 5e-7, "step": 2}])
    models = pl.DataFrame([
        {"model_id": "grpo-x@1", "kind": "grpo", "metrics_json": json.dumps({"log_history": grpo})},
        # A checkpoint recorded before log histories has only its last log: no curve.
        {"model_id": "dpo-x@2", "kind": "dpo", "metrics_json": json.dumps({"last_log": {"loss": 0.6}})},
    ])
    curves = training_curves(models)
    assert curves.select("model_id", "step", "loss", "reward").rows() == [("grpo-x@1", 1, 0.02, 0.25),
                                                                          ("grpo-x@1", 2, 0.01, 0.75)]


def test_progress_bar_on_a_terminal_lines_elsewhere(monkeypatch):
    from transformers import TrainerState

    from dataengine.config import DPOTrainConfig
    from dataengine.train.base import trl_kwargs
    from dataengine.train.progress import step_log_class

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    config = DPOTrainConfig(init="tiny", out_dir="unused")
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert trl_kwargs(config)["disable_tqdm"] is False
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert trl_kwargs(config)["disable_tqdm"] is True

    now = [0.0]
    out = io.StringIO()
    log = step_log_class()("sft", 30.0, stream=out, clock=lambda: now[0])
    state = TrainerState(max_steps=10, global_step=0)
    log.on_train_begin(None, state, None)
    for step, at in ((1, 10.0), (2, 20.0), (3, 31.0), (4, 40.0)):
        now[0], state.global_step = at, step
        log.on_step_end(None, state, None)
        log.on_log(None, state, None, logs={"loss": 1.0 / step, "step": step})
    assert out.getvalue() == "sft: step 3/10 (30%) loss 0.3333 | 0:00:31 elapsed, ETA 0:01:12, 10.33 s/step\n"


# ---- runs made by separate commands ---------------------------------------------------------


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """On one store, each a separate `dataengine` command: generate (run gen-a, real tiny-model
    trees); pairs written as run pairs-b (what `derive` writes); train dpo on the store (run
    train-1, 3 steps); eval of that checkpoint (eval-1) and of the tiny model it started from
    (eval-0); then pairs of run pairs-c, exported with a run filter, and train dpo on that file
    (train-2, 1 step)."""
    from dataengine.cli import app

    root = tmp_path_factory.mktemp("commands")
    store = root / "store"
    cfg = root / "run.yaml"
    cfg.write_text("search:\n  value: zero\npolicy:\n  max_new_tokens: 8\n  device: cpu\n")
    runner = CliRunner()
    done = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DATAENGINE_TRAIN_LOG_EVERY", "0")
        for name, args in (
            ("generate", ["generate", "--config", str(cfg), "--suite", "arithmetic", "--tasks", "2", "--model", "tiny",
                          "--sims", "3", "--k", "3", "--out", str(store), "--no-progress", "--run-id", "gen-a"]),
            ("pairs-b", None),
            ("train", ["train", "dpo", "--store", str(store), "--init", "tiny", "--out", str(root / "ckpt"), "--steps", "3",
                       "--batch-size", "1", "--max-length", "128", "--device", "cpu", "--run-id", "train-1"]),
            ("eval-1", ["eval", "--model", str(root / "ckpt"), "--suite", "arithmetic", "--tasks", "2", "--k", "0",
                        "--max-new-tokens", "4", "--max-steps", "1", "--no-search", "--store", str(store),
                        "--device", "cpu", "--run-id", "eval-1"]),
            ("eval-0", ["eval", "--model", "tiny", "--suite", "arithmetic", "--tasks", "2", "--k", "0",
                        "--max-new-tokens", "4", "--max-steps", "1", "--no-search", "--store", str(store),
                        "--device", "cpu", "--run-id", "eval-0"]),
            ("pairs-c", None),
            ("export", ["export", "pairs", "--store", str(store), "--out", str(root / "c.parquet"), "--run-id", "pairs-c"]),
            ("train-2", ["train", "dpo", "--data", str(root / "c.parquet"), "--store", str(store), "--init", "tiny",
                         "--out", str(root / "ckpt2"), "--steps", "1", "--batch-size", "1", "--max-length", "128",
                         "--device", "cpu", "--run-id", "train-2"]),
        ):
            if args is None:
                prompt = [{"role": "user", "content": f"What is 40 plus {name}?"}]
                rows = [{"pair_id": f"p{i}", "kind": "step", "task_id": f"q{i}", "prompt_json": json.dumps(prompt),
                         "chosen_json": json.dumps([{"role": "assistant", "content": f"answer {42 + i}"}]),
                         "rejected_json": json.dumps([{"role": "assistant", "content": "6"}]), "tools_json": "[]",
                         "margin": 0.5} for i in range(3)]
                Store(store).append("pairs", rows, run_id=name, shard_id="derive/step-pairs")
                continue
            result = runner.invoke(app, args)
            assert result.exit_code == 0, (name, result.output)
            done[name] = result
    return Store(store), root, done


@pytest.mark.slow
def test_report_over_runs_of_separate_commands(commands, tmp_path):
    from dataengine.train.checkpoint import read_checkpoint_info

    store, root, done = commands
    info = read_checkpoint_info(root / "ckpt")
    report = build_report(store, ["gen-a", "pairs-b"], tmp_path / "out")
    t = report.tables
    # The model trained on pairs-b's rows is joined through the pairs version it read; its
    # eval (eval-1) and the eval of the model it started from (eval-0) come with it.
    assert t["models"].select("model_id", "via", "run_id", "steps").rows() == [
        (info.model_id, "trained on the runs' data", "train-1", 3)]
    assert set(t["evals"]["model_id"]) == {info.model_id, info.parent_id}
    assert set(t["evals"]["run_id"]) == {"eval-0", "eval-1"}
    assert {"gen-a", "train-1", "eval-0", "eval-1"} <= set(t["runs"]["run_id"])
    assert set(t["search_success"]["run_id"]) == {"gen-a"}
    # Training curves come from the real run's log history, step by step.
    curves = t["training"]
    history = info.metrics["log_history"]
    assert curves["step"].to_list() == history["step"] == [1, 2, 3]
    assert curves["loss"].to_list() == history["loss"] and all(math.isfinite(v) for v in history["loss"])
    mine = store.models().filter(pl.col("model_id") == info.model_id).collect()
    assert training_curves(mine)["loss"].to_list() == history["loss"]
    assert {"curves", "evals", "trees"} <= set(report.figures)
    # The trees drawn are gen-a's, and their parse-error marks are the stored parse errors.
    drawn = [tree for tree in report.trees.values() if tree is not None]
    assert drawn and all(run == "gen-a" for run, _ in drawn)
    for run, tree_id in drawn:
        stored = tree_graph(store, run, tree_id)
        graph = labelled_tree(stored)
        for n in graph.nodes:
            assert graph.nodes[n]["parse_error"] == (stored.nodes[n]["parse_error"] is not None)
            if graph.nodes[n]["parse_error"]:
                # An empty reply's label is "parse error:" (the label is stripped).
                assert graph.nodes[n]["label"].startswith("parse error:")
    # The training printed timed progress lines (every step here), not transformers' log dicts.
    printed = done["train"].output
    assert "dpo: step 3/3 (100%) loss" in printed and "ETA" in printed and "{'loss'" not in printed


@pytest.mark.slow
def test_report_joins_only_what_the_runs_reach(commands, tmp_path):
    from dataengine.cli import app
    from dataengine.train.checkpoint import read_checkpoint_info

    store, root, _ = commands
    run_of = dict(store.models().select("model_id", "run_id").collect().iter_rows())

    alone = report_tables(store, "gen-a")
    assert alone["models"].is_empty() and alone["evals"].is_empty() and alone["training"].is_empty()
    # train-2 read a file exported with --run-id pairs-c: its lineage joins it to pairs-c only,
    # though the pairs table it came from also held pairs-b's rows. train-1 read the table
    # before pairs-c existed.
    trained = {m: run_of[m] for m in select_runs(store, ["pairs-c"]).models}
    assert trained == {read_checkpoint_info(root / "ckpt2").model_id: "train-2"}
    assert set(select_runs(store, ["pairs-b"]).models) == {read_checkpoint_info(root / "ckpt").model_id}
    # An eval run brings the model it evaluated (and that model's curves).
    selection = select_runs(store, ["eval-1"])
    assert list(selection.models.values()) == ["evaluated in the runs"]
    result = CliRunner().invoke(app, ["report", "--run", "gen-a", "--run", "pairs-b", "--store", str(store.root),
                                      "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r" / "report.html").read_text()
    assert "Run report: gen-a, pairs-b" in page and 'src="training_curves.png"' in page
    assert 'src="search_trees.png"' in page
