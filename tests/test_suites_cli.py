"""`dataengine suites list` and `dataengine suites generate`."""

from __future__ import annotations

from typer.testing import CliRunner

from dataengine.cli import app
from dataengine.suites import generate_suite, load_tasks

runner = CliRunner(env={"COLUMNS": "250"})


def test_list_shows_every_suite_and_its_tools():
    result = runner.invoke(app, ["suites", "list"])
    assert result.exit_code == 0, result.output
    for text in ["arithmetic", "units", "shop", "chains", "notool", "convert", "cancel_order", "city_country"]:
        assert text in result.output


def test_generate_writes_the_same_tasks_as_the_api(tmp_path):
    out = tmp_path / "units.parquet"
    result = runner.invoke(app, ["suites", "generate", "--suite", "units", "--train", "7", "--heldout", "3",
                                 "--seed", "5", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "wrote 10 tasks" in result.output
    assert load_tasks(out) == generate_suite("units", 7, 3, seed=5)


def test_generate_errors_name_the_problem(tmp_path):
    result = runner.invoke(app, ["suites", "generate", "--suite", "nope", "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code != 0 and "unknown suite 'nope'" in result.output
    result = runner.invoke(app, ["suites", "generate", "--suite", "units", "--train", "1", "--heldout", "1",
                                 "--out", str(tmp_path / "x.csv")])  # fmt: skip
    assert result.exit_code != 0 and "unknown task file suffix '.csv'" in result.output
    result = runner.invoke(app, ["suites", "generate", "--suite", "notool", "--train", "100000", "--heldout", "0",
                                 "--out", str(tmp_path / "x.jsonl")])  # fmt: skip
    assert result.exit_code == 1 and "made only" in result.output
