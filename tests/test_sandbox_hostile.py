"""Sandbox against hostile tools: each test is a way a tool could reach past its worker.

Every test here failed against the sandbox before the pool/worker split (per-process memory
limit only, no namespaces, no clean-up check, waiting on the pipe). Bounded: a few seconds
each, and at most ~450 MiB really allocated at once.
"""

from __future__ import annotations

import functools
import os
import random
import subprocess
import sys
import time

import psutil
import pytest

from dataengine.config import SandboxConfig
from dataengine.tools.sandbox import Sandbox
from dataengine.types import ToolCall

BOX = "testing"


def tc(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=2, timeout_s=3.0, memory_mb=256, cpu_s=10.0) as sb:
        sb.wait_ready()
        yield sb


@functools.cache
def _kernel_allows_namespaces() -> bool:
    flags = "0x10000000 | 0x20000 | 0x40000000 | 0x08000000 | 0x20000000"  # user, mount, net, IPC, PID
    code = f"import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare({flags}) != 0)"
    return subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def needs_namespaces(sb: Sandbox) -> None:
    if not _kernel_allows_namespaces():
        pytest.skip("this kernel refuses unprivileged user namespaces (see docs/tools.md, fallback)")


def gone(pid: int | None, seconds: float = 5.0) -> bool:
    """Whether a process is dead (or a zombie) within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def sleepers(marker: str) -> list[psutil.Process]:
    """Live `sleep <marker>` processes."""
    return [p for p in psutil.process_iter(["cmdline", "status"]) if (p.info["cmdline"] or [])[-1:] == [marker]
            and p.info["status"] != psutil.STATUS_ZOMBIE]


def distinctive_seconds() -> float:
    return 60 + random.randrange(1, 10**5) / 10**5


# ------------------------------------------------------------------ memory


def test_memory_limit_covers_the_whole_process_group():
    # Three children of 150 MiB each: every process is under the 256 MiB limit, the group is not.
    with Sandbox(workers=1, timeout_s=8.0, memory_mb=256) as sb:
        check_group_memory_limit(sb)


def test_memory_limit_covers_the_whole_process_group_without_namespaces():
    with Sandbox(workers=1, timeout_s=8.0, memory_mb=256, namespaces=False) as sb:
        check_group_memory_limit(sb)


def check_group_memory_limit(sb: Sandbox) -> None:
    start = time.monotonic()
    result, _ = sb.call(BOX, tc("hog_children", children=3, megabytes=150, seconds=3))
    assert result.status == "memory", result
    assert "processes it started" in result.error and "256 MiB" in result.error
    assert time.monotonic() - start < 3  # killed while the children held their memory
    assert sb.call(BOX, tc("add", a=1, b=2))[0].output == 3


def test_memory_limit_by_cgroup_where_delegated():
    folder = os.environ.get("DATAENGINE_TEST_CGROUP")
    if not folder:
        pytest.skip("set DATAENGINE_TEST_CGROUP to a cgroup v2 folder with the memory controller delegated")
    with Sandbox(workers=1, timeout_s=8.0, memory_mb=256, cgroup=folder) as sb:
        sb.wait_ready()
        assert sb.isolation["memory"] == "cgroup"
        check_group_memory_limit(sb)


def test_cgroup_folder_without_memory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="memory in cgroup.subtree_control"):
        Sandbox(workers=1, cgroup=str(tmp_path))


def test_group_under_the_limit_is_fine(sandbox):
    result, _ = sandbox.call(BOX, tc("hog_children", children=2, megabytes=40, seconds=0.3))
    assert result.status == "ok" and result.output == 80


def test_dev_shm_is_private_and_small(sandbox):
    needs_namespaces(sandbox)
    name = f"dataengine-hostile-{os.getpid()}-{random.randrange(10**9)}"
    try:
        result, _ = sandbox.call(BOX, tc("fill_file", path=f"/dev/shm/{name}", megabytes=300))
        assert result.status == "exception"
        assert "File too large" in result.error or "No space left" in result.error
        assert not os.path.exists(f"/dev/shm/{name}")  # the host's /dev/shm never saw it
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


# ------------------------------------------------------------------ left-overs


def test_leftover_thread_gets_the_worker_replaced(sandbox):
    sandbox.wait_ready()
    before = set(sandbox.pids)
    result, _ = sandbox.call(BOX, tc("spin_thread"))
    assert result.status == "ok"
    sandbox.wait_ready()
    replaced = before - set(sandbox.pids)
    assert len(replaced) == 1 and gone(replaced.pop())  # the burning thread died with it


def test_patched_module_does_not_reach_the_next_call():
    with Sandbox(workers=1) as sb:
        assert sb.call(BOX, tc("tamper_json"))[0].output == "tampered"
        assert sb.call(BOX, tc("add", a=1, b=2))[0].output == 3


def test_lifted_limit_does_not_reach_the_next_call():
    with Sandbox(workers=1, memory_mb=256) as sb:
        assert sb.call(BOX, tc("tamper_limits"))[0].status == "ok"
        result, _ = sb.call(BOX, tc("allocate", megabytes=600))
        assert result.status == "memory"


# ------------------------------------------------------------------ processes


def test_detached_children_die_with_the_worker():
    check_detached_children_die(Sandbox(workers=1))


def test_detached_children_die_with_the_worker_without_namespaces():
    check_detached_children_die(Sandbox(workers=1, namespaces=False))


def check_detached_children_die(sb: Sandbox) -> None:
    marker = str(distinctive_seconds())
    try:
        assert sb.call(BOX, tc("spawn_detached", seconds=float(marker)))[0].output == "spawned"
        sb.close()
        deadline = time.monotonic() + 5
        while sleepers(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not sleepers(marker)
    finally:
        sb.close()
        for p in sleepers(marker):
            p.kill()


def test_detached_child_of_a_hung_tool_dies_at_the_timeout():
    marker = str(distinctive_seconds())
    with Sandbox(workers=1, timeout_s=1.5) as sb:
        try:
            result, _ = sb.call(BOX, tc("spawn_and_hang", seconds=float(marker), detach=True))
            assert result.status == "timeout"
            deadline = time.monotonic() + 5
            while sleepers(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not sleepers(marker)
        finally:
            for p in sleepers(marker):
                p.kill()


def test_tools_cannot_signal_the_engine_or_other_workers(sandbox):
    needs_namespaces(sandbox)
    sandbox.wait_ready()
    # pid 1 inside a worker's PID namespace is the worker's own init, so the host's init (the
    # parent of a detached test run) cannot be told apart by number: leave it out.
    for pid in sorted({os.getpid(), os.getppid(), *sandbox.pids} - {1}):
        result, _ = sandbox.call(BOX, tc("signal_pid", pid=pid, sig=0))  # 0: only "may I?"
        assert result.status == "exception" and "ProcessLookupError" in result.error, (pid, result)


def test_segfault_is_prompt_even_when_a_forked_child_holds_the_pipe():
    with Sandbox(workers=1, timeout_s=5.0) as sb:
        start = time.monotonic()
        result, _ = sb.call(BOX, tc("fork_and_segfault"))
        assert result.status == "crash" and "SIGSEGV" in result.error
        assert time.monotonic() - start < 2.5
        assert sb.call(BOX, tc("add", a=1, b=2))[0].output == 3


def test_engine_never_unpickles_what_a_tool_writes_to_its_pipe(tmp_path):
    marker = tmp_path / "pwned"
    with Sandbox(workers=1) as sb:
        result, _ = sb.call(BOX, tc("forge_pipe_message", path=str(marker)))
        assert result.status == "crash" and "malformed message" in result.error
        assert not marker.exists()
        assert sb.call(BOX, tc("add", a=1, b=2))[0].output == 3


# ------------------------------------------------------------------ files and environment


def test_tools_cannot_read_host_files(sandbox, tmp_path):
    needs_namespaces(sandbox)
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    for path in ["/etc/passwd", "/etc/shadow", str(secret), os.path.expanduser("~/.bashrc")]:
        result, _ = sandbox.call(BOX, tc("read_file", path=path))
        assert result.status == "exception" and "FileNotFoundError" in result.error, (path, result)


def test_tools_write_only_to_their_scratch_folder(sandbox, tmp_path):
    needs_namespaces(sandbox)
    for path in [str(tmp_path / "out.txt"), os.path.join(os.getcwd(), "out.txt"), "/usr/out.txt", "/out.txt"]:
        result, _ = sandbox.call(BOX, tc("write_file", path=path, text="x"))
        assert result.status == "exception", (path, result)
        assert "Read-only file system" in result.error or "No such file" in result.error
    assert not (tmp_path / "out.txt").exists() and not os.path.exists(os.path.join(os.getcwd(), "out.txt"))
    result, _ = sandbox.call(BOX, tc("write_file", path="note.txt", text="x"))
    assert result.status == "ok" and result.output == "/tmp/note.txt"
    assert not os.path.exists(os.path.join(os.getcwd(), "note.txt"))
    # The scratch folder is emptied after every call.
    assert sandbox.call(BOX, tc("read_file", path="/tmp/note.txt"))[0].status == "exception"


def test_view_cannot_be_remounted_writable():
    with Sandbox(workers=1) as sb:
        needs_namespaces(sb)
        sb.wait_ready()
        before = sb.pids[0]
        result, _ = sb.call(BOX, tc("remount_writable", path="/usr"))
        assert result.status == "ok"
        direct, nested, unmount = result.output
        assert direct == "Operation not permitted"  # no capabilities left
        assert nested == "Operation not permitted" and unmount == "Invalid argument"  # locked mounts
        sb.wait_ready()
        assert sb.pids != [before]  # the worker was left in other namespaces: replaced


def test_secret_environment_variables_are_not_passed():
    # A fresh interpreter: workers inherit the environment their fork server started with.
    code = (
        "from dataengine.tools.sandbox import Sandbox; from dataengine.types import ToolCall\n"
        "with Sandbox(workers=1) as sb:\n"
        "    for name in ['HF_TOKEN', 'OPENAI_API_KEY', 'DATAENGINE_PLAIN']:\n"
        "        print(sb.call('testing', ToolCall(name='getenv', arguments={'variable': name}))[0].output)\n"
    )
    env = {**os.environ, "HF_TOKEN": "hf_secret", "OPENAI_API_KEY": "sk-secret", "DATAENGINE_PLAIN": "visible"}
    out = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["None", "None", "visible"], out.stderr[-2000:]


def test_runner_has_no_capabilities(sandbox):
    needs_namespaces(sandbox)
    assert sandbox.isolation["namespaces"] and sandbox.isolation["capabilities"] == 0


def test_from_config_uses_every_field():
    cfg = SandboxConfig(workers=1, timeout_s=2.5, memory_mb=300, cpu_s=3.0, max_output_bytes=1000, scratch_mb=8)
    with Sandbox.from_config(cfg, preload=["testing"]) as sb:
        assert (sb.limits.timeout_s, sb.limits.memory_mb, sb.limits.cpu_s, sb.limits.max_output_bytes,
                sb.limits.scratch_mb) == (2.5, 300, 3.0, 1000, 8)
        assert sb.preload == ("testing",) and len(sb.pids) == 1
        result, _ = sb.call(BOX, tc("fill_file", path="big.bin", megabytes=9))
        assert result.status == "exception" and "File too large" in result.error  # scratch_mb=8
