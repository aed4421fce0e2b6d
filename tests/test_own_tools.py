"""A user's own tools and tasks without a source edit: tools entries (.py files and modules)
become toolboxes in this process and in real sandbox workers, the task-file short forms, bad
rows named by line and field, `dataengine tasks validate`, the --tools/--mcp flags, the run id,
and docs/your-own-tools.md's commands run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dataengine.cli import app
from dataengine.commands.common import parse_mcp, tools_overrides
from dataengine.config import load_config
from dataengine.suites.io import TaskFileError, check_tasks, load_tasks
from dataengine.tools.registry import ToolsError, get_toolbox, load_tools, loaded_tools, tools_entry
from dataengine.types import ToolCall, stable_hash

ROOT = Path(__file__).resolve().parents[1]
BANK = ROOT / "docs" / "examples" / "bank"
PAGE = ROOT / "docs" / "your-own-tools.md"


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def bank():
    """The docs' bank example, loaded once in this process."""
    assert load_tools([str(BANK / "bank_tools.py")]) == ["bank"]
    return get_toolbox("bank")


def test_file_of_plain_functions_becomes_a_stateful_toolbox(bank):
    assert sorted(bank.tools) == ["deposit", "get_balance", "transfer"]
    assert all(t.stateful for t in bank.tools.values())
    assert [n for n, t in bank.tools.items() if not t.writes_state] == ["get_balance"]
    assert "state" not in bank.tools["deposit"].spec.parameters["properties"]
    first, second = bank.initial_state(None), bank.initial_state(None)
    assert first == {"accounts": {"alice": 120, "bob": 45, "carol": 300, "dave": 10}}
    first["accounts"]["bob"] = 0  # each task gets its own copy
    assert second["accounts"]["bob"] == 45 and bank.initial_state(None)["accounts"]["bob"] == 45
    # loading again (another spelling of the same file) is a no-op
    assert load_tools([os.path.relpath(BANK / "bank_tools.py")]) == ["bank"]


def test_toolbox_name_rules(tmp_path):
    stem = _write(tmp_path / "weather_tools_x1.py", '''
        from math import sqrt  # imported, not a tool

        def forecast(city: str) -> str:
            """The forecast of a city.

            Args:
                city: The city.
            """
            return "sunny" if sqrt(len(city)) > 2 else "rain"

        def _helper() -> None:
            pass
        ''')
    assert load_tools([str(stem)]) == ["weather_tools_x1"]
    assert list(get_toolbox("weather_tools_x1").tools) == ["forecast"]
    listed = _write(tmp_path / "listed_x1.py", '''
        TOOLBOX = "listed_box_x1"
        __all__ = ["shout"]

        def shout(text: str) -> str:
            """Upper-case a text.

            Args:
                text: The text.
            """
            return text.upper()

        def whisper(text: str) -> str:
            """Lower-case a text.

            Args:
                text: The text.
            """
            return text.lower()
        ''')
    assert load_tools([str(listed)]) == ["listed_box_x1"]
    assert list(get_toolbox("listed_box_x1").tools) == ["shout"]
    registers = _write(tmp_path / "registers_x1.py", '''
        from dataengine.tools.registry import Toolbox, register_toolbox, tool_from_callable

        def ping() -> str:
            """Answer pong."""
            return "pong"

        BOX = register_toolbox(Toolbox("pinger_x1", {"ping": tool_from_callable(ping)}))
        ''')
    assert load_tools([str(registers)]) == ["pinger_x1"]


@pytest.mark.parametrize(("source", "problem"), [
    ("X = 1\n", "defines no tools"),
    ("def f(x: int) -> int:\n    return x\n", "function 'f'"),
    ('TOOLBOX = "shop"\ndef f(x: int) -> int:\n    """F.\n\n    Args:\n        x: X.\n    """\n    return x\n',
     "toolbox name 'shop' is taken"),
    ("raise RuntimeError('boom')\n", "failed to import: RuntimeError: boom"),
    ('READ_ONLY = ("g",)\ndef f(x: int) -> int:\n    """F.\n\n    Args:\n        x: X.\n    """\n    return x\n',
     "READ_ONLY names 'g'"),
])
def test_bad_tools_files_are_one_line_errors(tmp_path, source, problem):
    path = tmp_path / f"bad_{abs(hash(source)) % 10**8}.py"
    path.write_text(source)
    with pytest.raises(ToolsError, match=re.escape(problem)) as err:
        load_tools([str(path)])
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_entries_name_themselves(tmp_path):
    with pytest.raises(ToolsError, match="tools file .*nope.py does not exist"):
        tools_entry(str(tmp_path / "nope.py"))
    with pytest.raises(ToolsError, match="tools module 'no_such_tools_module' is not importable"):
        load_tools(["no_such_tools_module"])


def test_sandbox_workers_run_the_file_tools_on_a_copied_state(bank):
    from dataengine.tools.sandbox import Sandbox

    path = str(BANK / "bank_tools.py")
    assert path in loaded_tools()
    state = bank.initial_state(None)
    with Sandbox(workers=1, preload=["bank"], modules=[path]) as sandbox:
        result, new = sandbox.call("bank", ToolCall(name="deposit", arguments={"account": "Bob", "amount": 30}), state)
        assert result.ok, result
        assert result.output == {"account": "bob", "balance": 75}
        assert new["accounts"]["bob"] == 75 and state["accounts"]["bob"] == 45  # the caller's copy is untouched
        bad, same = sandbox.call("bank", ToolCall(name="transfer", arguments={"source": "dave", "target": "bob", "amount": 50}), new)
        assert not bad.ok and "less than 50" in bad.error
        read, _ = sandbox.call("bank", ToolCall(name="get_balance", arguments={"account": "bob"}), new)
        assert read.output["balance"] == 75
    # a Sandbox built without modules still imports what this process loaded
    with Sandbox(workers=1, preload=["bank"]) as sandbox:
        result, _ = sandbox.call("bank", ToolCall(name="get_balance", arguments={"account": "carol"}), state)
        assert result.output["balance"] == 300


def test_a_tools_file_outside_the_package_is_visible_to_the_workers(tmp_path):
    """A file in a folder that is on no sys.path (the user's project folder): the workers'
    private file-system view must show it, read-only."""
    from dataengine.tools.sandbox import Sandbox

    (tmp_path / "project").mkdir()
    path = _write(tmp_path / "project" / "counter_x1.py", '''
        INITIAL_STATE = {"n": 0}

        def bump(state: dict, by: int = 1) -> int:
            """Add to the counter.

            Args:
                by: How much to add.
            """
            state["n"] += by
            return state["n"]
        ''')
    with Sandbox(workers=1, modules=[str(path)], preload=["counter_x1"]) as sandbox:
        result, state = sandbox.call("counter_x1", ToolCall(name="bump", arguments={"by": 2}), {"n": 1})
        assert result.ok, result.error
        assert result.output == 3 and state == {"n": 3}


def test_bank_tasks_load_and_their_gold_reaches_the_end_state(bank):
    from dataengine.env import ToolEnv
    from dataengine.tools.sandbox import Sandbox
    from dataengine.verifiers.end_state import end_state_hash

    tasks = load_tasks(BANK / "tasks.jsonl", tools=[str(BANK / "bank_tools.py")])
    assert len(tasks) == 20
    assert sorted({t.metadata["level"] for t in tasks}) == [1, 2, 3]
    assert all(t.suite == "bank" and len(t.tools) == 3 and t.initial_state is not None for t in tasks)
    written = [t for t in tasks if t.gold.end_state_hash is not None]
    assert len(written) == 5
    with Sandbox(workers=1, preload=["bank"]) as sandbox:
        env = ToolEnv(sandbox)
        for task in written:
            assert end_state_hash(task, env.replay(task, list(task.gold.calls))) == task.gold.end_state_hash


def _rows(tmp_path: Path, rows: list) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _good(i: int, **extra) -> dict:
    return {"id": f"t{i}", "toolbox": "bank", "messages": [{"role": "user", "content": "Deposit 1 dollar for Bob."}],
            "gold": {"calls": [{"name": "deposit", "arguments": {"account": "bob", "amount": 1}}]}, **extra}


def test_short_forms(tmp_path, bank):
    end = {"accounts": {"alice": 120, "bob": 46, "carol": 300, "dave": 10}}
    path = _rows(tmp_path, [_good(0, tools=["deposit"], level=2), _good(1, gold={"calls": [], "end_state": end},
                                                                         initial_state={"accounts": {"bob": 46}})])
    first, second = load_tasks(path)
    assert [t.name for t in first.tools] == ["deposit"] and first.metadata == {"level": 2}
    assert first.initial_state == bank.initial_state(None) and first.suite == "bank"
    assert second.initial_state == {"accounts": {"bob": 46}}  # the row's own state wins
    assert second.gold.end_state_hash == stable_hash(end)


def test_every_bad_row_is_named_by_line_and_field(tmp_path, bank):
    wrong_end = {"accounts": {"alice": 120, "bob": 99, "carol": 300, "dave": 10}}
    path = _rows(tmp_path, [
        _good(0),
        "{not json",
        _good(2, toolbox="nosuchbox"),
        _good(3, tools=["deposit", "withdraw"]),
        {**_good(4), "gold": {"calls": [{"name": "withdraw", "arguments": {}}]}},
        _good(5, level=0),
        {**_good(6), "gold": {"calls": _good(6)["gold"]["calls"], "end_state": wrong_end}},
        _good(7, colour="blue"),
        _good(0),
    ])
    tasks, errors = check_tasks(path)
    assert [t.id for t in tasks] == ["t0"]
    got = [(e.line, e.field) for e in errors]
    assert got == [(2, None), (3, "toolbox"), (4, "tools.1"), (5, "gold.calls.0.name"), (6, "level"),
                   (7, "gold.end_state"), (8, "colour"), (9, "id")]
    assert "unknown tool 'withdraw' in toolbox 'bank' (its tools: get_balance, deposit, transfer)" in str(errors[2])
    assert "replaying gold.calls reaches another state" in str(errors[5])
    assert all(str(e).startswith(f"{path}, line {e.line}") for e in errors)
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    assert err.value.line == 2


def test_tasks_validate_command(tmp_path):
    runner = CliRunner()
    good = runner.invoke(app, ["tasks", "validate", str(BANK / "tasks.jsonl"), "--tools", str(BANK / "bank_tools.py")])
    assert good.exit_code == 0, good.output
    assert "20 tasks OK (bank level 1: 8, bank level 2: 7, bank level 3: 5)" in good.stdout
    bad_file = _rows(tmp_path, [_good(0), _good(1, tools=["nope"]), "[1]"])
    bad = runner.invoke(app, ["tasks", "validate", str(bad_file), "--tools", str(BANK / "bank_tools.py")])
    assert bad.exit_code == 1
    lines = bad.stderr.strip().splitlines()
    assert lines[0].startswith(f"{bad_file}, line 2, field 'tools.0': unknown tool 'nope'")
    assert lines[1].startswith(f"{bad_file}, line 3: expected a JSON object")
    assert lines[2] == f"{bad_file}: 2 bad row(s), 1 good"
    missing = runner.invoke(app, ["tasks", "validate", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 1 and "task file not found" in missing.stderr


def test_tools_and_mcp_flags_become_config_overrides(tmp_path):
    assert parse_mcp('fs=npx -y server-fs "/my data"') == {"name": "fs", "command": ["npx", "-y", "server-fs", "/my data"],
                                                          "stateful": True}
    for bad in ("fs", "=cmd", "fs=", 'fs=say "unclosed'):
        with pytest.raises(typer.BadParameter):
            parse_mcp(bad)
    config = _write(tmp_path / "engine.yaml", f"""
        tools:
          modules: [{BANK / "bank_tools.py"}]
          mcp: [{{name: old, url: "http://127.0.0.1:9/mcp"}}]
        """)
    extra = _write(tmp_path / "extra_x1.py", '''
        def noop() -> str:
            """Do nothing."""
            return ""
        ''')
    overrides = tools_overrides([str(extra)], ["fs=server --root /tmp"], ["ro=server --read-only"], config=config)
    cfg = load_config(config, **overrides)
    assert cfg.tools.modules == [str(BANK / "bank_tools.py"), str(extra)]
    assert [(s.name, s.command, s.stateful) for s in cfg.tools.mcp] == [
        ("old", None, True), ("fs", ["server", "--root", "/tmp"], True), ("ro", ["server", "--read-only"], False)]
    assert tools_overrides() == {}
    from flows.pipeline import PipelineConfig  # pipeline and experiment configs nest the engine

    nested = load_config(None, model=PipelineConfig, **tools_overrides([str(extra)], ["fs=server"], prefix="engine__"))
    assert nested.engine.tools.modules == [str(extra)] and nested.engine.tools.mcp[0].command == ["server"]
    with pytest.raises(typer.BadParameter, match="does not exist"):
        tools_overrides([str(tmp_path / "missing.py")])


def test_every_command_takes_the_flags():
    runner = CliRunner()
    for command in (["generate"], ["eval"], ["experiment"], ["pipeline"], ["demo"], ["tasks", "validate"]):
        result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert "--tools" in result.output, command
        if command != ["tasks", "validate"]:
            assert "--mcp" in result.output and "--mcp-stateless" in result.output, command


def test_the_tools_file_is_part_of_the_run_id(tmp_path):
    from dataengine.stages.generate import config_tasks, default_run_id, settings_key

    tools = _write(tmp_path / "bank_copy_x1.py", (BANK / "bank_tools.py").read_text().replace('"bank"', '"bank_copy_x1"'))
    rows = [json.loads(line) | {"toolbox": "bank_copy_x1"} for line in (BANK / "tasks.jsonl").read_text().splitlines()]
    task_file = _rows(tmp_path, rows)
    cfg = load_config(None, task_file=str(task_file), num_tasks=20, tools__modules=[str(tools)])
    tasks = config_tasks(cfg)
    assert len(tasks) == 20
    before = (default_run_id(cfg, tasks), settings_key(cfg))
    assert before != (default_run_id(load_config(None), tasks), settings_key(load_config(None)))
    tools.write_text(tools.read_text().replace("alice\": 120", "alice\": 121"))
    assert default_run_id(cfg, tasks) != before[0] and settings_key(cfg) != before[1]


def test_a_tools_file_brings_its_own_worked_examples(bank):
    from dataengine.suites.gold import replay
    from dataengine.types import ToolCall

    source = (BANK / "bank_tools.py").read_text()
    module = {}
    exec(compile(source, "bank_tools.py", "exec"), module)  # noqa: S102 - the docs' example file
    assert len(bank.examples) == len(module["EXAMPLES"]) == 2
    for example, episode in zip(module["EXAMPLES"], bank.examples):
        assert [m["role"] for m in episode] == ["user", "assistant", "tool", "assistant"]
        assert episode[0]["content"] == example["user"] and episode[-1]["content"] == example["answer"]
        outputs, _ = replay(bank, [ToolCall.model_validate(c) for c in example["calls"]], bank.initial_state(None))
        assert [json.loads(m["content"]) for m in episode if m["role"] == "tool"] == outputs  # real outputs
    # No task of the page's task file is one of the examples, whatever its split.
    shown = {e[0]["content"] for e in bank.examples}
    asked = {m.content for t in load_tasks(BANK / "tasks.jsonl") for m in t.messages}
    assert not shown & asked


def test_a_task_that_is_one_of_the_examples_is_a_bad_row(tmp_path, bank):
    leaked = _good(1, messages=[{"role": "user", "content": bank.examples[0][0]["content"]}])
    tasks, errors = check_tasks(_rows(tmp_path, [_good(0), leaked]))
    assert [t.id for t in tasks] == ["t0"]
    assert errors[0].line == 2 and errors[0].field == "messages" and "EXAMPLES" in str(errors[0])


@pytest.mark.parametrize(("examples", "problem"), [
    ('[{"user": "Pay Bob.", "calls": [{"name": "pay", "arguments": {}}]}]', "EXAMPLES\\[0\\]: KeyError: .*no tool 'pay'"),
    ('[{"user": "Hi.", "answer": "Hello."}, {"user": "Add 1.", "calls": [{"name": "add_one", "arguments": {"x": "a"}}]}]',
     "EXAMPLES\\[1\\]: TypeError"),
    ('[{"user": "Hi.", "reply": "Hello."}]', "EXAMPLES\\[0\\]: ValueError: unknown key 'reply'"),
    ('{"user": "Hi."}', "EXAMPLES must be a list"),
])
def test_bad_examples_are_one_line_errors(tmp_path, examples, problem):
    name = f"examples_x{abs(hash(examples)) % 10**8}"
    path = _write(tmp_path / f"{name}.py", f'''
        EXAMPLES = {examples}

        def add_one(x: int) -> int:
            """Add one.

            Args:
                x: A number.
            """
            return x + 1
        ''')
    with pytest.raises(ToolsError, match=problem):
        load_tools([str(path)])


def test_the_examples_reach_the_prompt_of_their_tools_only(bank):
    from dataengine.chat_template import default_examples, install_prompt_options, tool_chat_template
    from dataengine.models import load_model
    from dataengine.suites import generate_suite

    entry = str(BANK / "bank_tools.py")
    _, tokenizer = load_model("tiny")
    builtin = tokenizer.chat_template
    assert builtin == tool_chat_template(examples=default_examples())  # no tools entries: the built-in template
    install_prompt_options(tokenizer, tools=[entry])

    def render(task):
        return tokenizer.apply_chat_template([m.to_chat() for m in task.messages], tools=[t.to_openai() for t in task.tools],
                                             tokenize=False, add_generation_prompt=True)

    task = load_tasks(BANK / "tasks.jsonl", tools=[entry])[0]
    text = render(task)
    examples = text[text.index("<|im_end|>") : text.rindex("<|im_start|>user")]
    assert all(e[0]["content"] in examples for e in bank.examples)
    assert "<tool_call>" in examples and '"name": "add"' not in examples  # not the arithmetic demo
    # A built-in suite's prompt is byte for byte what it was without the tools file.
    arithmetic = generate_suite("arithmetic", 1, 0, seed=0)[0]
    with_tools = render(arithmetic)
    tokenizer.chat_template = builtin
    assert render(arithmetic) == with_tools


def test_the_policy_of_a_config_with_tools_shows_their_examples(bank):
    from dataengine.policy import policy_from_config
    from dataengine.policy.base import Conversation

    entry = str(BANK / "bank_tools.py")
    cfg = load_config(None, **{"policy__model": "tiny", "tools__modules": [entry]})
    task = load_tasks(BANK / "tasks.jsonl", tools=[entry])[0]
    policy = policy_from_config(cfg.policy, cfg.tools.modules)
    prompt = policy.tokenizer.decode(policy.encode(Conversation.from_task(task)))
    assert bank.examples[1][0]["content"] in prompt
    plain = policy_from_config(cfg.policy)
    assert bank.examples[1][0]["content"] not in plain.tokenizer.decode(plain.encode(Conversation.from_task(task)))


def _page_commands() -> str:
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert blocks, f"{PAGE} has no bash block"
    return "\n".join(blocks)


def _run_page(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "REPO": str(ROOT), "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=3600)


@pytest.mark.slow
def test_the_page_runs_as_written_with_smollm2(tmp_path):
    """docs/your-own-tools.md's commands, exactly, with SmolLM2: trees, pairs and SFT rows."""
    import polars as pl

    done = _run_page(tmp_path, _page_commands())
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "bank"
    assert "20 tasks OK" in done.stdout
    assert pl.read_parquet(folder / "data" / "sft.parquet").height >= 1
    assert pl.read_parquet(folder / "data" / "pairs.parquet").height >= 1


@pytest.mark.slow
def test_the_page_runs_with_the_tiny_model(tmp_path):
    """The same commands with `--model tiny` in place of `--model smollm2` (the plumbing only:
    a random model solves nothing, so the exports may be empty)."""
    script = _page_commands()
    assert "--model smollm2" in script
    done = _run_page(tmp_path, script.replace("--model smollm2", "--model tiny"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "bank" / "data" / "sft.parquet").is_file()
