"""Sandbox: every way a tool can misbehave becomes a ToolResult, and the pool keeps working."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from dataengine.tools.sandbox import Sandbox
from dataengine.types import ToolCall

BOX = "testing"


def tc(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=2, timeout_s=1.5, memory_mb=256, cpu_s=10.0, max_output_bytes=4096) as sb:
        sb.wait_ready()
        yield sb


def assert_pool_works(sb: Sandbox) -> None:
    results = sb.call_many([(BOX, tc("add", a=i, b=1), None) for i in range(4)])
    assert [r.output for r, _ in results] == [1, 2, 3, 4]


def test_ok_call_returns_output_and_seconds(sandbox):
    result, state = sandbox.call(BOX, tc("add", a=2, b=3))
    assert result.status == "ok" and result.output == 5 and result.error is None
    assert result.seconds >= 0.0 and state is None


def test_exception_is_reported_with_type_message_and_place(sandbox):
    result, _ = sandbox.call(BOX, tc("divide", a=1, b=0))
    assert result.status == "exception"
    assert result.error.startswith("ZeroDivisionError: division by zero")
    assert "testing.py" in result.error and "in divide" in result.error
    assert_pool_works(sandbox)


def test_wall_clock_timeout_kills_and_replaces_the_worker(sandbox):
    sandbox.wait_ready()
    before = set(sandbox.pids)
    start = time.monotonic()
    result, _ = sandbox.call(BOX, tc("sleep", seconds=30))
    assert time.monotonic() - start < 10
    assert result.status == "timeout" and "wall-clock limit of 1.5 s" in result.error
    assert result.seconds >= 1.5
    sandbox.wait_ready()
    assert len(before & set(sandbox.pids)) == 1  # one of the two workers was replaced
    assert_pool_works(sandbox)


def test_cpu_limit_stops_an_infinite_loop_without_killing_the_worker():
    with Sandbox(workers=1, timeout_s=30.0, cpu_s=1.0) as sb:
        pid = sb.call(BOX, tc("whoami"))[0].output
        result, _ = sb.call(BOX, tc("spin"))
        assert result.status == "timeout" and "CPU time" in result.error
        assert sb.call(BOX, tc("whoami"))[0].output == pid


@pytest.mark.parametrize("tool", ["segfault", "read_null"])
def test_segfault_is_a_crash(sandbox, tool):
    result, _ = sandbox.call(BOX, tc(tool))
    assert result.status == "crash" and "SIGSEGV" in result.error
    assert_pool_works(sandbox)


def test_abrupt_exit_is_a_crash(sandbox):
    result, _ = sandbox.call(BOX, tc("hard_exit", code=7))
    assert result.status == "crash" and "code 7" in result.error
    assert_pool_works(sandbox)


def test_memory_bomb_hits_the_address_space_limit(sandbox):
    assert sandbox.call(BOX, tc("allocate", megabytes=16))[0].output == 16 * 1024 * 1024
    result, _ = sandbox.call(BOX, tc("allocate", megabytes=4096))
    assert result.status == "memory" and "256 MiB" in result.error
    assert_pool_works(sandbox)


def test_output_over_the_limit_is_refused(sandbox):
    assert sandbox.call(BOX, tc("big_output", size=100))[0].output == "x" * 100
    result, _ = sandbox.call(BOX, tc("big_output", size=10_000))
    assert result.status == "output_too_large" and "10002 bytes" in result.error and result.output is None


def test_output_that_is_not_json_is_an_exception(sandbox):
    result, _ = sandbox.call(BOX, tc("not_json"))
    assert result.status == "exception" and "not JSON-serialisable" in result.error


def test_unknown_tool_lists_the_known_ones(sandbox):
    result, _ = sandbox.call(BOX, tc("no_such_tool"))
    assert result.status == "unknown_tool"
    assert "'no_such_tool'" in result.error and "add" in result.error and "divide" in result.error


def test_unknown_toolbox_lists_the_known_ones(sandbox):
    result, _ = sandbox.call("no_such_box", tc("add", a=1, b=2))
    assert result.status == "unknown_tool" and "no_such_box" in result.error and "testing" in result.error


@pytest.mark.parametrize(
    "arguments, words",
    [
        ({"a": 1}, ["missing required argument", "'b'"]),
        ({"a": 1, "b": "two"}, ["argument 'b'", "not of type 'integer'"]),
        ({"a": 1, "b": 2, "c": 3}, ["unexpected argument 'c'", "a, b"]),
    ],
)
def test_bad_arguments_name_the_field(sandbox, arguments, words):
    result, _ = sandbox.call(BOX, ToolCall(name="add", arguments=arguments))
    assert result.status == "bad_arguments"
    for word in words:
        assert word in result.error


def test_optional_argument_may_be_left_out(sandbox):
    assert sandbox.call(BOX, tc("echo", text="ab"))[0].output == "ab"
    assert sandbox.call(BOX, tc("echo", text="ab", repeat=2))[0].output == "abab"
    # `str | None` is emitted as OpenAPI "nullable"; null must validate, a number must not.
    assert sandbox.call(BOX, tc("echo", text="ab", suffix=None))[0].output == "ab"
    assert sandbox.call(BOX, tc("echo", text="ab", suffix="!"))[0].output == "ab!"
    assert sandbox.call(BOX, tc("echo", text="ab", suffix=3))[0].status == "bad_arguments"


def test_network_is_refused(sandbox):
    result, _ = sandbox.call(BOX, tc("connect", host="127.0.0.1", port=9))
    assert result.status == "exception" and "network access is disabled" in result.error


def _kernel_allows_network_namespaces() -> bool:
    code = "import ctypes; import sys; sys.exit(ctypes.CDLL(None).unshare(0x10000000 | 0x40000000) != 0)"
    return subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_worker_has_its_own_empty_network_namespace(sandbox):
    if not _kernel_allows_network_namespaces():
        pytest.skip("this kernel refuses unprivileged network namespaces (only the socket guard applies)")
    assert sandbox.call(BOX, tc("network_interfaces"))[0].output == ["lo"]
    result, _ = sandbox.call(BOX, tc("raw_connect", host="127.0.0.1", port=9))
    assert result.status == "exception" and "Network is unreachable" in result.error  # even loopback is down


def test_workers_are_reused():
    with Sandbox(workers=1) as sb:
        pids = {sb.call(BOX, tc("whoami"))[0].output for _ in range(5)}
        assert len(pids) == 1 and pids == set(sb.pids)


def test_worker_does_not_import_torch(sandbox):
    result, _ = sandbox.call(BOX, tc("imported", module="torch"))
    assert result.status == "ok" and result.output is False
    assert sandbox.call(BOX, tc("imported", module="json"))[0].output is True


def test_call_many_runs_in_parallel_and_keeps_input_order(sandbox):
    sandbox.wait_ready()
    results = sandbox.call_many([(BOX, tc("nap", seconds=0.4), None), (BOX, tc("nap", seconds=0.4), None)])
    assert [r.status for r, _ in results] == ["ok", "ok"]
    assert results[0][0].output != results[1][0].output  # two workers, at the same time


def test_call_many_isolates_failures(sandbox):
    items = [
        (BOX, tc("add", a=1, b=1), None),
        (BOX, tc("segfault"), None),
        (BOX, tc("divide", a=1, b=0), None),
        (BOX, tc("sleep", seconds=30), None),
        (BOX, tc("echo", text="z"), None),
        (BOX, tc("push", item="q"), {"items": []}),
    ]
    results = sandbox.call_many(items)
    assert [r.status for r, _ in results] == ["ok", "crash", "exception", "timeout", "ok", "ok"]
    assert [r.call for r, _ in results] == [call for _, call, _ in items]
    assert results[5][1] == {"items": ["q"]}
    assert_pool_works(sandbox)


def test_stateful_tool_gets_a_copy_and_returns_the_new_state(sandbox):
    state = {"items": ["a"]}
    result, new_state = sandbox.call(BOX, tc("push", item="b"), state)
    assert result.output == ["a", "b"] and new_state == {"items": ["a", "b"]}
    assert state == {"items": ["a"]} and new_state is not state


def test_failed_call_leaves_the_state_unchanged(sandbox):
    state = {"items": ["a"]}
    result, new_state = sandbox.call(BOX, tc("push_then_fail", item="b"), state)
    assert result.status == "exception" and new_state == {"items": ["a"]}
    result, new_state = sandbox.call(BOX, tc("pop"), {"items": []})
    assert result.status == "exception" and "IndexError" in result.error


def test_read_only_tool_returns_the_input_state(sandbox):
    state = {"items": ["a", "b"]}
    result, new_state = sandbox.call(BOX, tc("count"), state)
    assert result.output == 2 and new_state is state and state == {"items": ["a", "b"]}


def test_stateful_tool_without_state_starts_from_empty(sandbox):
    result, new_state = sandbox.call(BOX, tc("push", item="x"))
    assert result.output == ["x"] and new_state == {"items": ["x"]}


def test_same_call_gives_the_same_result_on_any_worker(sandbox):
    outs = [r.output for r, _ in sandbox.call_many([(BOX, tc("lucky_number"), None)] * 4)]
    assert len(set(outs)) == 1


def test_tool_prints_do_not_reach_stdout_or_stderr(sandbox, capfd):
    assert sandbox.call(BOX, tc("shout", text="LOUD"))[0].output == 4
    assert sandbox.call(BOX, tc("warn", text="NOISY"))[0].output == 5
    captured = capfd.readouterr()
    assert "LOUD" not in captured.out and "NOISY" not in captured.err


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, only unreaped
    except FileNotFoundError:
        return False


def find_sleep(seconds: str) -> list[int]:
    """Host pids of `sleep <seconds>` processes (tests use distinctive durations)."""
    return [p.pid for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-1:] == [seconds]]


def call_in_thread(sb: Sandbox, call: ToolCall) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(sb.call(BOX, call)[0]))
    thread.start()
    return thread, out


def wait_for(predicate, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_timeout_also_ends_processes_the_tool_started(sandbox):
    seconds = 60 + random.randrange(1, 10**5) / 10**5
    marker = str(seconds)  # what the tool passes to `sleep`
    thread, out = call_in_thread(sandbox, tc("spawn_and_hang", seconds=seconds))
    assert wait_for(lambda: find_sleep(marker))  # the child runs while the tool hangs
    thread.join(10)
    assert out[0].status == "timeout"
    assert wait_for(lambda: not [p for p in find_sleep(marker) if _alive(p)])


def test_bad_items_are_rejected_with_a_clear_error(sandbox):
    with pytest.raises(TypeError, match="ToolCall"):
        sandbox.call_many([(BOX, {"name": "add"}, None)])
    with pytest.raises(TypeError, match="state must be a dict"):
        sandbox.call(BOX, tc("add", a=1, b=2), state=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers"):
        Sandbox(workers=0)


def test_closed_sandbox_refuses_calls():
    sb = Sandbox(workers=1)
    sb.close()
    sb.close()
    with pytest.raises(RuntimeError, match="closed"):
        sb.call(BOX, tc("add", a=1, b=2))


def test_extra_modules_are_imported_by_workers():
    with Sandbox(workers=1, modules=["no_such_module_xyz"]) as sb:
        result, _ = sb.call("no_such_box", tc("add", a=1, b=2))
        assert result.status == "unknown_tool" and "no_such_module_xyz" in result.error


def test_interrupted_call_many_leaves_no_stale_results():
    # A shell's background job starts with SIGINT ignored: restore Python's handler for the test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_call_many()
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_call_many():
    with Sandbox(workers=1, timeout_s=5.0) as sb:
        timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            sb.call(BOX, tc("nap", seconds=2))
        timer.join()
        # The interrupted nap's result must not be delivered to the next call.
        assert sb.call(BOX, tc("add", a=1, b=2))[0].output == 3
        assert sb.call(BOX, tc("echo", text="k"))[0].output == "k"


def test_random_mix_of_failures_in_one_batch():
    kinds = [("add", {"a": 1, "b": 2}, "ok"), ("segfault", {}, "crash"), ("divide", {"a": 1, "b": 0}, "exception"),
             ("hard_exit", {"code": 2}, "crash"), ("allocate", {"megabytes": 4000}, "memory"),
             ("big_output", {"size": 100_000}, "output_too_large"), ("nope", {}, "unknown_tool"),
             ("add", {"a": "x"}, "bad_arguments"), ("sleep", {"seconds": 5}, "timeout"), ("push", {"item": "z"}, "ok")]
    rng = random.Random(7)
    items = [rng.choice(kinds) for _ in range(20)]
    with Sandbox(workers=3, timeout_s=0.5, memory_mb=256) as sb:
        results = sb.call_many([(BOX, ToolCall(name=n, arguments=a), {"items": []}) for n, a, _ in items])
        assert [r.status for r, _ in results] == [want for _, _, want in items]
        assert [r.call.name for r, _ in results] == [n for n, _, _ in items]
        assert_pool_works(sb)


TMP_TOOLBOX = '''
import json
import os

from dataengine.tools.registry import Toolbox, register_toolbox, tool_from_callable


def write(path: str) -> str:
    """Write a file.

    Args:
        path: Where.
    """
    with open(path, "w") as f:
        f.write("x")
    return path


def look(path: str) -> bool:
    """Whether a path exists.

    Args:
        path: The path.
    """
    return os.path.exists(path)


register_toolbox(Toolbox(name="tmpbox", tools={t.name: t for t in map(tool_from_callable, [write, look])}))
'''


def test_code_under_tmp_stays_visible_and_read_only(tmp_path, monkeypatch):
    """A clone or venv under /tmp: the worker's writable /tmp must not hide it (every call of a
    hidden toolbox failed as a tool error), tools cannot write there, and the between-calls wipe
    removes what a tool wrote next to it without touching it."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "tmpbox_under_tmp.py").write_text(TMP_TOOLBOX)
    monkeypatch.syspath_prepend(str(code))
    with Sandbox(workers=1, modules=["tmpbox_under_tmp"], preload=["tmpbox"]) as sb:
        module = str((code / "tmpbox_under_tmp.py").resolve())
        result, _ = sb.call("tmpbox", tc("look", path=module))
        assert result.status == "ok" and result.output is True
        if not sb.isolation["namespaces"] or not module.startswith("/tmp/"):
            pytest.skip("needs namespaces and a pytest tmp_path under /tmp")
        result, _ = sb.call("tmpbox", tc("write", path=str(code / "new.txt")))
        assert result.status == "exception" and "Read-only" in result.error
        beside = str(code.resolve().parent / "junk.txt")  # a folder of the scratch tmpfs above the view path
        assert sb.call("tmpbox", tc("write", path=beside))[0].status == "ok"
        assert sb.call("tmpbox", tc("write", path="/tmp/scratch.txt"))[0].status == "ok"
        for path, exists in ((beside, False), ("/tmp/scratch.txt", False), (module, True)):
            result, _ = sb.call("tmpbox", tc("look", path=path))
            assert result.output is exists, path
    assert not (code / "new.txt").exists() and not os.path.exists(beside)


def test_a_toolbox_workers_cannot_load_is_an_error_not_a_tool_result():
    from dataengine.tools.sandbox import ToolboxLoadError

    with Sandbox(workers=1, preload=["no_such_toolbox_xyz"]) as sb:
        with pytest.raises(ToolboxLoadError, match="no_such_toolbox_xyz"):
            sb.call("no_such_toolbox_xyz", tc("add", a=1, b=2))
