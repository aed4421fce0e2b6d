"""Calibration report and perturbations on the built-in suites (no external packages)."""

from __future__ import annotations

import json

import pytest

from dataengine.types import ToolCall, ToolSpec
from dataengine.verifiers import check_calls
from dataengine.verifiers.perturb import KINDS, perturb_calls
from dataengine.verifiers.report import CALL_LABELS, calibrate, calibration_set, execute

SPEC = ToolSpec(
    name="book",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}, "late": {"type": "boolean"}},
        "required": ["city", "nights"],
    },
)
OTHER = ToolSpec(name="cancel", parameters={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]})


def test_perturbations_cover_every_kind_with_known_verdicts():
    calls = [ToolCall(name="book", arguments={"city": "Oslo", "nights": 2}), ToolCall(name="book", arguments={"city": "Rome", "nights": 1})]
    out = {p.kind: p for p in perturb_calls(calls, [SPEC, OTHER])}
    assert set(out) == set(KINDS)
    assert out["wrong_name"].calls[0].name == "cancel"  # an offered tool the gold does not use
    assert "city" not in out["drop_required"].calls[0].arguments
    assert out["wrong_type"].calls[0].arguments["city"] == 12345
    assert out["changed_value"].calls[0].arguments["city"] == "Oslo zzq"
    gold = [(c.name, {k: [v] for k, v in c.arguments.items()}) for c in calls]
    schemas = {"book": SPEC.parameters, "cancel": OTHER.parameters}
    for p in out.values():
        assert check_calls(schemas, p.calls, gold)[0].valid is p.valid, p.kind
    assert set(CALL_LABELS) == set(KINDS)


def test_execute_reports_statuses_like_the_sandbox():
    from dataengine.suites import generate_suite
    from dataengine.types import Action

    task = generate_suite("arithmetic", 1, 0, seed=3)[0]
    name = task.gold.calls[0].name
    actions = [
        Action(text="a", tool_calls=[ToolCall(name="nope", arguments={})]),
        Action(text="b", tool_calls=[ToolCall(name=name, arguments={})]),
        Action(text="c", tool_calls=[task.gold.calls[0]]),
    ]
    ep = execute(task, actions)
    assert [s.results[0].status for s in ep.steps] == ["unknown_tool", "bad_arguments", "ok"]


@pytest.fixture(scope="module")
def builtin_rows():
    examples = calibration_set(per_suite=3, external=False, seed=1)
    return examples, calibrate(examples)


def test_calibration_on_builtin_suites(builtin_rows):
    examples, rows = builtin_rows
    assert {e.source for e in examples} == {"arithmetic", "units", "shop", "chains", "notool", "fncall"}
    kinds = {e.kind for e in examples}
    assert {"gold", "wrong_answer", "no_call", "needless_call", "drop_write", "parse_error", "overlong", "loop"} <= kinds
    by_name = {r["verifier"]: r for r in rows}
    assert {"format", "which", "when", "execution", "arguments", "final_answer", "end_state", "efficiency", "length", "success"} <= set(by_name)
    for row in rows:
        # every rule verifier must reproduce the labels its perturbations were built to trigger
        assert row["agreement"] == 1.0 and row["n_missing"] == 0, row
        json.dumps(row)


def test_cli_report(tmp_path):
    from typer.testing import CliRunner

    from dataengine.cli import app

    out = tmp_path / "report.json"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["verifiers", "report", "--per-suite", "1", "--no-external", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "agreement" in result.output and "final_answer" in result.output
    data = json.loads(out.read_text())
    assert data["examples"] > 20 and {r["verifier"] for r in data["rows"]} >= {"format", "success"}


def test_judges_are_calibrated_against_success_labels(builtin_rows):
    """A model-based tier enters through `judges`; a rule stand-in exercises the path here."""
    from dataengine.verifiers import FinalAnswerVerifier

    class AnswerOnlyJudge:
        name, version = "answer_only_judge", "test"

        def verify(self, episode):
            return FinalAnswerVerifier().verify(episode)

    examples, _ = builtin_rows
    rows = {r["verifier"]: r for r in calibrate(examples, judges=[AnswerOnlyJudge()], judge_limit=30)}
    judge = rows["answer_only_judge"]
    assert 0 < judge["n"] + judge["n_missing"] <= 30
    # it ignores the "when" axis and end states, so it must disagree with some success labels
    assert judge["agreement"] < 1.0 and judge["disagreements"]
