"""The fncall suite: a catalogue of running functions, BFCL's task kinds, gold that the AST
checker and execution both accept, wrong arguments that both refuse, disjoint seeded splits."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from dataengine.env import ToolEnv
from dataengine.gold_demo import run_gold, run_turns
from dataengine.suites import generate_suite, get_suite, gold_turns, load_tasks, save_tasks
from dataengine.suites.base import split_of
from dataengine.suites.fncall import ASKS, KINDS, LEVEL, acceptable_values, execution_check
from dataengine.suites.fncall_tools import DOMAIN_OF, DOMAINS, FUNCTIONS, TOOLBOX
from dataengine.tools.registry import get_toolbox
from dataengine.tools.sandbox import Sandbox
from dataengine.types import Action, Episode, Step, ToolCall
from dataengine.verifiers import ArgumentsVerifier, CompositeReward


@pytest.fixture(scope="module")
def tasks():
    return generate_suite("fncall", n_train=600, n_heldout=150, seed=0)


def _episode(task, calls):
    return Episode(task=task, steps=[Step(action=Action(text="", tool_calls=calls))])


def _checker(task, calls) -> bool:
    return bool(ArgumentsVerifier().verify(_episode(task, calls)).passed)


def _schemas():
    return {name: tool.spec.parameters for name, tool in TOOLBOX.tools.items()}


def test_catalogue_has_typed_enum_optional_nested_and_array_arguments():
    assert len(FUNCTIONS) >= 40 and len(DOMAINS) >= 8
    assert set(ASKS) == set(TOOLBOX.tools) == set(DOMAIN_OF)
    assert get_toolbox("fncall") is TOOLBOX
    props = [(p, s) for s in _schemas().values() for p in s["properties"].values()]
    kinds = Counter()
    for prop, schema in props:
        kinds[prop["type"]] += 1
        kinds["enum"] += "enum" in prop
        kinds["array of objects"] += prop.get("items", {}).get("type") == "object"
    assert all(kinds[k] >= 2 for k in ("string", "number", "integer", "boolean", "array", "object", "enum", "array of objects") if k != "array of objects")
    assert kinds["array of objects"] >= 1
    optional = [p for s in _schemas().values() for p in s["properties"] if p not in s["required"]]
    assert len(optional) >= 30


def test_each_kind_appears_with_two_to_five_offered_functions(tasks):
    by_kind = Counter(t.metadata["kind"] for t in tasks)
    assert set(by_kind) == set(KINDS) and min(by_kind.values()) >= 50
    for task in tasks:
        kind, offered = task.metadata["kind"], [t.name for t in task.tools]
        names = [c.name for c in task.gold.calls]
        assert 2 <= len(offered) <= 5 and set(names) <= set(offered)
        assert task.metadata["level"] == task.metadata["difficulty"] == LEVEL[kind]
        assert task.metadata["n_steps"] == len(names)
        if kind == "irrelevance":
            assert names == [] and task.gold.needs_tool is False and task.gold.acceptable == []
        else:
            assert task.gold.needs_tool and len(task.gold.acceptable) == len(names)
        if kind in ("simple", "multiple"):
            assert len(names) == 1
            same_domain = [n for n in offered if DOMAIN_OF[n] == DOMAIN_OF[names[0]]]
            assert (len(same_domain) > 1) == (kind == "multiple")
        if kind == "parallel":
            assert len(names) in (2, 3) and len(set(names)) == 1
        if kind == "parallel_multiple":
            assert len(names) in (2, 3) and len(set(names)) == len(names)


def test_irrelevance_offers_no_function_of_the_requests_domain(tasks):
    """An irrelevance request is another kind's request text (or a general question), offered
    functions of other domains only: its gold is no call, and any call fails the reward."""
    irrelevant = [t for t in tasks if t.metadata["kind"] == "irrelevance"]
    reward = CompositeReward()
    for task in irrelevant[:40]:
        assert reward.score(_episode(task, [])).success
        tool = task.tools[0]
        args = {p: "x" for p in tool.parameters["required"]}
        assert not reward.score(_episode(task, [ToolCall(name=tool.name, arguments=args)])).success
        assert gold_turns(task) == [task.metadata["gold_reply"]]
    # The domain of a request that names a catalogue function is never offered.
    texts = {t.messages[0].content: t for t in tasks if t.metadata["kind"] in ("simple", "multiple")}
    for task in irrelevant:
        other = texts.get(task.messages[0].content)
        if other is not None:
            assert DOMAIN_OF[other.gold.calls[0].name] not in {DOMAIN_OF[t.name] for t in task.tools}


def test_every_gold_call_passes_the_checker_and_runs(tasks):
    reward = CompositeReward()
    for task in tasks:
        assert reward.score(_episode(task, task.gold.calls)).success, task.id
        assert execution_check(task, task.gold.calls) == (True, ""), task.id
        if not task.gold.calls:
            continue  # irrelevance: "when" decides (test_irrelevance_...)
        assert _checker(task, task.gold.calls), task.id
        assert execution_check(task, task.gold.calls) == (True, ""), task.id
        # The calls in another order pass both, as BFCL's parallel checker allows.
        assert _checker(task, task.gold.calls[::-1]) and execution_check(task, task.gold.calls[::-1])[0]


def test_unstated_optional_arguments_may_be_given_their_default(tasks):
    import inspect

    checked = 0
    for task in tasks:
        for call in task.gold.calls[:1]:
            params = inspect.signature(TOOLBOX.tools[call.name].fn).parameters
            extra = {n: p.default for n, p in params.items() if n not in call.arguments and p.default not in (inspect.Parameter.empty, None)}
            if not extra:
                continue
            full = [ToolCall(name=call.name, arguments={**call.arguments, **extra}), *task.gold.calls[1:]]
            assert _checker(task, full) and execution_check(task, full)[0], task.id
            checked += 1
    assert checked > 100


def _wrong(call: ToolCall) -> ToolCall | None:
    """The call with one stated numeric argument changed, or None if it states none."""
    for name, value in call.arguments.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return ToolCall(name=call.name, arguments={**call.arguments, name: value + 1})
    return None


def test_a_wrong_argument_fails_the_checker_and_execution(tasks):
    failed_exec = total = 0
    for task in tasks:
        if not task.gold.calls:
            continue
        wrong = _wrong(task.gold.calls[0])
        if wrong is None:
            continue
        calls = [wrong, *task.gold.calls[1:]]
        assert not _checker(task, calls), task.id
        total += 1
        failed_exec += not execution_check(task, calls)[0]
    # A changed number can give the same result (is_prime of n + 1 is False too, a water intake
    # rounded to 0.1 l, a price cap above every match): execution is the weaker judge.
    assert total > 200 and failed_exec >= 0.9 * total
    task = next(t for t in tasks if t.metadata["kind"] == "simple")
    call = task.gold.calls[0]
    assert not _checker(task, [ToolCall(name=call.name, arguments={})])
    assert not _checker(task, [call, call])  # one call too many
    assert not _checker(task, [ToolCall(name=task.tools[0].name if task.tools[0].name != call.name else task.tools[1].name,
                                        arguments=call.arguments)])  # fmt: skip
    bad = ToolCall(name=call.name, arguments={**call.arguments, "no_such_argument": 1})
    assert not _checker(task, [bad])
    ok, reason = execution_check(task, [bad])
    assert not ok and "no_such_argument" in reason


def test_acceptable_values_mark_optional_arguments():
    got = acceptable_values("get_current_weather", {"city": "Paris"})
    assert got == {"city": ["Paris"], "unit": ["", "celsius"]}
    got = acceptable_values("get_current_weather", {"city": "Paris", "unit": "celsius"})
    assert got == {"city": ["Paris"], "unit": ["celsius", ""]}
    got = acceptable_values("cart_total", {"items": [{"price": 2.5, "quantity": 2}]})
    assert got == {"items": [[{"price": [2.5], "quantity": [2]}]], "coupon_percent": ["", 0.0]}
    assert acceptable_values("create_event", {"title": "a", "date": "2026-01-01", "start_time": "09:00"})["attendees"] == [""]


def test_splits_disjoint_and_deterministic(tasks):
    train = [t for t in tasks if t.split == "train"]
    heldout = [t for t in tasks if t.split == "heldout"]
    assert len(train) == 600 and len(heldout) == 150
    assert train[0].id == "fncall-train-000000" and heldout[0].id == "fncall-heldout-000000"
    train_q = {" ".join(t.messages[0].content.split()) for t in train}
    heldout_q = {" ".join(t.messages[0].content.split()) for t in heldout}
    assert len(train_q) == 600 and len(heldout_q) == 150 and not train_q & heldout_q
    assert all(split_of("fncall", q) == "train" for q in train_q)
    assert all(split_of("fncall", q) == "heldout" for q in heldout_q)
    # The held-out set does not depend on the train size, nor on asking in two calls.
    again = generate_suite("fncall", n_train=0, n_heldout=150, seed=0)
    assert [t.model_dump() for t in again] == [t.model_dump() for t in heldout]
    other = generate_suite("fncall", n_train=50, n_heldout=0, seed=1)
    assert sum(a.messages[0].content != b.messages[0].content for a, b in zip(other, train)) > 45
    assert not {t.messages[0].content for t in other} & heldout_q


def test_same_tasks_in_a_fresh_process():
    code = ("from dataengine.suites import generate_suite; import json;"
            "print(json.dumps([t.model_dump(mode='json') for t in generate_suite('fncall', 20, 5, seed=3)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "7", "PATH": ""})  # fmt: skip
    here = [t.model_dump(mode="json") for t in generate_suite("fncall", 20, 5, seed=3)]
    assert json.loads(out.stdout) == here


def test_levels_select_kinds_and_task_files_round_trip(tmp_path):
    assert get_suite("fncall").levels == (1, 2, 3, 4, 5)
    parallel = generate_suite("fncall", n_train=10, n_heldout=0, seed=0, levels=[LEVEL["parallel"]])
    assert {t.metadata["kind"] for t in parallel} == {"parallel"}
    save_tasks(parallel, tmp_path / "fncall.jsonl")
    assert load_tasks(tmp_path / "fncall.jsonl") == parallel


def test_gold_episodes_succeed_through_the_sandbox_and_match_by_execution():
    """Gold turns played through the sandboxed ToolEnv: the composite reward counts every gold
    episode a success and every one with its last call dropped a failure, and the outputs the
    sandbox returns equal the gold results."""
    with Sandbox(workers=2, preload=["fncall"]) as sandbox:
        env = ToolEnv(sandbox, max_steps=8)
        summary = run_gold(env, "fncall", n=12, seed=1)
        assert summary.gold_success == summary.tasks == 12 and summary.tool_errors == 0
        assert summary.corrupted > 0 and summary.corrupted_success == 0
        tasks = generate_suite("fncall", n_train=0, n_heldout=12, seed=1)
        for task, state in zip(tasks, run_turns(env, tasks, [gold_turns(t) for t in tasks])):
            results = [r for step in state.steps for r in step.results]
            assert execution_check(task, [r.call for r in results], [r.output for r in results]) == (True, ""), task.id


def test_the_experiment_config_searches_fncall_and_evaluates_on_bfcl(tmp_path):
    from pathlib import Path

    from dataengine.commands.experiment import experiment_overrides
    from dataengine.evaluation.experiment import experiment_config
    from flows.pipeline import Journal

    path = Path(__file__).resolve().parents[1] / "docs" / "configs" / "experiment-fncall.yaml"
    cfg = experiment_config(out="runs/x", suites=["fncall"], overrides=experiment_overrides(path, None, None))
    assert cfg.engine.suites == ["fncall"]
    assert cfg.engine.eval.suites == ["bfcl:simple_python", "bfcl:multiple", "bfcl:parallel",
                                      "bfcl:parallel_multiple", "bfcl:irrelevance"]  # fmt: skip
    # Another set of evaluated suites is another pipeline: a journal does not resume across them.
    plain = experiment_config(out=str(tmp_path), suites=["fncall"])
    journal = Journal(tmp_path / "journal.json", plain)
    journal.run("r0/evaluate", lambda: {"done": True})
    other = plain.model_copy(update={"engine": plain.engine.model_copy(
        update={"eval": plain.engine.eval.model_copy(update={"suites": ["units"]})})})
    with pytest.raises(ValueError, match="another pipeline config"):
        Journal(tmp_path / "journal.json", other)


@pytest.mark.slow
def test_an_experiment_searches_fncall_and_evaluates_other_suites(tmp_path):
    """`engine.eval.suites`: the pipeline searches and trains on engine.suites (fncall) and evaluates
    every round on the other suites (units here), tiny model."""
    import os

    out = tmp_path / "exp"
    sizes = ["--suite", "fncall", "--rounds", "1", "--train-tasks", "2", "--heldout-tasks", "2", "--model", "tiny",
             "--trainers", "sft", "--set", "engine.eval.suites=[units]",
             "--set", "engine.search.num_simulations=2", "--set", "engine.search.num_actions=2",
             "--set", "engine.search.max_depth=2", "--set", "engine.search.value=zero",
             "--set", "engine.policy.max_new_tokens=6", "--set", "engine.policy.device=cpu",
             "--set", "engine.eval.max_new_tokens=6", "--set", "engine.env.max_steps=2",
             "--set", "engine.eval.search=false", "--set", "engine.sandbox.workers=1"]  # fmt: skip
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    run = subprocess.run([sys.executable, "-m", "dataengine.cli", "experiment", "--out", str(out), *sizes], env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [(r["round"], r["suite"]) for r in results["rows"]] == [(0, "units"), (1, "units")]
    import polars as pl

    from storage import Store

    searched = Store(out / "store").runs().filter(pl.col("run_id") == "experiment/r1", pl.col("kind") == "generate")
    assert [json.loads(c)["engine"]["suites"] for c in searched.collect()["config_json"]] == [["fncall"]]
