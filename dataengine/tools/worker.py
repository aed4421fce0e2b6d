"""The child side of the sandbox: the processes that run tool calls (started by dataengine.tools.pool).

With namespaces (the default, where the kernel allows them) a worker is three processes:
- the worker process (W), started by the pool through multiprocessing: it leads its own
  session, moves into new user, mount, network, IPC and PID namespaces, builds the private
  read-only file-system view (dataengine.tools.isolation), forks the namespace's init, and
  exits with the runner's exit status (so a runner killed by SIGSEGV shows as W killed by it);
- init (C), pid 1 of the new PID namespace: reaps orphans and reports the runner's status;
  when it exits, the kernel kills every process left in the namespace;
- the runner (R), pid 2: serves calls over the pipe, in /tmp (its scratch folder), with no
  capabilities. It is not pid 1 because pid 1 ignores signals it sends itself.
Without namespaces (kernel refuses, or Sandbox(namespaces=False)) W is the runner, a child
subreaper in a private scratch folder on the host file system.

Calls share nothing: the runner is a template that imports the toolboxes and never runs a call;
each call runs in a process forked from it (`_call_in_child`), so a call starts from the state
a fresh worker has and whatever it patches, caches or changes dies with its process. That
process still checks that the call left nothing behind (threads, processes, patched modules,
changed limits or signal handlers, namespaces); if it did, the result says so and the pool
replaces the worker. Files in the scratch folder (and the private /dev/shm) are wiped.
"""

from __future__ import annotations

import _signal
import builtins
import contextlib
import gc
import importlib
import json
import math
import os
import pickle
import random
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import zlib
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from dataengine.tools import isolation
from dataengine.types import ToolStatus

# A call message this large (mostly tool state) makes the runner tell the pool its new size.
LARGE_MESSAGE_BYTES = 1 << 20
# Characters of traceback kept in an "exception" message.
TRACEBACK_CHARS = 600
# Environment variables whose names contain one of these are not passed to tools.
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")
# Modules whose top-level attributes a call must leave as it found them.
WATCHED_MODULES = (builtins, os, sys, json, random, resource, signal, subprocess, threading, time)
WATCHED_SIGNALS = (signal.SIGXCPU, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGALRM)
WATCHED_LIMITS = (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE,
                  resource.RLIMIT_STACK)
NAMESPACE_LINKS = tuple(f"/proc/self/{n}" for n in ("root", "ns/user", "ns/mnt", "ns/net", "ns/ipc", "ns/uts",
                                                     "ns/pid_for_children", "ns/cgroup"))
# The worker's own references, so a tool that patches the modules cannot change how this call ends.
_setrlimit, _getrlimit, _dumps, _perf_counter = resource.setrlimit, resource.getrlimit, json.dumps, time.perf_counter
_dup2, _listdir, _chdir, _readlink = os.dup2, os.listdir, os.chdir, os.readlink
_getsignal = _signal.getsignal  # the C function: signal.getsignal wraps it in slow enum lookups


@dataclass(frozen=True)
class Limits:
    """Per-call limits, sent to every worker.

    timeout_s: wall-clock seconds per call, enforced by the parent (kill and replace).
    memory_mb: MiB a call may use above the worker's baseline: per process (RLIMIT_AS) and
        for the worker and every process it starts together (cgroup or the pool's watchdog).
    cpu_s: CPU seconds per call (RLIMIT_CPU, whole seconds, rounded up).
    max_output_bytes: largest JSON encoding of a tool's output that is returned.
    scratch_mb: size of the tmpfs behind /tmp and /dev/shm (with namespaces), and the largest
        file any process of the worker may write (RLIMIT_FSIZE, always).
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    cpu_s: float = 10.0
    max_output_bytes: int = 65536
    scratch_mb: int = 64


@dataclass(frozen=True)
class Setup:
    """How to start one worker (sent by the pool).

    scratch: an empty host folder: the private root's mount point (namespaces) or the
        runner's working folder (no namespaces). The pool removes it with the worker.
    read_paths: the folders and files tools may read (read_only_view(); namespaces only:
        without them tools see the whole file system).
    cgroup: a cgroup v2 folder the worker moves into at start (the pool sets its memory.max).
    fork_calls: run each call in a process forked from the runner (`_call_in_child`); False
        runs calls in the runner itself (the reused worker of earlier versions, for benchmarks).
    """

    limits: Limits
    preload: tuple[str, ...]
    modules: tuple[str, ...]
    scratch: str
    read_paths: tuple[str, ...] = ()
    namespaces: bool = True
    cgroup: str | None = None
    fork_calls: bool = True


class CpuLimitExceeded(BaseException):
    """Raised in a worker on SIGXCPU; a BaseException so tools' `except Exception` miss it."""


_in_call = [False]
_IMPORT_ERRORS: list[str] = []
_HOST_PID = [0]  # set in the runner when it lives in its own PID namespace
_RUNNER_PID = [0]  # the runner's own pid, set before it forks calls
_FDS = {"devnull": -1, "stderr": -1}


class NamespaceSetupFailed(Exception):
    """Namespaces were entered but the view could not be built: this worker cannot run tools."""


def host_pid() -> int:
    """The runner's process id as the engine sees it (tools see a namespace-local one); a
    call's forked process gives its runner's."""
    return _HOST_PID[0] or _RUNNER_PID[0] or os.getpid()


def _on_sigxcpu(signum: int, frame: Any) -> None:
    if _in_call[0]:
        raise CpuLimitExceeded()


# --------------------------------------------------------------------- process setup


def main(conn: Connection, setup: Setup) -> None:
    """Entry point of the worker process W (multiprocessing target)."""
    try:
        os.setsid()  # own process group: a kill reaches the processes a tool started too
    except OSError:
        pass
    if setup.cgroup:
        with open(os.path.join(setup.cgroup, "cgroup.procs"), "w") as f:
            f.write("0")  # before any fork: every process of this worker is charged there
    # Tool prints must not reach the engine's stdout (stderr is silenced during calls only,
    # so a worker that fails to start still says why).
    _FDS["devnull"] = os.open(os.devnull, os.O_RDWR)
    _FDS["stderr"] = os.dup(2)
    os.dup2(_FDS["devnull"], 0)
    os.dup2(_FDS["devnull"], 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Relative sys.path entries ('' is the start folder) must survive the move to the scratch folder.
    sys.path[:] = [os.path.abspath(p) for p in sys.path]
    info: dict[str, Any] = {"namespaces": False, "reason": "disabled (Sandbox(namespaces=False))"}
    if setup.namespaces:
        try:
            # Kept to remove the (empty) mount point from the host once the worker is done.
            _FDS["scratch_parent"] = os.open(os.path.dirname(setup.scratch), os.O_RDONLY | os.O_DIRECTORY)
            _enter_namespaces(setup)
            info = {"namespaces": True, "reason": ""}
        except NamespaceSetupFailed as exc:
            _send(conn, "no_namespaces", 0, str(exc))
            os._exit(0)
        except OSError as exc:  # the kernel refused the namespaces: nothing was changed
            info["reason"] = str(exc)
    if not info["namespaces"]:
        _isolate_network()
        try:
            _serve(conn, setup, setup.scratch, info)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the engine is gone
        shutil.rmtree(setup.scratch, ignore_errors=True)  # the pool does it too, unless it was killed
        os._exit(0)
    status_r, status_w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_r)
        os.close(_FDS["scratch_parent"])
        _init(conn, setup, status_w, info)
    os.close(status_w)
    conn.close()
    _mirror(init, status_r, os.path.basename(setup.scratch))


def read_only_view(extra: tuple[str, ...] | list[str] = ()) -> tuple[str, ...]:
    """What a worker shows read-only (real paths, none inside another): the system folders,
    the Python installation, every sys.path folder, the folders of the imported top-level
    packages (editable installs load submodules from there, not through sys.path) and `extra`.
    Computed once by the pool: workers get the parent's sys.path."""
    paths = [*map(os.path.abspath, sys.path), sys.prefix, sys.base_prefix, sys.exec_prefix, *extra]
    for name, module in list(sys.modules.items()):
        if "." not in name:
            paths.extend(f for f in getattr(module, "__path__", None) or [] if isinstance(f, str))
    return tuple(isolation.view_paths(paths))


def _enter_namespaces(setup: Setup) -> None:
    """In W: new namespaces (children go to the new PID namespace) and the private root."""
    paths = [p for p in setup.read_paths if not setup.scratch.startswith(p.rstrip("/") + "/")]
    uid, gid = os.geteuid(), os.getegid()
    isolation.unshare(isolation.CLONE_NEWUSER | isolation.CLONE_NEWNS | isolation.CLONE_NEWNET
                      | isolation.CLONE_NEWIPC | isolation.CLONE_NEWPID)
    try:
        isolation.map_ids(uid, gid)
        isolation.build_view(setup.scratch, paths, setup.limits.scratch_mb)
    except OSError as exc:
        raise NamespaceSetupFailed(f"could not build the private file-system view: {exc}") from exc


def _init(conn: Connection, setup: Setup, status_w: int, info: dict[str, Any]) -> None:
    """C: pid 1 of the namespace. Forks the runner, reaps everything, reports the runner's status."""
    try:
        isolation.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL)
        runner = os.fork()
        if runner == 0:
            os.close(status_w)
            _runner(conn, setup, info)
        conn.close()
        isolation.prctl(isolation.PR_SET_DUMPABLE, 0)  # the runner cannot ptrace or read us
        isolation.drop_capabilities()
        while True:
            pid, status = os.wait()
            if pid == runner:
                os.write(status_w, str(status).encode())
                break
    except BaseException:
        traceback.print_exc()
    os._exit(0)  # the kernel now kills every process left in the namespace


def _runner(conn: Connection, setup: Setup, info: dict[str, Any]) -> None:
    try:
        _HOST_PID[0] = isolation.host_pid()
        isolation.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            isolation.finish_view()
        except OSError as exc:
            _send(conn, "no_namespaces", 0, f"could not mount /proc for the PID namespace: {exc}")
            os._exit(0)
        _isolate_network()
        _serve(conn, setup, "/tmp", info)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the engine is gone
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def _mirror(init: int, status_r: int, scratch_name: str) -> None:
    """W: wait for init, remove the mount point, then exit the way the runner did."""
    os.waitpid(init, 0)
    try:
        os.rmdir(scratch_name, dir_fd=_FDS["scratch_parent"])
    except OSError:
        pass
    text = os.read(status_r, 64)
    status = int(text) if text else 0
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if text else 1)


def _isolate_network() -> None:
    """Python-level guard: the socket constructors refuse IPv4/IPv6 (the network namespace,
    where there is one, has no interface but a down loopback anyway)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError("network access is disabled inside the tool sandbox")

    class NoNetworkSocket(socket.socket):
        def __init__(self, family: int = -1, type: int = -1, proto: int = -1, fileno: Any = None):
            if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
                refuse()
            super().__init__(family, type, proto, fileno)

    socket.socket = NoNetworkSocket  # type: ignore[misc]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.getaddrinfo = refuse  # type: ignore[assignment]


def _clean_environment(scratch: str) -> None:
    """Drop secret-looking variables (by name; a heuristic) and point HOME and TMPDIR at scratch."""
    for name in list(os.environ):
        parts = name.upper().split("_")
        if any(part.endswith(word) for part in parts for word in SECRET_WORDS):
            del os.environ[name]
    os.environ.update(HOME=scratch, TMPDIR=scratch, PWD=scratch)
    import tempfile

    tempfile.tempdir = scratch


# --------------------------------------------------------------------- serving calls


def _serve(conn: Connection, setup: Setup, scratch: str, info: dict[str, Any]) -> None:
    import jsonschema  # noqa: F401  (imported before the fingerprint: argument checks use it)

    from dataengine.tools.registry import get_toolbox

    os.chdir(scratch)
    _clean_environment(scratch)
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails with EFBIG instead
    file_limit = setup.limits.scratch_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
    try:
        isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)  # orphans stay our children
        isolation.drop_capabilities()
    except OSError:
        pass
    from dataengine.tools.registry import load_tools

    for module in setup.modules:  # a module name or a .py file (registry.load_tools)
        try:
            load_tools([module])
        except Exception as exc:
            _IMPORT_ERRORS.append(f"module {module!r} failed to import: {_describe(exc)}")
    loaded: set[str] = set()
    validators: dict[tuple[str, str], Any] = {}
    preload_errors: dict[str, str] = {}
    for name in setup.preload:
        try:
            get_toolbox(name)
            loaded.add(name)
        except Exception as exc:  # the pool refuses to run calls on a worker that lacks its toolboxes
            preload_errors[name] = "; ".join([_describe(exc), *_IMPORT_ERRORS])
    info = {**info, "capabilities": isolation.effective_capabilities(), "pss": _own_pss(),
            "preload_errors": preload_errors}
    keep = _kept(scratch, setup.read_paths)  # empty unless the view shows code under /tmp
    _RUNNER_PID[0] = os.getpid()
    if setup.fork_calls:
        for name in loaded or {""}:
            _warm_validators(name, validators)
        gc.freeze()  # the collector would otherwise touch (and copy) every shared page in each call
    clean = _fingerprint(copy=True)
    _send(conn, "ready", 0, host_pid(), info)
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        msg = pickle.loads(raw)  # from the pool: trusted; the call's fields stay pickled in msg[3]
        if msg is None:
            return
        _, seq, toolbox, body = msg
        del raw
        if toolbox not in loaded:
            loaded.add(toolbox)
            _send(conn, "loading", seq)
            try:
                get_toolbox(toolbox)
            except Exception:
                pass  # _execute reports it
            if setup.fork_calls:
                _warm_validators(toolbox, validators)
            clean = _fingerprint(copy=True)  # what the import set up is the new normal
            _send(conn, "loaded", seq)  # the pool re-reads our size: the state does not count
        elif len(body) > LARGE_MESSAGE_BYTES:
            _send(conn, "started", seq)  # a large state now in memory: the pool re-reads our size
        if setup.fork_calls:
            _call_in_child(conn, seq, toolbox, body, setup, validators)
        else:
            _call(conn, seq, toolbox, body, setup, clean, validators)
        del msg, body
        _wipe(scratch, keep)


def _call(conn: Connection, seq: int, toolbox: str, body: bytes, setup: Setup, clean: dict[str, Any],
          validators: dict) -> None:
    """Run one call (body: the pickled (tool name, arguments, state)) here and send its result."""
    name, arguments, state = pickle.loads(body)
    result = _execute(toolbox, name, arguments, state, setup.limits, validators)
    status, output_json, error, state_json, seconds = result
    out, new_state = (output_json or "").encode(), (state_json or "").encode()
    _send(conn, "result", seq, status, error, seconds, _left_behind(clean),
          len(out) if output_json is not None else -1, len(new_state) if state_json is not None else -1,
          payload=out + new_state)


def _call_in_child(conn: Connection, seq: int, toolbox: str, body: bytes, setup: Setup, validators: dict) -> None:
    """Fork the call's process from this template, which never runs a call itself, so every
    call starts from the state a fresh worker has and nothing a call changes reaches another.

    The child reports its result straight to the pool, then one byte on a private pipe; a
    child that dies without that byte (a signal, os._exit) ends this worker the same way, so
    the pool sees the death it would have seen had the call run here.
    """
    _reap_exited()
    done_r, done_w = os.pipe()
    child = os.fork()
    if child == 0:
        code = 0
        try:
            os.close(done_r)
            with contextlib.suppress(OSError):
                isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)  # the call's orphans are seen by its check
            # Fork itself resets parts of `threading`: the child's own starting point is the clean one.
            _call(conn, seq, toolbox, body, setup, _fingerprint(copy=True), validators)
            os.write(done_w, b"1")
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(done_w)
    try:
        # Wait for the byte or the child's end, whichever comes first: a process the call
        # started may hold the pipe open, and an exiting child need not be waited for.
        pidfd = os.pidfd_open(child)
    except (AttributeError, OSError):
        pidfd = -1
    try:
        if pidfd >= 0:
            select.select([done_r, pidfd], [], [])
        os.set_blocking(done_r, False)
        try:
            done = os.read(done_r, 1) == b"1"
        except BlockingIOError:
            done = False
        if done:
            _EXITING.append(child)  # tearing down its memory takes longer than its call: reaped later
            return
        _, status = os.waitpid(child, 0)
        with contextlib.suppress(BlockingIOError):
            done = os.read(done_r, 1) == b"1"
    finally:
        os.close(done_r)
        if pidfd >= 0:
            os.close(pidfd)
    if done and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) or 1)


_EXITING: list[int] = []  # call processes that reported their result and are still exiting


def _reap_exited() -> None:
    for pid in list(_EXITING):
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue
        except ChildProcessError:
            pass
        _EXITING.remove(pid)


def _warm_validators(toolbox_name: str, validators: dict) -> None:
    """Build the argument validators of a toolbox's tools once, in the template, and import
    what a call would otherwise import each time in its fresh process."""
    import jsonschema

    from dataengine.tools.registry import get_toolbox

    if "numpy" in sys.modules:
        importlib.import_module("numpy.random")  # lazy in numpy: each call would import it again (~50 ms)
    try:
        toolbox = get_toolbox(toolbox_name)
    except Exception:
        return
    for tool in toolbox.tools.values():
        schema = _standard_schema(tool.spec.parameters or {"type": "object", "properties": {}})
        with contextlib.suppress(Exception):
            validators[(toolbox_name, tool.name)] = jsonschema.validators.validator_for(schema)(schema)


def _own_pss() -> int:
    """This process's proportional set size in bytes (resident size where smaps_rollup is missing)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _send(conn: Connection, kind: str, seq: int, *fields: Any, payload: bytes = b"") -> None:
    """One frame to the pool: a JSON header line, then the raw payload. Never pickle: the pool
    must not unpickle what a tool could have written to this pipe."""
    conn.send_bytes(_dumps([kind, seq, *fields]).encode() + b"\n" + payload)


def _fingerprint(copy: bool) -> dict[str, Any]:
    """What a call must leave as it found it. copy=False gives live objects to compare
    against a copy=True snapshot (dict equality runs at C speed: about 20 microseconds)."""
    environ = getattr(os.environ, "_data", os.environ)
    return {
        "modules": [dict(vars(m)) if copy else vars(m) for m in WATCHED_MODULES],
        "sys.modules": [sys.modules.get(m.__name__) for m in WATCHED_MODULES],
        "environment": dict(environ) if copy else environ,
        "sys.path": list(sys.path),
        "signal handlers": [_getsignal(s) for s in WATCHED_SIGNALS],
        "resource limits": [_getrlimit(r) for r in WATCHED_LIMITS],
        "threads": [threading.active_count(), len(sys._current_frames())],
        "interpreter settings": [sys.gettrace(), sys.getprofile(), sys.getrecursionlimit()],
        "namespaces or ids": _identity(),
    }


def _identity() -> list[Any]:
    """Namespaces, root folder and user/group ids of this process (a tool may unshare or chroot)."""
    try:
        return [*map(_readlink, NAMESPACE_LINKS), os.getresuid(), os.getresgid()]
    except OSError as exc:
        return [repr(exc)]


def _left_behind(clean: dict[str, Any]) -> str | None:
    """Why this worker must not serve another call, or None when the call left it clean."""
    now = _fingerprint(copy=False)
    if now["threads"] != clean["threads"]:
        return "the call left a thread running"
    try:
        if os.waitpid(-1, os.WNOHANG) is not None:  # subreaper: orphans count too
            return "the call left a process behind"
    except ChildProcessError:
        pass
    if signal.alarm(0) or any(signal.getitimer(t)[0] for t in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL,
                                                              signal.ITIMER_PROF)):
        return "the call left a timer set"
    for key, value in clean.items():
        if now[key] != value:
            if key == "modules":
                names = [m.__name__ for m, a, b in zip(WATCHED_MODULES, value, now[key]) if a != b]
                return f"the call changed module(s) {', '.join(names)}"
            return f"the call changed the worker's {key}"
    return None


def _wipe(scratch: str, keep: frozenset[str] = frozenset()) -> None:
    """Empty the scratch folder (and the private /dev/shm) between calls; reset the cwd.
    `keep`: read-only view paths under the scratch folder and their parents (left in place)."""
    _chdir(scratch)
    for folder in [scratch, "/dev/shm"] if _HOST_PID[0] else [scratch]:
        _empty(folder, keep)


def _empty(folder: str, keep: frozenset[str]) -> None:
    try:
        if not _listdir(folder):
            return
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        with contextlib.suppress(OSError):  # best effort: the worker is replaced if it misbehaves
            if entry.path in keep:
                if entry.is_dir(follow_symlinks=False) and not os.path.ismount(entry.path):
                    _empty(entry.path, keep)  # a parent of a view path: wipe what a tool added
            elif entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)


def _kept(scratch: str, read_paths: tuple[str, ...] | list[str]) -> frozenset[str]:
    """The read paths under `scratch` and every folder between them and it."""
    keep: set[str] = set()
    for path in read_paths:
        while path.startswith(scratch.rstrip("/") + "/"):
            keep.add(path)
            path = os.path.dirname(path)
    return frozenset(keep)


def _execute(
    toolbox_name: str, name: str, arguments: dict, state: dict | None, limits: Limits,
    validators: dict,
) -> tuple[ToolStatus, str | None, str | None, str | None, float]:
    """Run one call in the worker: (status, output JSON, error, new state JSON, seconds)."""
    from dataengine.tools.registry import get_toolbox

    try:
        toolbox = get_toolbox(toolbox_name)
    except KeyError as exc:
        message = "; ".join([str(exc.args[0] if exc.args else exc), *_IMPORT_ERRORS])
        return "unknown_tool", None, message, None, 0.0
    except Exception as exc:
        return "exception", None, f"could not load toolbox {toolbox_name!r}: {_describe(exc)}", None, 0.0
    tool = toolbox.tools.get(name)
    if tool is None:
        known = ", ".join(sorted(toolbox.tools)) or "(none)"
        return "unknown_tool", None, f"unknown tool {name!r} in toolbox {toolbox_name!r}; known tools: {known}", None, 0.0
    problem = _argument_problem(tool, arguments, validators, toolbox_name)
    if problem:
        return "bad_arguments", None, problem, None, 0.0

    if tool.stateful and state is None:
        state = {}
    # Tools that draw from `random` (or numpy's global generator) give the same draw for the same call.
    seed = _dumps([toolbox_name, name, arguments], sort_keys=True, default=str)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(zlib.crc32(seed.encode()))
    soft_as, hard_as = _getrlimit(resource.RLIMIT_AS)
    soft_cpu, hard_cpu = _getrlimit(resource.RLIMIT_CPU)
    status: ToolStatus = "ok"
    output_json = error = state_json = None
    start = _perf_counter()
    try:
        _set_limits(limits, hard_as, hard_cpu)
        _in_call[0] = True
        if _FDS["devnull"] >= 0:
            _dup2(_FDS["devnull"], 2)
        try:
            out = tool.fn(state, **arguments) if tool.stateful else tool.fn(**arguments)
            output_json = _to_json(out, "output")
            if tool.stateful and tool.writes_state:
                # ASCII escapes: about 30% faster to encode for multi-MB states (tau2 databases).
                state_json = _to_json(state, "state", ascii_only=True)
        finally:
            _in_call[0] = False
            if _FDS["stderr"] >= 0:
                sys.stderr.flush()
                _dup2(_FDS["stderr"], 2)
            _setrlimit(resource.RLIMIT_AS, (soft_as, hard_as))
            _setrlimit(resource.RLIMIT_CPU, (soft_cpu, hard_cpu))
    except CpuLimitExceeded:
        status, error = "timeout", f"the tool used more than {limits.cpu_s:g} s of CPU time"
    except MemoryError:
        status, error = "memory", f"the tool needed more than {limits.memory_mb} MiB of memory"
    except _NotJSON as exc:
        status, error = "exception", str(exc)
    except BaseException as exc:  # SystemExit and friends from a tool must not stop the worker
        status, error = "exception", _describe(exc)
    seconds = _perf_counter() - start
    if status == "ok" and len(output_json.encode()) > limits.max_output_bytes:  # type: ignore[union-attr]
        size = len(output_json.encode())  # type: ignore[union-attr]
        return ("output_too_large", None,
                f"the tool's output is {size} bytes of JSON, over the limit of {limits.max_output_bytes}",
                None, seconds)
    if status != "ok":
        output_json = state_json = None
    return status, output_json, error, state_json, seconds


def _set_limits(limits: Limits, hard_as: int, hard_cpu: int) -> None:
    # Relative to what the worker already uses, so imports and the tool state do not count.
    with open("/proc/self/statm") as f:
        vm_bytes = int(f.read().split()[0]) * resource.getpagesize()
    new_as = vm_bytes + limits.memory_mb * 1024 * 1024
    if hard_as != resource.RLIM_INFINITY:
        new_as = min(new_as, hard_as)
    _setrlimit(resource.RLIMIT_AS, (new_as, hard_as))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    new_cpu = math.ceil(usage.ru_utime + usage.ru_stime + limits.cpu_s)
    if hard_cpu != resource.RLIM_INFINITY:
        new_cpu = min(new_cpu, hard_cpu)
    _setrlimit(resource.RLIMIT_CPU, (new_cpu, hard_cpu))


class _NotJSON(Exception):
    """A tool returned (or left as state) a value JSON cannot encode."""


def _to_json(value: Any, what: str, ascii_only: bool = False) -> str:
    try:
        return _dumps(value, ensure_ascii=ascii_only)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _NotJSON(f"the tool's {what} is not JSON-serialisable: {exc}") from None


def _argument_problem(tool: Any, arguments: dict, validators: dict, toolbox_name: str) -> str | None:
    import jsonschema

    schema = tool.spec.parameters or {"type": "object", "properties": {}}
    properties = schema.get("properties") or {}
    unexpected = sorted(set(arguments) - set(properties))
    if unexpected and not _takes_var_keywords(tool.fn):
        expected = ", ".join(properties) or "none"
        return f"unexpected argument {unexpected[0]!r} for tool {tool.name!r}; expected arguments: {expected}"
    key = (toolbox_name, tool.name)
    if key not in validators:
        schema = _standard_schema(schema)
        validators[key] = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validators[key].iter_errors(arguments))
    if error is None:
        return None
    if error.validator == "required":
        return f"missing required argument for tool {tool.name!r}: {error.message}"
    field = ".".join(str(p) for p in error.absolute_path) or "(arguments)"
    return f"argument {field!r} of tool {tool.name!r}: {error.message}"


def _standard_schema(node: Any) -> Any:
    """Rewrite OpenAPI `"nullable": true` (what transformers emits for `X | None`) as JSON
    Schema, which jsonschema understands: the type list and any enum also allow null."""
    if isinstance(node, list):
        return [_standard_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _standard_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        kind = out.get("type")
        if isinstance(kind, str):
            out["type"] = [kind, "null"]
        elif isinstance(kind, list) and "null" not in kind:
            out["type"] = [*kind, "null"]
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    return out


def _takes_var_keywords(fn: Any) -> bool:
    import inspect

    try:
        return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False


def _describe(exc: BaseException) -> str:
    """`Type: message` plus the last frames of the traceback, trimmed."""
    head = f"{type(exc).__name__}: {exc}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__][-2:]
    tail = "; ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in frames)
    text = f"{head} (at {tail})" if tail else head
    return text[:TRACEBACK_CHARS]
