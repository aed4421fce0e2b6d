"""Step pairs that rest on evidence, and the audit against the gold, on hand-built trees.

The first tree is the shape the margin rule got wrong on arithmetic: at the root the gold call
(multiply) and a wrong one (divide) each had one visit and no success below, and divide's 0.11
of shaping beat multiply's 0.0 by the demo's 0.1 margin, so divide was chosen.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from dataengine.derive import DeriveOptions, derive_frame, step_pairs
from dataengine.derive.audit import audit_lines, audit_pairs, audit_table, pair_verdict
from dataengine.derive.pairs import subtree_outcomes
from dataengine.types import Gold, Message, Task, ToolCall, ToolSpec
from storage import Store

RUN, TREE, TASK = "r1", "tr1", "t1"
NUMBERS = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}
QUESTION = "Start with 3247 and multiply by 751."


def call(name: str, a: float, b: float) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


MUL, DIV = call("multiply", 3247, 751), call("divide", 3247, 751)
M0 = [{"role": "user", "content": QUESTION}]
M_MUL = M0 + [{"role": "assistant", "content": MUL}, {"role": "tool", "name": "multiply", "content": "2438497"}]
M_DIV = M0 + [{"role": "assistant", "content": DIV}, {"role": "tool", "name": "divide", "content": "4.3236"}]


def task() -> Task:
    return Task(id=TASK, suite="arithmetic", toolbox="arithmetic", messages=[Message(role="user", content=QUESTION)],
                tools=[ToolSpec(name="multiply", parameters=NUMBERS), ToolSpec(name="divide", parameters=NUMBERS)],
                gold=Gold(calls=[ToolCall(name="multiply", arguments={"a": 3247, "b": 751})], answer="2438497"))


def node(i, parent, text, key, q, visits, messages, *, terminal=False, success=None):
    return {"task_id": TASK, "suite": "arithmetic", "tree_id": TREE, "node_id": i, "parent_id": parent,
            "action_text": text, "action_key": key, "q": q, "visits": visits, "logprob": -1.0,
            "terminal": terminal, "success": success, "messages_json": json.dumps(messages)}


def lazy(rows: list[dict], table: str) -> pl.LazyFrame:
    store = Store.__new__(Store)
    return pl.from_arrow(Store.to_arrow(store, table, rows, run_id=RUN, shard_id="s0")).lazy()


def tasks_frame() -> pl.LazyFrame:
    t = task()
    return lazy([{"task_id": t.id, "suite": t.suite, "split": "train", "task_json": t.model_dump_json()}], "tasks")


def inverted_tree() -> list[dict]:
    """Root 0 -> 1 (multiply, the gold call, Q 0.0, 1 visit), 2 (divide, Q 0.11 of shaping, 1 visit)."""
    return [
        node(0, None, None, None, 0.05, 2, M0),
        node(1, 0, MUL, "calls:multiply", 0.0, 1, M_MUL),
        node(2, 0, DIV, "calls:divide", 0.11, 1, M_DIV),
    ]


def solved_tree() -> list[dict]:
    """The tree above searched on: multiply -> 3 (answer 2438497, success); divide -> 4 (answer
    4.3236, failure). Multiply has 3 visits (Q 0.67), divide 2 (Q 0.1)."""
    rows = inverted_tree()
    rows[1].update(q=0.67, visits=3)
    rows[2].update(q=0.1, visits=2)
    return rows + [
        node(3, 1, "2438497", "final:2438497", 1.0, 1, M_MUL + [{"role": "assistant", "content": "2438497"}],
             terminal=True, success=True),
        node(4, 2, "4.3236", "final:4.3236", 0.1, 1, M_DIV + [{"role": "assistant", "content": "4.3236"}],
             terminal=True, success=False),
    ]


def test_margin_rule_made_the_inverted_pair_and_evidence_makes_none():
    nodes, tasks = lazy(inverted_tree(), "nodes"), tasks_frame()
    old = step_pairs(nodes, tasks, rule="margin", margin=0.1).collect()
    assert old["pair_id"].to_list() == ["step/r1/tr1/0/2>1"]
    assert audit_pairs(old, tasks.collect())["verdict"].to_list() == ["inverted"]
    # No success below either side and one visit each: shaping alone never makes a pair.
    assert step_pairs(nodes, tasks).collect().height == 0


def test_evidence_rule_pairs_the_verified_success():
    nodes, tasks = lazy(solved_tree(), "nodes"), tasks_frame()
    out = step_pairs(nodes, tasks).collect()
    assert out["pair_id"].to_list() == ["step/r1/tr1/0/1>2"]
    audited = audit_pairs(out, tasks.collect())
    assert audited["verdict"].to_list() == ["prefers_gold"]
    table = audit_table(audited, {"arithmetic": 2})
    assert table.select("pairs", "prefers_gold", "inverted", "gold_share", "pairs_per_tree").row(0) == (1, 1, 0, 1.0, 0.5)
    assert audit_lines(table)[0].startswith("arithmetic: 1 step pairs, 0.50 per tree (2 trees): 1 prefer the gold")
    # The two terminals are leaves of different parents: no sibling pair below the root.
    assert step_pairs(nodes, tasks, rule="margin", margin=0.1).collect()["node_id"].to_list() == [0]


def test_two_verified_sides_pair_only_beyond_shaping():
    rows = solved_tree()
    # divide's answer verified too (a task with two right calls), its Q 0.6: 0.07 below is shaping.
    rows[4].update(success=True)
    rows[2].update(q=0.6)
    assert step_pairs(lazy(rows, "nodes")).collect().height == 0
    # Q 0.3: a success worth a third (efficient_success's wasted steps) is a rejected side.
    rows[2].update(q=0.3)
    assert step_pairs(lazy(rows, "nodes")).collect()["pair_id"].to_list() == ["step/r1/tr1/0/1>2"]


def test_subtree_outcomes():
    out = subtree_outcomes(lazy(solved_tree(), "nodes")).collect().sort("node_id")
    assert out.select("node_id", "solved", "ended").rows() == [(0, 1, 2), (1, 1, 1), (2, 0, 1), (3, 1, 1), (4, 0, 1)]


@pytest.mark.parametrize(("visits", "kept"), [(1, False), (4, False), (16, True)])
def test_bound_pairs_need_visits(visits, kept):
    """Values from an estimate, no terminal yet: 0.9 against 0.2 is a pair only once the bounds
    1/sqrt(N) leave a gap (N = 16: 0.65 > 0.45)."""
    rows = inverted_tree()
    rows[1].update(q=0.9, visits=visits)
    rows[2].update(q=0.2, visits=visits)
    assert (step_pairs(lazy(rows, "nodes")).collect().height == 1) is kept


def test_bound_pairs_need_more_than_shaping():
    rows = inverted_tree()
    rows[1].update(q=0.25, visits=400)
    rows[2].update(q=0.0, visits=400)
    # Bounds 0.05 apart leave 0.25 - 0.05 > 0.0 + 0.05, but 0.25 is within what shaping can make.
    assert step_pairs(lazy(rows, "nodes")).collect().height == 0
    assert step_pairs(lazy(rows, "nodes"), bound_min_gap=0.2).collect().height == 1


def test_bad_rule_is_refused():
    with pytest.raises(ValueError, match="rule must be one of evidence, margin"):
        step_pairs(lazy(inverted_tree(), "nodes"), rule="gap")


def test_derive_options_carry_the_rule():
    sources = {"nodes": lazy(inverted_tree(), "nodes"), "tasks": tasks_frame()}
    assert derive_frame("step-pairs", sources, DeriveOptions()).height == 0
    assert derive_frame("step-pairs", sources, DeriveOptions(pair_rule="margin", margin=0.1)).height == 1


def test_verdicts():
    t = task()
    prompt = json.dumps(M0)
    one = lambda text: json.dumps([{"role": "assistant", "content": text}])  # noqa: E731
    assert pair_verdict(t, prompt, one(MUL), one(DIV)) == "prefers_gold"
    assert pair_verdict(t, prompt, one(DIV), one(MUL)) == "inverted"
    assert pair_verdict(t, prompt, one(DIV), one("4.3")) == "wrong_over_wrong"
    # Same call, arguments written as floats: both take the gold step.
    assert pair_verdict(t, prompt, one(MUL), one(call("multiply", 3247.0, 751.0))) == "both_gold"
    # After the reference call the gold step is the answer.
    assert pair_verdict(t, json.dumps(M_MUL), one("2438497"), one("2438")) == "prefers_gold"
    # Off the gold path (divide was called) there is no gold action; nor without a task.
    assert pair_verdict(t, json.dumps(M_DIV), one("4.3236"), one("5")) == "no_gold"
    assert pair_verdict(None, prompt, one(MUL), one(DIV)) == "no_gold"


def test_report_holds_the_audit(tmp_path):
    from dataengine.derive import derive
    from dataengine.report import report_tables

    store = Store(tmp_path / "store")
    rows = [{k: v for k, v in r.items()} for r in inverted_tree()]
    store.append("nodes", rows, run_id=RUN, shard_id="s0")
    t = task()
    store.append("tasks", [{"task_id": t.id, "suite": t.suite, "split": "train", "task_json": t.model_dump_json()}],
                 run_id=RUN, shard_id="s0")
    derive(store, ["step-pairs"], run_ids=[RUN], options=DeriveOptions(pair_rule="margin", margin=0.1))
    audit = report_tables(store, RUN)["pair_audit"]
    assert audit.select("run_id", "suite", "pairs", "inverted", "gold_share").rows() == [(RUN, "arithmetic", 1, 1, 0.0)]


def contrast_search(env, *, policy: str, contrast: bool, sims: int):
    """A one-call task (What is 4628 * 289?) searched with rule replies: at the root the right
    call (multiply) and a wrong one (divide); after multiply the gold answer and a wrong one
    (12), after divide two wrong answers. Returns (node rows, step pairs, simulations run)."""
    from test_search_features import RulePolicy, config, turn

    from dataengine.search import batch_rows, search_batch
    from dataengine.stages import make_reward
    from dataengine.suites import generate_suite

    task = generate_suite("arithmetic", n_train=3, n_heldout=0, seed=0)[1]
    a, b = task.gold.calls[0].arguments["a"], task.gold.calls[0].arguments["b"]

    def reply(conv, seed, i):
        if turn(conv) == 0:
            return [call("multiply", a, b), call("divide", a, b)][i % 2]
        right = "multiply" in conv.messages[-2].content
        return ([str(task.gold.answer), "12"] if right else ["4.3", "12"])[i % 2]

    cfg = config(search__objective="success", search__num_simulations=sims, search__widening=False,
                 search__solved_policy=policy, search__solved_contrast=contrast)
    batch = search_batch([task], policy=RulePolicy(reply), env=env, reward=make_reward(cfg, env), config=cfg, seed=0)
    rows = batch_rows(batch, "rules@0")[0]
    tasks = lazy([{"task_id": task.id, "suite": task.suite, "split": "train", "task_json": task.model_dump_json()}],
                 "tasks")
    pairs = step_pairs(pl.DataFrame(rows).lazy().with_columns(run_id=pl.lit(RUN)), tasks).collect()
    return rows, audit_pairs(pairs, tasks.collect()), int(batch.tree.num_simulations[0])


@pytest.mark.parametrize(("policy", "sims"), [("stop", 40), ("continue", 8)])
def test_solved_contrast_probes_the_success_paths_answers(env, policy, sims):
    """At the success path's answer node the wrong answer (12) was never expanded: the solved
    tree re-backs the success up instead. solved_contrast steps and verifies it at once (no
    tokens) as a contrast probe, a terminal node outside the tensor tree, and the evidence rule
    pairs gold over wrong there too; under "stop" the probe is the answer node's second child,
    so the tree stops with the root's pair (multiply over divide) already made."""
    rows, pairs, sims_plain = contrast_search(env, policy=policy, contrast=False, sims=sims)
    assert [r["origin"] for r in rows].count("contrast") == 0
    assert pairs["verdict"].to_list() == ["prefers_gold"]
    rows, pairs, sims_contrast = contrast_search(env, policy=policy, contrast=True, sims=sims)
    (probe,) = [r for r in rows if r["origin"] == "contrast"]
    assert (probe["action_text"], probe["visits"], probe["q"], probe["terminal"], probe["success"]) == ("12", 1, 0.0, True, False)
    answer_node = probe["parent_id"]
    assert pairs["verdict"].to_list() == ["prefers_gold", "prefers_gold"]
    assert pairs.filter(pl.col("node_id") == answer_node)["rejected_json"].str.contains('"12"').to_list() == [True]
    assert sims_contrast <= sims_plain if policy == "stop" else sims_contrast == sims_plain == sims
