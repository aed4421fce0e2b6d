"""Decontamination: rows whose user question is a BFCL, tau2 or built-in held-out item's (exactly,
or as a near duplicate of a BFCL/tau2 one) are refused and counted at derive and at export; the
built-in suites' train questions pass; the index is the same whoever builds it."""

from __future__ import annotations

import itertools
import json

import polars as pl
import pytest
import typer
from typer.testing import CliRunner

from dataengine.derive import DeriveOptions, decontam, derive
from dataengine.derive.decontam import eval_index, normalise_question
from dataengine.derive.export import export, reexport
from dataengine.suites import SUITE_MODULES, generate_suite, get_suite
from dataengine.suites.base import split_drafts
from dataengine.types import Message, Task, ToolSpec
from storage import Store
from storage.export import read_lineage

pytest.importorskip("bfcl_eval")
pytest.importorskip("tau2")

RUN = "r1"
ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
MUL = '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture(scope="module")
def index():
    return eval_index()


@pytest.fixture(scope="module")
def questions():
    """One question per case: a BFCL simple_python question, the same with one word changed, the
    same with a number changed (another problem), a built-in held-out question, a train one."""
    from dataengine.external.bfcl.tasks import load_tasks

    bfcl = load_tasks("simple_python", limit=1)[0].messages[0].content
    assert bfcl.startswith("Find the area of a triangle with a base of 10 units")
    return {
        "bfcl": bfcl,
        "bfcl_near": bfcl.replace("Find", "Compute"),
        "bfcl_other_number": bfcl.replace("base of 10", "base of 12"),
        "heldout": generate_suite("arithmetic", 0, 1)[0].messages[0].content,
        "train": generate_suite("arithmetic", 1, 0)[0].messages[0].content,
    }


def test_normalised_questions_keep_what_makes_a_problem():
    assert normalise_question("  What IS 7 + 1 ?") == normalise_question("what is 7+1") == "what is 7 + 1"
    assert normalise_question("What is 7+1?") != normalise_question("What is 7-1?")
    assert normalise_question("Convert -32 degrees.") != normalise_question("Convert 32 degrees.")
    assert normalise_question("Hello,   “world”!") == "hello world"


def test_matches_exact_near_and_short_questions(index, questions):
    rows = [[questions[k]] for k in ("bfcl", "bfcl_near", "bfcl_other_number", "heldout", "train")]
    refused = index.refusals(rows, [[]] * len(rows))
    assert refused.sources == ["bfcl", "bfcl", None, "heldout", None]
    assert refused.counts == {"bfcl": 2, "tau2": 0, "heldout": 1}
    # Exact only: the near duplicate passes.
    assert index.refusals(rows, [[]] * len(rows), threshold=None).sources == ["bfcl", None, None, "heldout", None]
    # A later user turn counts as much as the first.
    assert index.refusals([["Hello there, friend of mine", questions["bfcl"]]], [[]]).sources == ["bfcl"]
    # "hi" is a BFCL question: alone it names no item, with that item's functions it does.
    hi = index.frame().filter(pl.col("question") == "hi").row(0, named=True)
    assert index.refusals([["Hi!"], ["Hi!"]], [[], hi["functions"]]).sources == [None, "bfcl"]
    tau2 = index.frame().filter(pl.col("source") == "tau2").row(0, named=True)
    assert index.refusals([[tau2["question"]]], [[]]).sources == ["tau2"]


def test_train_questions_of_the_built_in_suites_pass(index):
    """Train and held-out are disjoint by construction, so a refused train question is a false
    positive, except one that is word for word a BFCL or tau2 question."""
    external = set(index.frame().filter(pl.col("source") != "heldout")["question"])
    for name in SUITE_MODULES:
        drafts = list(itertools.islice(split_drafts(get_suite(name), "train", 0), 400))
        texts = [d.question for d in drafts]
        refused = index.refusals([[q] for q in texts], [[]] * len(texts))
        flagged = [(q, s) for q, s in zip(texts, refused.sources) if s is not None]
        assert all(s != "heldout" and normalise_question(q) in external for q, s in flagged), (name, flagged)
        assert len(flagged) <= 1, (name, flagged)


def test_index_is_deterministic_and_cached(index, tmp_path, monkeypatch):
    """A fresh build in another cache folder has the same items and digest; the cached file reads back equal."""
    monkeypatch.setenv("DATAENGINE_CACHE", str(tmp_path))
    fresh = eval_index()
    path = decontam.cache_path((0,), decontam.HELDOUT_TASKS)
    assert path.is_relative_to(tmp_path) and path.is_file()
    assert fresh.digest == index.digest and fresh.items == index.items
    assert decontam._read(path).digest == index.digest
    assert fresh.sources == ("bfcl", "tau2", "heldout")
    assert {"bfcl", "tau2", "heldout"} == set(fresh.frame()["source"])


# ---- derive -----------------------------------------------------------------------------------


def tree(task_id: str, question: str) -> tuple[list[dict], list[dict], dict]:
    """One searched task (tests/test_derive.py's tree): nodes, trajectories, its tasks row."""
    m0 = [{"role": "user", "content": question}]
    m1 = m0 + [{"role": "assistant", "content": ADD}, {"role": "tool", "name": "add", "content": "5"}]
    m2 = m0 + [{"role": "assistant", "content": MUL}, {"role": "tool", "name": "multiply", "content": "6"}]
    spec = [(0, None, None, None, 0.5, 10, None, m0, False, None),
            (1, 0, ADD, "calls:add", 0.9, 5, -1.0, m1, False, None),
            (2, 0, MUL, "calls:multiply", 0.2, 3, -2.0, m2, False, None),
            (4, 1, "5", "final:5", 1.0, 4, -0.5, m1 + [{"role": "assistant", "content": "5"}], True, True),
            (5, 1, "6", "final:6", 0.0, 1, -0.7, m1 + [{"role": "assistant", "content": "6"}], True, False),
            (6, 2, "6", "final:6", 0.0, 2, -0.9, m2 + [{"role": "assistant", "content": "6"}], True, False)]
    nodes = [{"task_id": task_id, "suite": "arith", "tree_id": f"tree-{task_id}", "node_id": i, "parent_id": p,
              "depth": 0 if p is None else (1 if p == 0 else 2), "action_text": text, "action_key": key, "q": q,
              "visits": visits, "logprob": lp, "terminal": terminal, "success": success, "env_hash": "e0",
              "messages_json": json.dumps(messages)}
             for i, p, text, key, q, visits, lp, messages, terminal, success in spec]
    by_id = {n["node_id"]: n for n in nodes}
    trajs = [{"task_id": task_id, "suite": "arith", "split": "train", "tree_id": f"tree-{task_id}",
              "traj_id": f"{task_id}-T{leaf}", "node_ids": path, "source": "mcts",
              "messages_json": by_id[leaf]["messages_json"], "reward": reward, "success": success,
              "num_steps": 2}
             for leaf, path, reward, success in ((4, [0, 1, 4], 1.0, True), (5, [0, 1, 5], 0.05, False),
                                                 (6, [0, 2, 6], 0.0, False))]
    task = Task(id=task_id, suite="arith", toolbox="arith", messages=[Message(role="user", content=question)],
                tools=[ToolSpec(name="add", description="Add two numbers."),
                       ToolSpec(name="multiply", description="Multiply two numbers.")])
    return nodes, trajs, {"task_id": task_id, "suite": "arith", "split": "train", "task_json": task.model_dump_json()}


@pytest.fixture
def searched(tmp_path, questions):
    store = Store(tmp_path / "store")
    nodes, trajs, tasks = [], [], []
    for case in ("bfcl", "bfcl_near", "heldout", "train"):
        n, t, row = tree(case, questions[case])
        nodes += n
        trajs += t
        tasks.append(row)
    store.append("nodes", nodes, run_id=RUN, shard_id="s0")
    store.append("trajectories", trajs, run_id=RUN, shard_id="s0")
    store.append("tasks", tasks, run_id=RUN, shard_id="s0")
    return store


def test_derive_refuses_eval_items_in_every_kind_and_counts_them(searched, index):
    results = derive(searched, run_ids=[RUN], options=DeriveOptions(), eval_index=index)
    # Per task of this tree: 2 step pairs, 2 trajectory pairs, 1 sft, 1 recovery, 2 replay prompts.
    per_task = {"step-pairs": 2, "trajectory-pairs": 2, "sft": 1, "recovery": 1, "replay": 2}
    assert {r.kind: r.rows for r in results} == per_task
    assert {r.kind: r.decontaminated for r in results} == {
        k: {"bfcl": 2 * n, "tau2": 0, "heldout": n} for k, n in per_task.items()}
    for table in ("pairs", "sft", "replay"):
        assert set(searched.scan(table).collect()["task_id"]) == {"train"}
    run = searched.runs().filter(pl.col("kind") == "derive/sft").collect()
    recorded = json.loads(run["config_json"][0])["decontaminated"]
    assert recorded == {"refused": {"bfcl": 2, "tau2": 0, "heldout": 1}, "eval_index": index.digest}
    # Off: every task's rows, nothing counted.
    off = derive(searched, ["sft"], run_ids=[RUN], options=DeriveOptions(decontaminate=False))
    assert off[0].rows == 4 and off[0].decontaminated == {}


def test_derive_cli_prints_the_counts_and_can_turn_it_off(searched, index):
    from dataengine.commands import derive_eval

    app = typer.Typer()
    derive_eval.register(app)
    runner = CliRunner()
    out = runner.invoke(app, ["derive", "sft", "--store", str(searched.root), "--run", RUN])
    assert out.exit_code == 0, out.output
    line = json.loads(out.output.splitlines()[0])
    assert line["rows"] == 1 and line["decontaminated"] == {"bfcl": 2, "tau2": 0, "heldout": 1}
    out = runner.invoke(app, ["derive", "sft", "--store", str(searched.root), "--run", RUN, "--no-decontaminate"])
    assert out.exit_code == 0, out.output
    line = json.loads(out.output.splitlines()[0])
    assert line["rows"] == 4 and line["decontaminated"] == {}


# ---- export -----------------------------------------------------------------------------------


@pytest.fixture
def derived(tmp_path, questions):
    """sft rows written straight to the store (as a derive without decontamination leaves them)."""
    store = Store(tmp_path / "store")
    rows = []
    for i, case in enumerate(("bfcl", "bfcl_near", "bfcl_other_number", "heldout", "train")):
        messages = [{"role": "user", "content": questions[case]}, {"role": "assistant", "content": "50"}]
        rows.append({"example_id": f"e{i}", "kind": "rs", "task_id": case, "suite": "arith",
                     "messages_json": json.dumps(messages), "tools_json": None, "score": 1.0})
    store.append("sft", rows, run_id="derive-1", shard_id="0")
    return store


def test_export_refuses_eval_items_with_a_count_in_its_lineage(derived, index, tmp_path):
    out = tmp_path / "sft.parquet"
    result = export(derived, "sft", out, eval_index=index)
    assert result.rows == 2 and result.decontaminated == {"bfcl": 2, "tau2": 0, "heldout": 1}
    lineage = read_lineage(out)
    assert lineage["decontaminated"] == {"bfcl": 2, "tau2": 0, "heldout": 1}
    assert lineage["dedup_settings"]["decontaminate"] and lineage["dedup_settings"]["eval_index"] == index.digest
    kept = pl.read_parquet(out)["messages"].to_list()
    assert sorted(m[0]["content"] for m in kept) == sorted(
        [json.loads(r)[0]["content"] for r in derived.scan("sft").filter(
            pl.col("task_id").is_in(["bfcl_other_number", "train"])).collect()["messages_json"]])
    rebuilt = reexport(derived, out, tmp_path / "again.parquet")
    assert rebuilt.rows == 2 and rebuilt.decontaminated == result.decontaminated
    off = export(derived, "sft", tmp_path / "all.parquet", decontaminate=False)
    assert off.rows == 5 and off.decontaminated == {}


def test_export_cli_prints_the_count(derived, tmp_path):
    from dataengine.commands import store as store_commands

    app = typer.Typer()
    store_commands.register(app)
    runner = CliRunner()
    out = runner.invoke(app, ["export", "sft", "--store", str(derived.root), "--out", str(tmp_path / "a.parquet")])
    assert out.exit_code == 0, out.output
    assert "decontamination refused 3 rows matching eval items (bfcl 2, tau2 0, heldout 1)" in out.output
    assert "wrote 2 sft rows" in out.output
    out = runner.invoke(app, ["export", "sft", "--store", str(derived.root), "--out", str(tmp_path / "b.parquet"),
                              "--no-decontaminate"])
    assert out.exit_code == 0, out.output
    assert "wrote 5 sft rows" in out.output and "decontamination" not in out.output
