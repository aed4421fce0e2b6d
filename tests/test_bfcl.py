"""BFCL suite against the data shipped in bfcl-eval, and against BFCL's own checkers."""

from __future__ import annotations

import collections
import copy
import importlib.util
import json
import sys
import types

import pytest

from dataengine.external import MissingPackageError, package_dir

HAS_BFCL = importlib.util.find_spec("bfcl_eval") is not None
external = [pytest.mark.external, pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")]


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingPackageError, match=r"'bfcl-eval' is not installed; install it with: pip install --no-deps bfcl-eval"):
        package_dir("bfcl_eval", "bfcl-eval", "pip install --no-deps bfcl-eval==2026.3.23")


@pytest.fixture(scope="module")
def bfcl():
    from dataengine.external import bfcl as module

    return module


def _bfcl_ast_checker():
    """BFCL's own ast_checker. Its module imports every model handler (anthropic, openai, ...)
    only to read a name-mangling flag, so that one constants module is replaced by a plain table."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        fake = types.ModuleType(name)
        fake.MODEL_CONFIG_MAPPING = collections.defaultdict(lambda: types.SimpleNamespace(underscore_to_dot=False))
        sys.modules[name] = fake
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    languages = {"simple_java": Language.JAVA, "simple_javascript": Language.JAVASCRIPT}

    def valid(functions, output, answer, category):
        # BFCL edits the function documents of Java / JavaScript while it checks them
        language = languages.get(category, Language.PYTHON)
        return ast_checker(copy.deepcopy(functions), output, answer, language, category, "dataengine")["valid"]

    return valid


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_unknown_category_lists_choices(bfcl):
    with pytest.raises(ValueError, match="unknown BFCL category 'simpl'.*simple_python"):
        bfcl.load_tasks("simpl")


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
@pytest.mark.parametrize("category", ["simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple", "live_simple",
                                      "live_multiple", "live_parallel", "live_parallel_multiple", "irrelevance", "live_irrelevance"])
def test_gold_answers_pass(bfcl, category):
    tasks = bfcl.load_tasks(category)
    assert tasks and all(t.split == "heldout" and t.toolbox == f"bfcl:{category}" for t in tasks)
    results = {r["id"]: r for r in bfcl.verify_predictions(category, [bfcl.gold_prediction(t) for t in tasks])}
    for t in tasks:
        bad = t.metadata.get("bfcl_gold_unsatisfiable")
        # a handful of shipped answers contradict their own schema: no call can pass them
        assert results[t.metadata["bfcl_id"]]["valid"] is (bad is None), (t.id, bad, results[t.metadata["bfcl_id"]])
    # simple_java: 3 of 100 answers BFCL's own converters cannot produce (languages.unsatisfiable)
    assert sum("bfcl_gold_unsatisfiable" in t.metadata for t in tasks) <= (0.03 if category == "simple_java" else 0.01) * len(tasks)


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
@pytest.mark.parametrize("category", ["simple_java", "simple_javascript"])
def test_java_and_javascript_verdicts_agree_with_bfcl(bfcl, category):
    """Arguments as source strings: the gold rendered as strings, the same calls with typed values
    (as a Python-minded model answers), every string quoted, and the AST perturbations, each
    judged by check_prediction and by BFCL's ast_checker with the category's language."""
    from dataengine.external.bfcl.tasks import _collapse
    from dataengine.types import ToolCall
    from dataengine.verifiers.perturb import perturb_calls

    bfcl_valid = _bfcl_ast_checker()
    entries = {e["id"]: e for e in bfcl._entries(category)}
    answers = bfcl._answers(category)
    verdicts = collections.Counter()
    for task in bfcl.load_tasks(category):
        entry = entries[task.metadata["bfcl_id"]]
        assert all(p["type"] == "string" for s in task.tools for p in s.parameters["properties"].values())
        assert all("in string representation" in p["description"] for s in task.tools for p in s.parameters["properties"].values())
        schemas = {f["name"]: f["parameters"] for f in entry["function"]}
        typed = [ToolCall(name=n, arguments=_collapse(p, schemas[n])) for item in answers[entry["id"]] for n, p in item.items()]
        quoted = [ToolCall(name=c.name, arguments={k: f'"{v}"' for k, v in c.arguments.items()}) for c in task.gold.calls]
        cases = [("gold", task.gold.calls), ("typed", typed), ("quoted", quoted)]
        cases += [(p.kind, p.calls) for p in perturb_calls(task.gold.calls, task.tools)]
        for kind, calls in cases:
            ours, reason = bfcl.check_prediction(task, calls)
            theirs = bfcl_valid(entry["function"], [{c.name: dict(c.arguments)} for c in calls], answers[entry["id"]], category)
            assert ours == theirs, (task.id, kind, reason, calls)
            verdicts[kind, ours] += 1
    n = len(entries)
    assert verdicts["gold", True] >= 0.97 * n
    assert verdicts["typed", False] >= 0.25 * n  # numbers, booleans and lists given as values, not strings
    assert verdicts["wrong_type", False] == n and verdicts["changed_value", False] >= 0.85 * n


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_relevance_needs_a_call(bfcl):
    task = bfcl.load_tasks("live_relevance", limit=1)[0]
    any_call = {"id": task.metadata["bfcl_id"], "calls": [{"name": task.tools[0].name, "arguments": {}}]}
    none = {"id": task.metadata["bfcl_id"], "calls": []}
    assert [r["valid"] for r in bfcl.verify_predictions("live_relevance", [any_call, none])] == [True, False]
    irrelevant = bfcl.load_tasks("irrelevance", limit=1)[0]
    called = {"id": irrelevant.metadata["bfcl_id"], "calls": [{"name": irrelevant.tools[0].name, "arguments": {}}]}
    assert [r["valid"] for r in bfcl.verify_predictions("irrelevance", [called])] == [False]


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_perturbations_get_the_right_verdict_and_agree_with_bfcl(bfcl):
    from dataengine.verifiers import check_calls, gold_acceptable
    from dataengine.verifiers.perturb import perturb_calls

    bfcl_valid = _bfcl_ast_checker()
    kinds = collections.Counter()
    for category in bfcl.AST_CATEGORIES:
        if category in ("simple_java", "simple_javascript"):
            continue  # arguments as source strings: test_java_and_javascript_verdicts_agree_with_bfcl
        entries = {e["id"]: e for e in bfcl._entries(category)}
        answers = bfcl._answers(category)
        for task in bfcl.load_tasks(category):
            if "bfcl_gold_unsatisfiable" in task.metadata:
                continue
            entry = entries[task.metadata["bfcl_id"]]
            schemas = {s.name: s.parameters for s in task.tools}
            for p in perturb_calls(task.gold.calls, task.tools, task.gold.acceptable):
                ours, _ = check_calls(schemas, p.calls, gold_acceptable(task))
                theirs = bfcl_valid(entry["function"], [{c.name: dict(c.arguments)} for c in p.calls], answers[entry["id"]], category)
                assert ours.valid == theirs, (task.id, p.kind, ours, p.calls)
                # BFCL's greedy parallel matching can reject a reordering; we follow BFCL there
                if p.kind != "reordered":
                    assert ours.valid == p.valid, (task.id, p.kind, ours)
                kinds[p.kind] += 1
    assert set(kinds) == {"wrong_name", "extra_parameter", "drop_required", "wrong_type", "changed_value", "extra_call", "reordered"}
    assert min(kinds.values()) >= 300


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_multi_turn_state_matches_bfcl_execution(bfcl):
    """Our JSON tool state after the gold calls equals BFCL's own instances after its own executor."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
        execute_multi_turn_func_call,
    )

    entries = {e["id"]: e for e in bfcl._entries("multi_turn_base")}
    answers = bfcl._answers("multi_turn_base")
    for task in bfcl.load_tasks("multi_turn_base", limit=12):
        entry = entries[task.metadata["bfcl_id"]]
        instances = {}
        for turn in answers[entry["id"]]:
            _, instances = execute_multi_turn_func_call(
                turn, entry["initial_config"], entry["involved_classes"], "dataengine_test", entry["id"]
            )
        ours = bfcl.run_calls(task, list(task.gold.calls))
        assert ours["world"] == bfcl.world(instances), task.id
        assert len(ours["log"]) == len(task.gold.calls)
        json.dumps(ours)  # the sandbox ships it as JSON


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_multi_turn_verdicts_per_turn(bfcl):
    task = bfcl.load_tasks("multi_turn_base", ids=["multi_turn_base_0"])[0]
    gold = bfcl.gold_prediction(task)
    assert [[c["name"] for c in turn] for turn in gold["turns"]][:2] == [["cd", "mkdir", "mv"], ["cd", "grep"]]

    def edit(fn):
        turns = [list(turn) for turn in gold["turns"]]
        fn(turns)
        return {**gold, "turns": turns}

    cases = {
        "gold": gold,
        "drop_write": edit(lambda turns: turns[0].pop(1)),  # mkdir: mv then moves the file onto a name
        "drop_read": edit(lambda turns: turns[1].pop(1)),  # grep: the state is the same, its result is missing
        "wrong_value": edit(lambda turns: turns[0].__setitem__(1, {"name": "mkdir", "arguments": {"dir_name": "tmp"}})),
        "grep_a_turn_late": edit(lambda turns: turns[2].insert(0, turns[1].pop(1))),
        "flat": {"id": gold["id"], "calls": [c for turn in gold["turns"] for c in turn]},
    }
    rows = dict(zip(cases, bfcl.verify_predictions("multi_turn_base", list(cases.values()))))
    assert {k: r["valid"] for k, r in rows.items()} == {
        "gold": True, "drop_write": False, "drop_read": False, "wrong_value": False, "grep_a_turn_late": False, "flat": False,
    }
    assert rows["drop_write"]["reason"].startswith("state_mismatch: the tool state after turn 0")
    assert rows["drop_read"]["reason"].startswith("response_mismatch: 1 result(s) of turn 1's gold calls")
    assert rows["flat"]["reason"] == f"expected {task.num_turns} turns of calls, got 1"


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"])
def test_multi_turn_tasks_load_and_gold_passes(bfcl, category):
    tasks = bfcl.load_tasks(category, limit=15)
    entries = {e["id"]: e for e in bfcl._entries(category)}
    for t in tasks:
        entry = entries[t.metadata["bfcl_id"]]
        assert t.metadata["state_view_key"] == "world" and t.initial_state["log"] == []
        assert t.num_turns == len(entry["question"]) == len(t.gold.turn_calls)
        held_back = {int(k): names for k, names in t.metadata["missed_function"].items()}
        offered = {s.name for s in t.tools}
        assert not offered & {name for names in held_back.values() for name in names}
        # a held-back function is offered from the turn BFCL hands it over, which says BFCL's prompt
        for turn, user_turn in enumerate(t.user_turns, start=1):
            assert [s.name for s in user_turn.tools] == held_back.get(turn, [])
            said = [m.content for m in user_turn.messages]
            assert said == ([bfcl.ADDED_FUNCTIONS_PROMPT] if turn in held_back else [m["content"] for m in entry["question"][turn]])
    assert (category == "multi_turn_miss_func") == any(u.tools for t in tasks for u in t.user_turns)
    assert all(r["valid"] for r in bfcl.verify_predictions(category, [bfcl.gold_prediction(t) for t in tasks]))


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_toolboxes_resolve_through_the_registry(bfcl):
    from dataengine.tools.registry import get_toolbox
    from dataengine.types import Action
    from dataengine.verifiers import CompositeReward
    from dataengine.verifiers.report import execute

    ast_box = get_toolbox("bfcl:simple_python")
    assert ast_box.tools["math.factorial"].fn(number=5) == {"name": "math.factorial", "arguments": {"number": 5}, "executed": False}
    box = get_toolbox("bfcl:multi_turn_base")
    assert box.tools["cd"].stateful and box.tools["mkdir"].stateful
    task = bfcl.load_tasks("multi_turn_base", limit=1)[0]
    done = Action(text="Done.", final_answer="Done.")
    actions = [a for turn in task.gold.turn_calls for a in [*(Action(text=c.name, tool_calls=[c]) for c in turn), done]]
    result = CompositeReward().score(execute(task, actions))
    assert result.success and {v.name: v.passed for v in result.verdicts}["multi_turn"] is True
    assert "end_state" not in {v.name for v in result.verdicts}  # judged turn by turn instead


def _verify_cli(*args: str):
    from typer.testing import CliRunner

    from dataengine.cli import app

    return CliRunner().invoke(app, ["verify", "bfcl", *args])


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_cli_verify_bfcl(tmp_path, bfcl):
    tasks = bfcl.load_tasks("parallel", limit=3)
    golds = [bfcl.gold_prediction(t) for t in tasks]
    reordered = {**golds[1], "calls": golds[1]["calls"][::-1]}
    extra = {**golds[2], "calls": golds[2]["calls"] + golds[2]["calls"][:1]}
    preds = tmp_path / "p.jsonl"
    preds.write_text("\n".join(json.dumps(x) for x in [golds[0], reordered, extra]) + "\n")
    out = tmp_path / "out" / "r.jsonl"
    result = _verify_cli("--category", "parallel", "--predictions", str(preds), "--out", str(out))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    all_ids = bfcl.task_ids("parallel")
    # one row per prediction, then one per task with no prediction
    assert [r["id"] for r in rows] == [g["id"] for g in golds] + all_ids[3:]
    assert [r["valid"] for r in rows[:3]] == [True, True, False] and not any(r["valid"] for r in rows[3:])
    assert "wrong number of calls" in rows[2]["reason"] and {r["reason"] for r in rows[3:]} == {"no prediction"}
    summary = json.loads(result.stdout.strip().splitlines()[-1])["summary"]
    assert summary["tasks"] == len(all_ids) == 200 and summary["predicted"] == 3
    assert summary["valid"] == 2 and summary["missing_tasks"] == 197
    assert summary["accuracy"] == 2 / 200 and summary["accuracy_predicted"] == 2 / 3
    assert "predicted 3 of 200 tasks" in result.stderr and "197 with no prediction count as failures" in result.stderr


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_cli_verify_bfcl_counts_tasks_not_lines(tmp_path, bfcl):
    """Copies of one gold line do not score 1.0: a repeated id is an error, a lone line scores 1/tasks."""
    gold = bfcl.gold_prediction(bfcl.load_tasks("parallel", limit=1)[0])
    copies = tmp_path / "copies.jsonl"
    copies.write_text((json.dumps(gold) + "\n") * 3)
    result = _verify_cli("--category", "parallel", "--predictions", str(copies))
    assert result.exit_code != 0
    assert result.output.strip() == f"error: {copies}:2: duplicate id {gold['id']!r} (first seen at line 1): give one prediction per task"
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(gold) + "\n")
    result = _verify_cli("--category", "parallel", "--predictions", str(one))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])["summary"]
    assert (summary["valid"], summary["predicted"], summary["tasks"], summary["accuracy"]) == (1, 1, 200, 1 / 200)
    assert "per task" in summary["scoring"] and "predicted 1 of 200 tasks" in result.stderr


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"id": 5, "calls": []}', '"id" must be a string, got 5 (number)'),
        ('{"id": ["parallel_1"], "calls": []}', '"id" must be a string, got ["parallel_1"] (array)'),
        ('{"id": null, "calls": []}', '"id" must be a string, got null (null)'),
        ('{"calls": []}', 'no "id"'),
        ("not json", "not valid JSON (Expecting value)"),
        ('["parallel_1"]', 'expected a JSON object {"id": ..., "calls": [...]}, got array'),
        ('{"id": "nope", "calls": []}', "unknown id 'nope': not a task of BFCL category 'parallel'"),
    ],
)
def test_cli_verify_bfcl_bad_line_is_a_one_line_error(tmp_path, bfcl, line, problem):
    preds = tmp_path / "bad.jsonl"
    preds.write_text('{"id": "parallel_0", "calls": []}\n' + line + "\n")
    result = _verify_cli("--category", "parallel", "--predictions", str(preds))
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {preds}:2: {problem}"


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_score_and_verify_predictions_as_functions(bfcl):
    gold = bfcl.gold_prediction(bfcl.load_tasks("parallel", limit=1)[0])
    with pytest.raises(bfcl.PredictionError, match=r"^prediction 2: duplicate id 'parallel_0' \(first seen at prediction 1\)"):
        bfcl.score_predictions("parallel", [gold, gold])
    with pytest.raises(bfcl.PredictionError, match=r'^prediction 1: "id" must be a string, got \["a"\] \(array\)$'):
        bfcl.score_predictions("parallel", [{"id": ["a"], "calls": []}])
    rows, summary = bfcl.score_predictions("simple", [gold | {"id": "simple_python_3"}])
    assert summary["category"] == "simple_python" and summary["predicted"] == 1 and len(rows) == summary["tasks"]
    # per-prediction verdicts stay available for perturbation checks; a non-string id is a verdict, not a crash
    bad_args = {"id": "parallel_0", "calls": [{"name": "x", "arguments": 5}]}
    verdicts = list(bfcl.verify_predictions("parallel", [{"id": ["a"], "calls": []}, bad_args]))
    assert [v["valid"] for v in verdicts] == [False, False] and "unknown id" in verdicts[0]["reason"]
    assert verdicts[1]["reason"] == "malformed prediction: arguments of 'x' must be a JSON object; got 5"


@pytest.mark.external
@pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")
def test_multi_turn_through_toolenv_and_sandbox(bfcl):
    from dataengine.env import ToolEnv
    from dataengine.suites import gold_turns
    from dataengine.tools.sandbox import Sandbox
    from dataengine.verifiers import CompositeReward

    reward = CompositeReward()
    task = bfcl.load_tasks("multi_turn_base", ids=["multi_turn_base_0"])[0]
    with Sandbox(workers=1, timeout_s=30, cpu_s=30) as sandbox:
        env = ToolEnv(sandbox, max_steps=20)
        state = env.reset(task)
        for text in gold_turns(task):
            state = env.step(state, text).state
        gold = state.episode()
        assert gold.done and state.turn == task.num_turns - 1 and len(gold.turn_states) == task.num_turns - 1
        assert all(r.ok for s in gold.steps for r in s.results)
        assert reward.score(gold).success
        # the same episode without the mkdir: mv then moves the file onto a name, not into a folder
        state = env.reset(task)
        for text in [t for t in gold_turns(task) if '"mkdir"' not in t]:
            state = env.step(state, text).state
        result = reward.score(state.episode())
        verdict = {v.name: v for v in result.verdicts}["multi_turn"]
        assert not result.success and verdict.passed is False
        assert (verdict.details["error_type"], verdict.details["turn"]) == ("state_mismatch", 0)
