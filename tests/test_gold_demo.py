"""Gold episodes of every built-in suite succeed through the sandboxed ToolEnv; corrupted ones fail."""

import pytest
from typer.testing import CliRunner

from dataengine.cli import app
from dataengine.env import ToolEnv
from dataengine.gold_demo import run_gold
from dataengine.suites import list_suites
from dataengine.tools.sandbox import Sandbox


@pytest.fixture(scope="module")
def env():
    with Sandbox(workers=2, preload=list_suites()) as sandbox:
        yield ToolEnv(sandbox, max_steps=8)


@pytest.mark.parametrize("suite", ["arithmetic", "units", "shop", "chains", "notool"])
def test_gold_succeeds_and_corruption_fails(env, suite):
    s = run_gold(env, suite, n=6, seed=1)
    assert s.gold_success == s.tasks == 6
    assert s.tool_errors == 0
    assert s.corrupted_success == 0
    if suite != "notool":
        assert s.corrupted > 0 and s.tool_calls >= s.tasks


def test_demo_command_writes_task_files(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--tasks", "2", "--out", str(tmp_path), "--gold-only"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "arithmetic.jsonl").exists()
    assert "gold" in result.output
