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


def test_gold_step_probabilities_score_each_gold_turn(env, tiny):
    """Each gold turn is scored given the gold turns before it; a level's path is the product."""
    import json
    import math

    from dataengine.gold_demo import gold_step_probabilities, run_turns
    from dataengine.policy import Conversation
    from dataengine.suites import generate_suite
    from dataengine.suites.gold import gold_turns

    tasks = generate_suite("arithmetic", n_train=3, n_heldout=0, seed=0, levels=[1])
    tasks += generate_suite("arithmetic", n_train=1, n_heldout=0, seed=0, levels=[2])
    report = gold_step_probabilities(tiny, env, tasks)
    assert set(report["steps"]) == {"1/0", "1/1", "2/0", "2/1", "2/2"}
    assert report["steps"]["1/0"]["n"] == 3 and report["steps"]["2/2"]["n"] == 1
    # The level-2 task by hand: each turn scored after the real tool outputs of the turns before.
    task = tasks[-1]
    texts = gold_turns(task, sort_keys=False)
    messages = run_turns(env, [task], [texts])[0].messages
    at = [i for i, m in enumerate(messages) if m.role == "assistant"]
    assert [messages[i].role for i in at] == ["assistant"] * 3 and messages[at[1] - 1].role == "tool"
    logprobs = [s.logprob for s in tiny.score([Conversation(messages[:i], task.tools) for i in at], texts)]
    assert report["steps"]["2/1"]["median_logprob"] == pytest.approx(logprobs[1], abs=1e-4)
    assert report["paths"]["2"]["mean_p"] == pytest.approx(math.exp(sum(logprobs)), rel=1e-3)
    assert report["paths"]["2"]["reachable"] == int(math.exp(sum(logprobs)) >= 0.01)
    with pytest.raises(ValueError, match="at least one task"):
        gold_step_probabilities(tiny, env, [])

    out = CliRunner().invoke(app, ["policy", "gold-steps", "--model", "tiny", "--tasks", "2", "--level", "2",
                                   "--device", "cpu"])
    assert out.exit_code == 0, out.output
    printed = json.loads(out.stdout[out.stdout.index("{"):])  # after any weight-loading bar
    assert printed["tasks"] == 2 and set(printed["steps"]) == {"2/0", "2/1", "2/2"}
    bad = CliRunner().invoke(app, ["policy", "gold-steps", "--model", "tiny", "--split", "test"])
    assert bad.exit_code != 0 and "split must be train or heldout" in bad.output
