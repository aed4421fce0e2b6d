"""Derived datasets on a hand-built tree with known Q values: exactly the expected rows."""

from __future__ import annotations

import json

import polars as pl
import pytest

from dataengine.derive import (
    DeriveOptions,
    derive,
    grpo_replay,
    recovery_examples,
    rejection_sft,
    step_pairs,
    trajectory_pairs,
)
from dataengine.derive.export import export_frame
from dataengine.types import Message, Task, ToolSpec
from storage import Store

RUN, TREE, TASK = "r1", "tr1", "t1"
ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
MUL = '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'


def user() -> list[dict]:
    return [{"role": "user", "content": "What is 2 plus 3?"}]


def task_row(task_id: str = TASK) -> dict:
    task = Task(
        id=task_id, suite="arith", toolbox="arith",
        messages=[Message(role="user", content="What is 2 plus 3?")],
        tools=[ToolSpec(name="add", description="Add two numbers."),
               ToolSpec(name="multiply", description="Multiply two numbers.")],
    )
    return {"task_id": task_id, "suite": "arith", "split": "train", "task_json": task.model_dump_json()}


M0 = user()
M1 = M0 + [{"role": "assistant", "content": ADD}, {"role": "tool", "name": "add", "content": "5"}]
M2 = M0 + [{"role": "assistant", "content": MUL}, {"role": "tool", "name": "multiply", "content": "6"}]
M4 = M1 + [{"role": "assistant", "content": "5"}]
M5 = M1 + [{"role": "assistant", "content": "6"}]
M6 = M2 + [{"role": "assistant", "content": "6"}]


def node(i, parent, text, key, q, visits, logprob, messages, *, terminal=False, success=None, env="e0"):
    return {
        "task_id": TASK, "suite": "arith", "tree_id": TREE, "node_id": i, "parent_id": parent,
        "depth": 0 if parent is None else (1 if parent == 0 else 2),
        "action_text": text, "action_key": key, "q": q, "visits": visits, "logprob": logprob,
        "terminal": terminal, "success": success, "env_hash": env, "messages_json": json.dumps(messages),
    }


def tree_nodes(env2: str = "e0") -> list[dict]:
    """Root 0; children 1 (add, Q .9, 5 visits), 2 (multiply, Q .2), 3 (garbage, 0 visits);
    1 -> 4 (answer 5, success, Q 1), 5 (answer 6, fail, Q 0); 2 -> 6 (answer 6, fail)."""
    return [
        node(0, None, None, None, 0.5, 10, None, M0),
        node(1, 0, ADD, "calls:add", 0.9, 5, -1.0, M1),
        node(2, 0, MUL, "calls:multiply", 0.2, 3, -2.0, M2, env=env2),
        node(3, 0, "blah", "error:blah", 0.1, 0, -3.0, M0 + [{"role": "assistant", "content": "blah"}]),
        node(4, 1, "5", "final:5", 1.0, 4, -0.5, M4, terminal=True, success=True),
        node(5, 1, "6", "final:6", 0.0, 1, -0.7, M5, terminal=True, success=False),
        node(6, 2, "6", "final:6", 0.0, 2, -0.9, M6, terminal=True, success=False),
    ]


def traj(tid, node_ids, messages, success, reward, *, tree=TREE, task=TASK):
    return {
        "task_id": task, "suite": "arith", "split": "train", "tree_id": tree, "traj_id": tid,
        "node_ids": node_ids, "source": "mcts", "messages_json": json.dumps(messages),
        "reward": reward, "success": success, "num_steps": sum(m["role"] == "assistant" for m in messages),
    }


def tree_trajectories() -> list[dict]:
    return [
        traj("T1", [0, 1, 4], M4, True, 1.0),
        traj("T2", [0, 1, 5], M5, False, 0.05),
        traj("T3", [0, 2, 6], M6, False, 0.0),
    ]


def lazy(rows: list[dict], table: str) -> pl.LazyFrame:
    """Rows as a LazyFrame with the store schema of `table` (run_id r1)."""
    store = Store.__new__(Store)
    return pl.from_arrow(Store.to_arrow(store, table, rows, run_id=RUN, shard_id="s0")).lazy()


@pytest.fixture
def frames():
    return lazy(tree_nodes(), "nodes"), lazy(tree_trajectories(), "trajectories"), lazy([task_row()], "tasks")


def test_step_pairs_exact(frames):
    nodes, _, tasks = frames
    out = step_pairs(nodes, tasks, margin=0.2, min_visits=1).collect()
    got = {(r["node_id"], r["chosen_value"], r["rejected_value"]) for r in out.to_dicts()}
    assert got == {(0, 0.9, 0.2), (1, 1.0, 0.0)}
    first = out.filter(pl.col("node_id") == 0).row(0, named=True)
    assert json.loads(first["prompt_json"]) == M0
    assert json.loads(first["chosen_json"]) == [{"role": "assistant", "content": ADD}]
    assert json.loads(first["rejected_json"]) == [{"role": "assistant", "content": MUL}]
    assert first["margin"] == pytest.approx(0.7)
    assert (first["chosen_visits"], first["rejected_visits"]) == (5, 3)
    assert (first["chosen_logprob"], first["rejected_logprob"]) == (-1.0, -2.0)
    assert [t["function"]["name"] for t in json.loads(first["tools_json"])] == ["add", "multiply"]
    deeper = out.filter(pl.col("node_id") == 1).row(0, named=True)
    assert json.loads(deeper["prompt_json"]) == M1


def test_step_pairs_margin_and_visits(frames):
    nodes, _, _ = frames
    assert step_pairs(nodes, rule="margin", margin=0.8).collect()["node_id"].to_list() == [1]
    # With no visit floor the unvisited garbage action 3 becomes a rejected side (0.9 - 0.1 >= 0.2).
    loose = step_pairs(nodes, rule="margin", margin=0.2, min_visits=0).collect()
    assert sorted(loose["pair_id"].to_list()) == sorted(
        ["step/r1/tr1/0/1>2", "step/r1/tr1/0/1>3", "step/r1/tr1/1/4>5"]
    )
    with pytest.raises(ValueError, match="margin"):
        step_pairs(nodes, margin=-1)


def test_step_pairs_never_pair_duplicate_actions():
    rows = tree_nodes()
    rows[2]["action_key"] = "calls:add"  # node 2 is the same action as node 1, sampled twice
    out = step_pairs(lazy(rows, "nodes"), margin=0.2).collect()
    assert out["node_id"].to_list() == [1]


def test_critic_mix_changes_values():
    rows = tree_nodes()
    for r in rows:
        r["critic_score"] = 0.0 if r["node_id"] == 1 else 1.0
    mixed = step_pairs(lazy(rows, "nodes"), margin=0.2, critic_weight=0.5).collect()
    # Node 1: .5*.9 + .5*0 = .45; node 2: .5*.2 + .5*1 = .6 -> now 2 beats 1 by .15 < .2: no root pair.
    assert 0 not in mixed["node_id"].to_list()


def test_trajectory_pairs(frames):
    nodes, trajs, tasks = frames
    out = trajectory_pairs(trajs, tasks, nodes).collect()
    assert out["pair_id"].to_list() == ["trajectory/r1/T1>T3", "trajectory/r1/T1>T2"]
    top = out.row(0, named=True)
    assert json.loads(top["prompt_json"]) == M0
    assert json.loads(top["chosen_json"]) == M4[1:]
    assert json.loads(top["rejected_json"]) == M6[1:]
    assert top["margin"] == 1.0
    assert top["chosen_logprob"] == pytest.approx(-1.5) and top["rejected_logprob"] == pytest.approx(-2.9)
    assert trajectory_pairs(trajs, per_task=1).collect().height == 1
    assert trajectory_pairs(trajs, min_margin=0.99).collect()["pair_id"].to_list() == ["trajectory/r1/T1>T3"]


def test_recovery_splice(frames):
    nodes, trajs, tasks = frames
    out = recovery_examples(nodes, trajs, tasks).collect()
    # T2 fails first at its terminal leaf 5 (skipped); T3 fails first at node 2, recovered through T1.
    assert out["example_id"].to_list() == ["recovery/r1/tr1/2"]
    row = out.row(0, named=True)
    # The failed step (node 2's MUL call) is context at weight 0; the recovery is trained.
    failed = [{**M2[1], "weight": 0}, M2[2]]
    assert json.loads(row["messages_json"]) == M0 + failed + M4[1:]
    assert (row["num_steps"], row["score"], row["kind"]) == (3, 1.0, "recovery")


def test_recovery_skips_state_changing_mistakes():
    nodes = lazy(tree_nodes(env2="e-changed"), "nodes")
    trajs = lazy(tree_trajectories(), "trajectories")
    assert recovery_examples(nodes, trajs).collect().height == 0
    assert recovery_examples(nodes, trajs, same_state=False).collect().height == 1


def test_rejection_sft_dedup_rank_and_k():
    spaced = [dict(m, content=m["content"].replace(" ", "  ")) for m in M4]
    longer = M1 + [{"role": "assistant", "content": ADD}, {"role": "tool", "name": "add", "content": "5"},
                   {"role": "assistant", "content": "5"}]
    rows = tree_trajectories() + [
        traj("T4", None, longer, True, 0.98, tree=None),
        traj("T0", None, spaced, True, 1.0, tree=None),  # T1 up to whitespace: an exact duplicate
        traj("U1", None, M4, True, 1.0, tree=None, task="t2"),
    ]
    trajs = lazy(rows, "trajectories")
    out = rejection_sft(trajs, lazy([task_row(), task_row("t2")], "tasks"), per_task=2)
    assert out["example_id"].to_list() == ["rs/r1/T0", "rs/r1/T4", "rs/r1/U1"]
    assert out["num_steps"].to_list() == [2, 3, 2]
    assert rejection_sft(trajs, per_task=1)["example_id"].to_list() == ["rs/r1/T0", "rs/r1/U1"]
    # Near dedup drops T4 too: it repeats T0's call with one extra turn.
    near = rejection_sft(trajs, per_task=2, near_threshold=0.8)
    assert near["example_id"].to_list() == ["rs/r1/T0", "rs/r1/U1"]
    # fewest_steps: T4 (3 steps) loses to the task's 2-step successes before ranking.
    assert rejection_sft(trajs, per_task=2, fewest_steps=True)["example_id"].to_list() == ["rs/r1/T0", "rs/r1/U1"]


def test_replay_bounds(frames):
    nodes, trajs, tasks = frames
    out = grpo_replay(trajs, tasks, nodes).collect()
    assert dict(zip(out["prompt_id"], out["p_success"])) == pytest.approx(
        {"task/r1/t1": 1 / 3, "node/r1/tr1/1": 0.5}
    )
    node_row = out.filter(pl.col("prompt_id") == "node/r1/tr1/1").row(0, named=True)
    assert json.loads(node_row["prompt_json"]) == M1
    assert Task.model_validate_json(node_row["task_json"]).id == TASK
    task_row_ = out.filter(pl.col("prompt_id") == "task/r1/t1").row(0, named=True)
    assert [m["role"] for m in json.loads(task_row_["prompt_json"])] == ["user"]
    assert grpo_replay(trajs, tasks, nodes, high=0.4).collect()["prompt_id"].to_list() == ["task/r1/t1"]
    # Node 2 has one trajectory, and p = 0 is outside (0, 1) even when one sample suffices.
    one = grpo_replay(trajs, tasks, nodes, min_samples=1).collect()
    assert "node/r1/tr1/2" not in one["prompt_id"].to_list()
    with pytest.raises(ValueError, match="low < high"):
        grpo_replay(trajs, tasks, low=0.5, high=0.5)


def test_replay_all_solved_tasks_are_dropped():
    rows = [traj("A", None, M4, True, 1.0, tree=None), traj("B", None, M4, True, 1.0, tree=None)]
    assert grpo_replay(lazy(rows, "trajectories"), lazy([task_row()], "tasks")).collect().height == 0


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store")
    s.append("nodes", tree_nodes(), run_id=RUN, shard_id="s0")
    s.append("trajectories", tree_trajectories(), run_id=RUN, shard_id="s0")
    s.append("tasks", [task_row()], run_id=RUN, shard_id="s0")
    return s


def test_derive_writes_with_lineage(store):
    results = derive(store, run_ids=[RUN], options=DeriveOptions(margin=0.2))
    counts = {r.kind: r.rows for r in results}
    assert counts == {"step-pairs": 2, "trajectory-pairs": 2, "sft": 1, "recovery": 1, "replay": 2}
    pairs = store.pairs().collect()
    assert set(pairs["run_id"]) == {RUN} and set(pairs["shard_id"]) == {"derive/step-pairs", "derive/trajectory-pairs"}
    lineage = json.loads(pairs.filter(pl.col("kind") == "step")["source_versions_json"][0])
    assert lineage == {"nodes": store.version("nodes"), "tasks": store.version("tasks")}
    runs = store.runs().filter(pl.col("kind").str.starts_with("derive/")).collect()
    assert runs.height == 5
    # Deriving again replaces the shard: still one copy.
    derive(store, ["step-pairs"], run_ids=[RUN], options=DeriveOptions(pair_rule="margin", margin=0.8))
    assert store.pairs().filter(pl.col("kind") == "step").collect().height == 1
    # The TRL export reads the derived rows.
    rows, _, _, _ = export_frame(store, "pairs", include_logprobs=True)
    assert rows.columns[:3] == ["prompt", "chosen", "rejected"] and rows.height == 3
    assert rows["ref_chosen_logps"].null_count() == 0


def test_derive_bad_input(store, tmp_path):
    with pytest.raises(ValueError, match="unknown derived dataset"):
        derive(store, ["pairs"], run_ids=[RUN])
    with pytest.raises(ValueError, match="no nodes or trajectories"):
        derive(store, run_ids=["nope"])
    with pytest.raises(ValueError, match="out_run_id"):
        derive(store, run_ids=None)
    empty = Store(tmp_path / "empty")
    empty.append("trajectories", tree_trajectories(), run_id=RUN, shard_id="s0")
    with pytest.raises(ValueError, match="no nodes table"):
        derive(empty, ["step-pairs"], run_ids=[RUN])
    # A second committed shard of the same task (another shard layout, or a second writer):
    # two trees under one tree id, refused before anything is derived.
    store.append("nodes", tree_nodes(), run_id=RUN, shard_id="s1")
    store.append("trajectories", tree_trajectories(), run_id=RUN, shard_id="s1")
    store.append("tasks", [task_row()], run_id=RUN, shard_id="s1")
    with pytest.raises(ValueError, match="in shards s0, s1"):
        derive(store, ["sft"], run_ids=[RUN])
    assert not store.has_table("sft")


@pytest.mark.slow
def test_derive_reads_real_search_rows(tmp_path):
    """The columns the search writes are the ones derivation reads (tiny model, two trees)."""
    from dataengine.config import EngineConfig
    from dataengine.stages.generate import generate

    config = EngineConfig(
        store=str(tmp_path / "store"), num_tasks=2, shard_size=2, env={"max_steps": 2},
        policy={"model": "tiny", "max_new_tokens": 8, "device": "cpu"},
        search={"num_simulations": 4, "num_actions": 2, "max_depth": 2, "value": "zero", "trees_per_batch": 2},
    )
    summary = generate(config, run_id="real", progress=False)
    store = Store(tmp_path / "store")
    results = derive(store, run_ids=["real"], options=DeriveOptions(pair_rule="margin", margin=0.0, replay_min_samples=1))
    assert [r.kind for r in results] == ["step-pairs", "trajectory-pairs", "sft", "recovery", "replay"]
    # The tiny model solves nothing: no success means no SFT rows and no trajectory pairs.
    counts = {r.kind: r.rows for r in results}
    assert summary.successes == 0 and counts["sft"] == 0 and counts["trajectory-pairs"] == 0
    pairs = store.pairs().collect()
    for row in pairs.to_dicts():
        assert row["chosen_value"] - row["rejected_value"] == pytest.approx(row["margin"])
        assert json.loads(row["prompt_json"])[0]["role"] == "user"


def test_derived_calls_keep_the_argument_order_the_model_wrote():
    """Stores write messages with sorted keys; training renders `tool_calls`. A call whose text
    put "value" first must be trained with "value" first (sorted arguments taught SmolLM2 a
    second, trailing "value" key), and a stored call the text does not match is kept."""
    from dataengine.derive.common import with_parsed_calls
    from storage.formats import chat_messages, to_json_text

    text = '<tool_call>{"name": "convert", "arguments": {"value": 4, "from_unit": "foot", "to_unit": "inch"}}</tool_call>'
    stored = [{"role": "user", "content": "4 feet in inches?"},
              {"content": text, "role": "assistant",
               "tool_calls": [{"arguments": {"from_unit": "foot", "to_unit": "inch", "value": 4}, "name": "convert"}]},
              {"content": "48", "name": "convert", "role": "tool"}]
    derived = json.loads(with_parsed_calls(json.dumps(stored, sort_keys=True)))
    call = chat_messages(derived, "row")[1]["tool_calls"][0]["function"]
    assert to_json_text(call["arguments"]) == '{"value": 4, "from_unit": "foot", "to_unit": "inch"}'
    # A variant whose stored call differs from its text (not only in order) keeps the stored call.
    edited = [{**stored[1], "tool_calls": [{"name": "convert", "arguments": {"value": 4, "from_unit": "yard", "to_unit": "inch"}}]}]
    assert json.loads(with_parsed_calls(json.dumps(edited)))[0]["tool_calls"] == edited[0]["tool_calls"]
    # Already in the text's order: the same JSON text comes back.
    same = json.dumps([{**stored[1], "tool_calls": [{"name": "convert", "arguments": {"value": 4, "from_unit": "foot", "to_unit": "inch"}}]}])
    assert with_parsed_calls(same) == same
