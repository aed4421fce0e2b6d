"""The `testing` toolbox: well-behaved and misbehaving tools for tests and benchmarks.

It lives in the package (not under tests/) because sandbox workers rebuild toolboxes by
importing their module: registry.TOOLBOX_MODULES maps "testing" here. No task suite uses it.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import sys
import time

from dataengine.tools.registry import Toolbox, register_toolbox, tool_from_callable


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def echo(text: str, repeat: int = 1, suffix: str | None = None) -> str:
    """Repeat a text.

    Args:
        text: The text to repeat.
        repeat: How many times to repeat it.
        suffix: Text appended once at the end.
    """
    return text * repeat + (suffix or "")


def divide(a: float, b: float) -> float:
    """Divide a by b (raises ZeroDivisionError when b is 0).

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def sleep(seconds: float) -> float:
    """Sleep, then return the seconds slept.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return seconds


def spin() -> int:
    """Loop forever on the CPU (never returns)."""
    n = 0
    while True:
        n += 1


def segfault() -> None:
    """Kill the worker with SIGSEGV."""
    os.kill(os.getpid(), signal.SIGSEGV)


def read_null() -> str:
    """Dereference a null pointer (a real segmentation fault)."""
    return ctypes.string_at(0).decode()


def hard_exit(code: int = 3) -> None:
    """Exit the worker process abruptly, skipping all cleanup.

    Args:
        code: The exit status.
    """
    os._exit(code)


def allocate(megabytes: int) -> int:
    """Allocate a block of memory and return its size in bytes.

    Args:
        megabytes: How many MiB to allocate.
    """
    return len(bytearray(megabytes * 1024 * 1024))


def big_output(size: int) -> str:
    """Return a string of `size` characters.

    Args:
        size: The number of characters.
    """
    return "x" * size


def not_json() -> object:
    """Return a value that JSON cannot encode."""
    return {1, 2, 3}


def lucky_number() -> int:
    """Draw a random integer in [0, 1e9) from the `random` module."""
    return random.randrange(10**9)


def connect(host: str, port: int) -> str:
    """Open a TCP connection (the sandbox must refuse it).

    Args:
        host: Host name or address.
        port: TCP port.
    """
    import socket

    with socket.create_connection((host, port), timeout=2):
        return "connected"


def network_interfaces() -> list:
    """Names of the network interfaces this process can see (its network namespace)."""
    with open("/proc/self/net/dev") as f:
        return sorted(line.split(":")[0].strip() for line in f.readlines()[2:])


def raw_connect(host: str, port: int) -> str:
    """Open a TCP connection through the C-level `_socket` module, past Python-level guards.

    Args:
        host: IPv4 address.
        port: TCP port.
    """
    import _socket

    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        s.settimeout(2)
        s.connect((host, port))
        return "connected"
    finally:
        s.close()


def spawn_and_hang(seconds: float, detach: bool = False) -> None:
    """Start a child process `sleep <seconds>`, then hang.

    Args:
        seconds: The child's sleep (a distinctive value lets a test find it).
        detach: Start the child in a new session, out of the worker's process group.
    """
    import subprocess

    subprocess.Popen(["sleep", str(seconds)], start_new_session=detach)
    time.sleep(60)


def warn(text: str) -> int:
    """Write a text to stderr (the sandbox must swallow it) and return its length.

    Args:
        text: The text to write.
    """
    print(text, file=sys.stderr, flush=True)
    return len(text)


def whoami() -> int:
    """Return the worker's process id as the engine sees it (to check that workers are reused)."""
    from dataengine.tools.worker import host_pid

    return host_pid()


def nap(seconds: float) -> int:
    """Sleep, then return the worker's process id (to see which worker ran a call).

    Args:
        seconds: How long to sleep.
    """
    from dataengine.tools.worker import host_pid

    time.sleep(seconds)
    return host_pid()


def imported(module: str) -> bool:
    """Whether a module is imported in the worker.

    Args:
        module: The module's full name.
    """
    return module in sys.modules


def shout(text: str) -> int:
    """Print a text to stdout (the sandbox must swallow it) and return its length.

    Args:
        text: The text to print.
    """
    print(text, flush=True)
    os.write(1, text.encode())
    return len(text)


def push(state: dict, item: str) -> list:
    """Append an item to the list kept in the tool state.

    Args:
        state: The tool state (injected, hidden from the model).
        item: The item to append.
    """
    state.setdefault("items", []).append(item)
    return list(state["items"])


def pop(state: dict) -> str:
    """Remove and return the last item of the list kept in the tool state."""
    items = state.get("items") or []
    if not items:
        raise IndexError("pop from an empty list")
    return items.pop()


def count(state: dict) -> int:
    """Count the items in the tool state (read-only; it also scribbles on its copy, which
    the sandbox must discard)."""
    n = len(state.get("items") or [])
    state["scribble"] = True
    return n


def push_then_fail(state: dict, item: str) -> None:
    """Append an item, then raise (the state change must not survive).

    Args:
        state: The tool state (injected, hidden from the model).
        item: The item to append.
    """
    state.setdefault("items", []).append(item)
    raise RuntimeError("failed after changing the state")


# ----------------------------------------------------------------- hostile tools


def hog_children(children: int, megabytes: int, seconds: float) -> int:
    """Fork children that each hold `megabytes` MiB for `seconds`, wait for them, return the total.

    Args:
        children: How many child processes.
        megabytes: MiB each child allocates and touches.
        seconds: How long each child holds its memory.
    """
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            block = bytearray(megabytes * 1024 * 1024)
            block[::4096] = b"\x01" * len(range(0, len(block), 4096))
            time.sleep(seconds)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return children * megabytes


def fill_file(path: str, megabytes: int) -> int:
    """Write `megabytes` MiB to a file, 1 MiB at a time; return the MiB written.

    Args:
        path: The file to write.
        megabytes: How many MiB.
    """
    chunk = b"\x00" * (1024 * 1024)
    with open(path, "wb") as f:
        f.writelines(chunk for _ in range(megabytes))
    return megabytes


def read_file(path: str) -> str:
    """Return the first 200 characters of a file.

    Args:
        path: The file to read.
    """
    with open(path) as f:
        return f.read(200)


def write_file(path: str, text: str) -> str:
    """Write a text to a file; return the file's absolute path.

    Args:
        path: The file to write.
        text: The text.
    """
    with open(path, "w") as f:
        f.write(text)
    return os.path.abspath(path)


def spin_thread() -> str:
    """Start a thread that burns CPU forever, then return at once."""
    import threading

    def burn() -> None:
        while True:
            pass

    threading.Thread(target=burn, daemon=True).start()
    return "started"


def tamper_limits() -> str:
    """Lift the address-space limit and make resource.setrlimit a no-op (for later calls)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    resource.setrlimit = lambda *args: None
    return "tampered"


def tamper_json() -> str:
    """Replace json.dumps, so that later calls (if they ran here) would return the wrong output."""
    import json

    json.dumps = lambda *args, **kwargs: '"tampered"'
    return "tampered"


def spawn_detached(seconds: float) -> str:
    """Start `sleep <seconds>` in a new session (out of the worker's process group) and return.

    Args:
        seconds: The child's sleep (a distinctive value lets a test find it).
    """
    import subprocess

    subprocess.Popen(["sleep", str(seconds)], start_new_session=True)
    return "spawned"


def fork_and_segfault() -> None:
    """Fork a child that keeps the worker's pipe open and sleeps, then die with SIGSEGV."""
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
    os.kill(os.getpid(), signal.SIGSEGV)


def remount_writable(path: str) -> list:
    """Try to make a read-only mount writable: directly, then from fresh user + mount
    namespaces (where a process has every capability again). Returns the errors.

    Args:
        path: The mount point, e.g. "/usr".
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    remount_bind = 32 | 4096  # MS_REMOUNT | MS_BIND, without MS_RDONLY

    def attempt() -> str:
        if libc.mount(None, path.encode(), None, remount_bind, None) == 0:
            return "remounted"
        return os.strerror(ctypes.get_errno())

    errors = [attempt()]
    if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
        return [*errors, "unshare: " + os.strerror(ctypes.get_errno())]
    errors.append(attempt())
    if libc.umount2(path.encode(), 2) == 0:  # MNT_DETACH: would reveal what is below
        errors.append("unmounted")
    else:
        errors.append(os.strerror(ctypes.get_errno()))
    return errors


class _RunsCommand:
    """Unpickling this runs a shell command (what a malicious pickle does)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return os.system, (self.command,)


def forge_pipe_message(path: str) -> int:
    """Write a pickle that runs `touch <path>` when unpickled into every socket this process
    holds (the worker's pipe to the engine is one); return how many were written to.

    Args:
        path: The file the command would create.
    """
    import pickle
    import stat
    import struct

    data = pickle.dumps(_RunsCommand(f"touch {path}"))
    frame = struct.pack("!i", len(data)) + data
    written = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                os.write(int(name), frame)
                written += 1
        except OSError:
            pass
    return written


def getenv(variable: str) -> str | None:
    """Return an environment variable of the worker (None when unset).

    Args:
        variable: The variable's name.
    """
    return os.environ.get(variable)


def signal_pid(pid: int, sig: int) -> str:
    """Send a signal to a process id (0 only checks that it may be signalled).

    Args:
        pid: The process id.
        sig: The signal number.
    """
    os.kill(pid, sig)
    return "sent"


TOOLS = [
    add, echo, divide, sleep, spin, segfault, read_null, hard_exit, allocate, big_output,
    not_json, lucky_number, connect, network_interfaces, raw_connect, spawn_and_hang, warn, whoami, nap, imported, shout, push, pop, push_then_fail,
    hog_children, fill_file, read_file, write_file, spin_thread, tamper_limits, tamper_json, spawn_detached,
    fork_and_segfault, getenv, signal_pid, remount_writable, forge_pipe_message,
]

TOOLBOX = register_toolbox(
    Toolbox(
        name="testing",
        tools={t.name: t for t in [*map(tool_from_callable, TOOLS), tool_from_callable(count, writes_state=False)]},
        make_initial_state=lambda task: {"items": []},
    )
)
