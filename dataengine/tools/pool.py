"""Sandboxed tool execution, parent side: a pool of reusable worker processes with limits.

Each worker is started through a multiprocessing "forkserver" context (the parent may hold
torch threads, so it never forks itself) and runs dataengine.tools.worker. Where the kernel
allows it, a worker lives in its own user, mount, network, IPC and PID namespaces with a
private read-only view of the file system and a size-limited scratch tmpfs (see
dataengine.tools.worker and docs/tools.md for exactly what is enforced).

This side enforces the wall-clock timeout, the memory limit of a worker's whole process group
(a cgroup v2 memory.max where one is usable, else a watchdog summing the group's proportional
set size), notices a worker that died (waiting on its process, not on its pipe), and replaces
workers that time out, crash, run out of memory or were left dirty by a call.

Every outcome is a ToolResult; no tool can hang or kill the engine.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
import typing
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any

import psutil

from dataengine.tools.isolation import descendants, process_tree
from dataengine.tools.worker import Limits, Setup, read_only_view
from dataengine.types import ToolCall, ToolResult, ToolStatus


class ToolboxLoadError(RuntimeError):
    """A sandbox worker could not import a toolbox it was asked to preload."""


# Seconds a worker may take to start (interpreter, imports, preloaded toolboxes).
STARTUP_TIMEOUT_S = 120.0
# Seconds a worker may take to import a toolbox on first use, on top of the call's timeout.
LOAD_TIMEOUT_S = 120.0
# A pool that cannot start this many workers in a row is broken: raise instead of looping.
MAX_START_FAILURES = 3
# How often the memory watchdog samples a busy worker's process group (first after this long);
# never more often than WATCH_COST_RATIO times the last sample's cost, so it stays cheap on
# hosts with many processes.
WATCH_INTERVAL_S = 0.05
WATCH_COST_RATIO = 20
# Seconds between refreshes of a worker's idle memory (its baseline grows with tool states).
BASELINE_REFRESH_S = 1.0
MIB = 1024 * 1024
# Largest frame read from a worker (a result with its tool state); larger ones kill the worker.
MAX_MESSAGE_BYTES = 512 * MIB
# Messages a worker sends about the call it is running (the others come before its first call).
_CALL_MESSAGES = ("loading", "loaded", "started", "result")
_STATUSES = set(typing.get_args(ToolStatus))

CallItem = tuple[str, ToolCall, "dict[str, Any] | None"]

# Why namespaces failed in this process once (then later workers start without them at once).
_NAMESPACES_BROKEN: list[str] = []


class Sandbox:
    """A pool of worker processes that execute tool calls under limits.

    Usage::

        with Sandbox(workers=2) as sandbox:
            result, state = sandbox.call("arithmetic", ToolCall(name="add", arguments={...}))

    preload: toolbox names every worker resolves at start, so no call pays for the import.
    modules: modules or .py files every worker imports at start (registry.load_tools), for
        toolboxes not listed in registry.TOOLBOX_MODULES (the caller's own suites); the tools
        entries this process loaded with registry.load_tools are added, and .py files are
        added to read_paths.
    scratch_mb: size of each worker's scratch tmpfs (/tmp and /dev/shm) and largest file.
    read_paths: extra folders or files tools may read (the view always holds the system
        folders, the Python installation and every sys.path folder).
    namespaces: isolate workers in Linux namespaces where the kernel allows it.
    cgroup: "auto" (use cgroup v2 when this process may create memory-limited child groups),
        a cgroup v2 folder with the memory controller delegated, or None (watchdog only).
    fork_calls: run every call in a process forked from a worker that never runs one, so no
        call can change another's result (the default); False runs calls in the reused
        worker itself (earlier versions' behaviour; benchmarks compare the two).
    Thread-safe: calls from several threads are serialised. Create one per process: a forked
    copy of a Sandbox would share its workers' pipes with the original.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        memory_mb: int = 1024,
        cpu_s: float = 10.0,
        max_output_bytes: int = 65536,
        preload: Sequence[str] = (),
        modules: Sequence[str] = (),
        scratch_mb: int = 64,
        read_paths: Sequence[str] = (),
        namespaces: bool = True,
        cgroup: str | None = "auto",
        fork_calls: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        for label, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb), ("cpu_s", cpu_s),
                             ("max_output_bytes", max_output_bytes), ("scratch_mb", scratch_mb)):
            if not value > 0:
                raise ValueError(f"{label} must be > 0, got {value!r}")
        self.limits = Limits(float(timeout_s), int(memory_mb), float(cpu_s), int(max_output_bytes), int(scratch_mb))
        from dataengine.tools.registry import is_tools_file, loaded_tools, tools_entry

        self.preload = tuple(preload)
        # Workers import what this process loaded too, so its own toolboxes resolve there as well.
        self.modules = tuple(dict.fromkeys([*(tools_entry(m) for m in modules), *loaded_tools()]))
        files = [m for m in self.modules if is_tools_file(m)]
        self.read_paths = tuple(os.path.abspath(p) for p in [*read_paths, *files])
        self._view = read_only_view(self.read_paths)
        self.namespaces = bool(namespaces) and not _NAMESPACES_BROKEN
        self.cgroup = _memory_cgroup(cgroup)
        self.fork_calls = bool(fork_calls)
        self._ctx = mp.get_context("forkserver")
        # Imported once in the fork server, so each worker (and each replacement) starts fast.
        self._ctx.set_forkserver_preload(["dataengine.tools.worker", "jsonschema", "transformers.utils.chat_template_utils"])
        self._lock = threading.Lock()
        self._closed = False
        self._start_failures = 0
        self._started = 0
        self._info: dict[str, Any] = {}
        self._scan_seconds = 0.0  # the last process-table scan of the watchdog
        self._calls = 0  # calls sent so far: each worker message names the call it is about
        self._workers = [self._new_worker() for _ in range(workers)]

    @classmethod
    def from_config(cls, cfg: Any, preload: Sequence[str] = (), modules: Sequence[str] = ()) -> Sandbox:
        """A Sandbox from a dataengine.config.SandboxConfig (workers, timeout_s, memory_mb,
        cpu_s, max_output_bytes, scratch_mb)."""
        return cls(workers=cfg.workers, timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb, cpu_s=cfg.cpu_s,
                   max_output_bytes=cfg.max_output_bytes, scratch_mb=cfg.scratch_mb,
                   preload=preload, modules=modules)

    # ----------------------------------------------------------------- public API

    def call(
        self, toolbox: str, call: ToolCall, state: dict[str, Any] | None = None
    ) -> tuple[ToolResult, dict[str, Any] | None]:
        """Execute one call; return its result and the tool state after it.

        The state is copied into the worker, so the caller's dict is never mutated. When the
        call fails (status other than "ok") or the tool is stateless, the input state is
        returned unchanged (the same object).
        """
        return self.call_many([(toolbox, call, state)])[0]

    def call_many(self, items: Sequence[CallItem]) -> list[tuple[ToolResult, dict[str, Any] | None]]:
        """Execute independent calls across the workers in parallel; results in input order.

        items: (toolbox name, call, tool state or None) per call.
        """
        checked = [_check_item(i, item) for i, item in enumerate(items)]
        results: list[tuple[ToolResult, dict[str, Any] | None] | None] = [None] * len(checked)
        with self._lock:
            if self._closed:
                raise RuntimeError("this Sandbox is closed; create a new one")
            try:
                self._replace_dead_idle()
                self._run(checked, results)
            except BaseException:
                # Interrupted (Ctrl-C, a broken pool): a busy worker would later deliver its
                # result to the wrong call, so busy workers are replaced before re-raising.
                for w in list(self._workers):
                    if w.job is not None:
                        self._replace(w)
                raise
        return results  # type: ignore[return-value]

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Block until every worker has started (benchmarks and tests that count workers)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not all(w.ready for w in self._workers):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"sandbox workers not ready after {timeout_s:g} s")
                starting = [w for w in self._workers if not w.ready]
                ready = wait([w.conn for w in starting] + [w.process.sentinel for w in starting], left)
                for w in starting:
                    if w.conn in ready:
                        self._receive(w, [], [])
                    elif w.process.sentinel in ready and not w.retired:
                        self._died(w, [], [])

    @property
    def pids(self) -> list[int | None]:
        """Process ids of the workers' runners, as this process sees them (None while starting)."""
        return [w.pid for w in self._workers]

    @property
    def isolation(self) -> dict[str, Any]:
        """What the last started worker reported: namespaces (bool), reason (why not),
        capabilities (effective capability mask of the runner), memory ("cgroup" or "watchdog")."""
        return {**self._info, "memory": "cgroup" if self.cgroup else "watchdog"}

    def close(self) -> None:
        """Stop all workers and every process they started. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in self._workers:
                w.kill()
            if self.cgroup:
                _remove_cgroup(self.cgroup["parent"])

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ----------------------------------------------------------------- scheduling

    def _new_worker(self) -> _Worker:
        self._started += 1
        group = None
        if self.cgroup:
            group = os.path.join(self.cgroup["parent"], f"worker-{self._started}")
            _make_worker_cgroup(group)
        setup = Setup(self.limits, self.preload, self.modules, tempfile.mkdtemp(prefix="dataengine-sandbox-"),
                      self._view, self.namespaces, group, self.fork_calls)
        return _Worker(self._ctx, setup, watchdog=not self.cgroup)

    def _run(self, items: list[CallItem], results: list[Any]) -> None:
        pending = deque(range(len(items)))
        while pending or any(w.job is not None for w in self._workers):
            for w in list(self._workers):
                if pending and w.ready and w.job is None:
                    i = pending.popleft()
                    self._calls += 1
                    sent = w.send(i, items[i], self._calls)
                    if sent == "unsendable":
                        results[i] = _failed(items[i], "bad_arguments", w.send_error or "", 0.0)
                    elif sent == "dead":
                        pending.appendleft(i)
                        self._replace(w)
            busy = [w for w in self._workers if w.job is not None or (pending and not w.ready)]
            if not busy:
                continue
            wake = min(min(w.deadline, w.next_check) for w in busy)
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                         max(0.0, wake - time.monotonic()))
            for w in busy:
                if w.conn in ready and not w.retired:
                    self._receive(w, items, results)
                # A dead worker is noticed by its process, even if a grandchild holds the pipe.
                if w.process.sentinel in ready and not w.retired and not _has_data(w.conn):
                    self._died(w, items, results)
            now = time.monotonic()
            tree: dict[int, list[int]] | None = None
            for w in busy:
                if w.retired:
                    continue
                if w.deadline <= now and (w.job is not None or not w.ready):
                    self._expire(w, items, results)
                elif w.job is not None and w.next_check <= now:
                    if tree is None:
                        scan_start = time.monotonic()
                        tree = process_tree()
                        self._scan_seconds = time.monotonic() - scan_start
                    self._watch(w, tree, items, results)

    def _receive(self, w: _Worker, items: list[CallItem], results: list[Any]) -> None:
        try:
            raw = w.conn.recv_bytes(MAX_MESSAGE_BYTES)
        except (EOFError, OSError):
            self._died(w, items, results)
            return
        try:
            self._handle(w, raw, items, results)
        except (ValueError, TypeError, IndexError) as exc:
            # Only a tool writing to its worker's pipe gets here: never trust that worker again.
            self._violated(w, items, results, str(exc))

    def _handle(self, w: _Worker, raw: bytes, items: list[CallItem], results: list[Any]) -> None:
        """Act on one frame from a worker (JSON header line + payload); ValueError if it is
        not what this worker may send now."""
        head, _, payload = raw.partition(b"\n")
        msg = json.loads(head)
        if not (isinstance(msg, list) and len(msg) >= 2 and isinstance(msg[0], str)):
            raise ValueError("not a [kind, seq, ...] header")
        kind, seq = msg[0], msg[1]
        if w.ready != (kind not in ("ready", "no_namespaces")) or (w.job is None) == (kind in _CALL_MESSAGES):
            raise ValueError(f"unexpected {kind!r} message")
        if kind in _CALL_MESSAGES and seq != w.seq:
            raise ValueError(f"{kind!r} message for call {seq}, expected call {w.seq}")
        if kind == "ready":
            pid, info = int(msg[2]), dict(msg[3])
            w.ready, w.pid, w.deadline = True, pid, math.inf
            if info.get("preload_errors"):
                # Every call would fail as a tool error and poison the episodes: stop here instead.
                self._replace(w)
                raise ToolboxLoadError(
                    "sandbox worker could not load toolbox(es) "
                    + "; ".join(f"{name!r}: {err}" for name, err in sorted(info["preload_errors"].items()))
                    + " (tools import inside the worker's read-only view of sys.path and the Python install)"
                )
            self._info = info
            self._start_failures = 0
            w.measure_baseline(int(info.get("pss", 0)))
        elif kind == "no_namespaces":
            # Entered but could not build the view: every later worker starts without namespaces.
            _NAMESPACES_BROKEN.append(str(msg[2]))
            self.namespaces = False
            self._replace(w)
        elif kind == "loading":
            # A first-time toolbox import counts against neither the call's timeout nor its memory.
            w.loading = True
            w.deadline = time.monotonic() + LOAD_TIMEOUT_S
            w.next_check = math.inf
        elif kind == "loaded":
            w.loading = False
            w.deadline = time.monotonic() + self.limits.timeout_s
            w.set_memory_limit(refresh=True)
        elif kind == "started":
            w.set_memory_limit(refresh=True)
        elif kind == "result":
            status, error, seconds, dirty, n_out, n_state = msg[2:8]
            if status not in _STATUSES:
                raise ValueError(f"unknown status {status!r}")
            i = w.job
            _, call, state = items[i]  # type: ignore[index]
            output = json.loads(payload[:n_out]) if n_out >= 0 else None
            new_state = json.loads(payload[max(0, n_out):max(0, n_out) + n_state]) if n_state >= 0 else state
            if new_state is not state and not isinstance(new_state, dict):
                raise ValueError("the new state is not a JSON object")
            results[i] = (
                ToolResult(call=call, status=status, output=output, error=error, seconds=float(seconds)),
                new_state,
            )
            w.job = None
            w.deadline = w.next_check = math.inf
            if status == "memory" or dirty:
                # A MemoryError can leave the interpreter in a poor state; a call that left
                # threads, processes or patches behind must not affect the next one.
                w.dirty = str(dirty or "out of memory")
                self._replace(w)
        else:
            raise ValueError(f"unknown message kind {kind!r}")

    def _violated(self, w: _Worker, items: list[CallItem], results: list[Any], problem: str) -> None:
        if w.job is not None:
            message = (f"the worker's pipe carried a malformed message ({problem[:200]}); a tool wrote to it? "
                       "The worker was killed and replaced")
            results[w.job] = _failed(items[w.job], "crash", message, time.monotonic() - w.sent_at)
            w.job = None
        self._replace(w)

    def _died(self, w: _Worker, items: list[CallItem], results: list[Any]) -> None:
        code = w.reap()
        if w.job is not None:
            status, message = _death_status(code, self.limits)
            if w.setup.cgroup and _oom_kills(w.setup.cgroup):
                status, message = "memory", (
                    f"the tool and the processes it started used more than {self.limits.memory_mb} MiB together "
                    "(cgroup memory.max); the worker was killed and replaced")
            i = w.job
            results[i] = _failed(items[i], status, message, time.monotonic() - w.sent_at)
            w.job = None
        elif not w.ready:
            self._start_failures += 1
            if self._start_failures >= MAX_START_FAILURES:
                raise RuntimeError(
                    f"sandbox workers keep dying at start (last exit code {code}); "
                    "check that dataengine imports cleanly in a fresh process"
                )
        self._replace(w)

    def _expire(self, w: _Worker, items: list[CallItem], results: list[Any]) -> None:
        if w.job is None:
            w.kill()
            self._start_failures += 1
            if self._start_failures >= MAX_START_FAILURES:
                raise RuntimeError(f"sandbox workers did not start within {STARTUP_TIMEOUT_S} s")
        else:
            i = w.job
            if w.loading:
                message = (f"toolbox {items[i][0]!r} did not load within {LOAD_TIMEOUT_S:g} s; "
                           "the worker was killed and replaced")
            else:
                message = (f"tool {items[i][1].name!r} ran past the wall-clock limit of "
                           f"{self.limits.timeout_s:g} s; the worker was killed and replaced")
            results[i] = _failed(items[i], "timeout", message, time.monotonic() - w.sent_at)
            w.job = None
        self._replace(w)

    def _watch(self, w: _Worker, tree: dict[int, list[int]], items: list[CallItem], results: list[Any]) -> None:
        """Memory watchdog: kill the worker when its whole process group is over the limit."""
        start = time.monotonic()
        used = w.group_memory(tree)
        if used <= w.memory_limit:
            now = time.monotonic()
            w.next_check = now + max(WATCH_INTERVAL_S, WATCH_COST_RATIO * (now - start + self._scan_seconds))
            return
        i = w.job
        message = (f"the tool and the processes it started used {(used - w.baseline) / MIB:.0f} MiB together, "
                   f"over the limit of {self.limits.memory_mb} MiB; the worker was killed and replaced")
        results[i] = _failed(items[i], "memory", message, time.monotonic() - w.sent_at)  # type: ignore[index]
        w.job = None
        self._replace(w)

    def _replace_dead_idle(self) -> None:
        idle = [w for w in self._workers if w.job is None and w.ready]
        if idle:
            dead = wait([w.process.sentinel for w in idle], 0)
            for w in idle:
                if w.process.sentinel in dead:
                    self._replace(w)

    def _replace(self, w: _Worker) -> None:
        w.kill()
        w.retired = True
        self._workers[self._workers.index(w)] = self._new_worker()


_START_LOCK = threading.Lock()


class _WorkerProcess(mp.context.ForkServerProcess):
    """A forkserver process that does not re-run the parent's `__main__` (a script, pytest).

    Workers only need importable modules; re-running the caller's script in every worker
    would be slow and would break scripts without an `if __name__ == "__main__"` guard.
    """

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        from multiprocessing import popen_forkserver, spawn

        original = spawn.get_preparation_data

        def without_main(name: str) -> dict[str, Any]:
            data = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        with _START_LOCK:
            spawn.get_preparation_data = without_main
            try:
                return popen_forkserver.Popen(process_obj)
            finally:
                spawn.get_preparation_data = original


class _Worker:
    """Parent-side handle of one worker process."""

    def __init__(self, ctx: Any, setup: Setup, watchdog: bool) -> None:
        from dataengine.tools.worker import main

        self.setup = setup
        self.limits = setup.limits
        self.watchdog = watchdog  # no cgroup: the pool samples the group's memory
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = _WorkerProcess(target=main, args=(child, setup), daemon=True, name="dataengine-sandbox")
        self.process.start()
        child.close()
        self.ready = False
        self.pid: int | None = None
        self.job: int | None = None
        self.seq = -1  # the pool-wide number of the last call sent, echoed by the worker's messages
        self.sent_at = time.monotonic()
        self.deadline = self.sent_at + STARTUP_TIMEOUT_S
        self.next_check = math.inf
        self.send_error: str | None = None
        self.retired = False  # replaced in the pool; its handle may still sit in a local list
        self.loading = False  # importing a toolbox for the current call
        self.dirty: str | None = None  # why it was replaced after a call
        self.baseline = 0  # bytes: the runner's memory when idle (PSS at ready, plus later growth)
        self.runner_rss = 0  # bytes: the runner's resident size when `baseline` was last updated
        self.rss_checked = 0.0
        self.memory_limit = math.inf

    def send(self, index: int, item: CallItem, seq: int) -> str:
        """"sent", "unsendable" (arguments or state cannot be pickled) or "dead" (pipe closed)."""
        toolbox, call, state = item
        self.set_memory_limit(refresh=False)
        try:
            # The call's fields travel pickled on their own: a forked call process unpickles them.
            self.conn.send(("call", seq, toolbox, pickle.dumps((call.name, call.arguments, state))))
        except (BrokenPipeError, ConnectionResetError):
            return "dead"
        except Exception as exc:  # unpicklable arguments or state: nothing was written
            self.send_error = f"arguments or state cannot be sent to the sandbox: {exc}"
            return "unsendable"
        self.job, self.seq = index, seq
        self.sent_at = time.monotonic()
        self.deadline = self.sent_at + self.limits.timeout_s
        self.next_check = self.sent_at + WATCH_INTERVAL_S if self.watchdog else math.inf
        return "sent"

    def measure_baseline(self, runner_pss: int) -> None:
        """runner_pss: what the runner reported when it became ready."""
        self.baseline = runner_pss
        self.runner_rss = _rss(self.pid)
        self.rss_checked = time.monotonic()

    def set_memory_limit(self, refresh: bool) -> None:
        """Allow memory_mb above what the worker holds now (refresh: re-read it at once)."""
        if self.setup.cgroup:
            _set_cgroup_limit(self.setup.cgroup, self.limits.memory_mb)
            return
        if not self.watchdog:
            return
        now = time.monotonic()
        if refresh or now - self.rss_checked > BASELINE_REFRESH_S:
            # The runner grows with imports and the tool states it has held: that is baseline.
            self.rss_checked = now
            rss = _rss(self.pid)
            self.baseline += max(0, rss - self.runner_rss)
            self.runner_rss = max(rss, self.runner_rss)
        self.memory_limit = self.baseline + self.limits.memory_mb * MIB
        if refresh and self.job is not None:
            self.next_check = now + WATCH_INTERVAL_S

    def group_memory(self, tree: dict[int, list[int]]) -> int:
        """Bytes used by the runner and all its descendants (PSS: shared pages split, not
        repeated). The worker process and init above it only wait; they are not counted."""
        return sum(_pss(p) for p in [self.pid, *descendants(self.pid, tree)]) if self.pid else 0

    def reap(self) -> int | None:
        self.process.join(timeout=2.0)
        return self.process.exitcode

    def kill(self) -> None:
        """Kill the worker and every process it started, even ones that left its session."""
        pid = self.process.pid
        if pid is not None:
            victims: list[int] = []
            for _ in range(3):  # stop first, so nothing forks while we collect
                found = [p for p in descendants(pid) if p not in victims]
                if not found:
                    break
                for p in found:
                    _signal(p, signal.SIGSTOP)
                victims.extend(found)
            _signal(-pid, signal.SIGKILL)  # the worker leads its own session
            for p in [pid, *victims]:
                _signal(p, signal.SIGKILL)
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5.0)
        self.conn.close()
        shutil.rmtree(self.setup.scratch, ignore_errors=True)
        if self.setup.cgroup:
            _remove_cgroup(self.setup.cgroup)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig) if pid > 0 else os.killpg(-pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _has_data(conn: Any) -> bool:
    try:
        return conn.poll()
    except (EOFError, OSError):
        return False


def _rss(pid: int | None) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _pss(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_full_info().pss
    except (psutil.Error, AttributeError):
        return _rss(pid)


# --------------------------------------------------------------------- cgroup v2


def _memory_cgroup(choice: str | None) -> dict[str, Any] | None:
    """{"parent": the folder holding the workers' groups (created here)} or None.

    "auto": this process's own cgroup v2 group when the memory controller is already
    delegated to its children (never enabled here: that would change the host's setup).
    A folder: that cgroup v2 group, which must have memory in cgroup.subtree_control.
    None: no cgroup (the pool's watchdog applies).
    """
    if choice is None:
        return None
    if choice == "auto":
        mount = next((line.split(" - ")[0].split()[4] for line in _reads("/proc/self/mountinfo").splitlines()
                      if " - cgroup2 " in line), None)
        own = next((line[3:] for line in _reads("/proc/self/cgroup").splitlines() if line.startswith("0::")), None)
        if mount is None or own is None:
            return None
        group = mount + own.rstrip("/")
    else:
        group = choice
    if "memory" not in _reads(os.path.join(group, "cgroup.subtree_control")).split() or not os.access(group, os.W_OK):
        if choice == "auto":
            return None
        raise ValueError(f"cgroup {choice!r}: not a writable cgroup v2 folder with memory in cgroup.subtree_control")
    parent = os.path.join(group, f"dataengine-sandbox-{os.getpid()}-{id(object()):x}")
    try:
        os.mkdir(parent)
        with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
    except OSError as exc:
        _remove_cgroup(parent)
        if choice == "auto":
            return None
        raise ValueError(f"cgroup {choice!r}: cannot create a memory-limited group in it: {exc}") from exc
    return {"parent": parent}


def _reads(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _make_worker_cgroup(group: str) -> None:
    os.mkdir(group)
    for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
        try:
            with open(os.path.join(group, name), "w") as f:
                f.write(value)
        except OSError:
            pass


def _set_cgroup_limit(group: str, memory_mb: int) -> None:
    # Relative to what the worker holds now, like RLIMIT_AS; the kernel kills the whole group past it.
    current = int(_reads(os.path.join(group, "memory.current")) or 0)
    with open(os.path.join(group, "memory.max"), "w") as f:
        f.write(str(current + memory_mb * MIB))


def _oom_kills(group: str) -> int:
    for line in _reads(os.path.join(group, "memory.events")).splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def _remove_cgroup(group: str) -> None:
    for _ in range(50):
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


# --------------------------------------------------------------------- helpers


def _check_item(i: int, item: Any) -> CallItem:
    if not (isinstance(item, tuple) and len(item) == 3):
        raise TypeError(f"item {i}: expected (toolbox, ToolCall, state), got {item!r}")
    toolbox, call, state = item
    if not isinstance(toolbox, str):
        raise TypeError(f"item {i}: toolbox must be a str name, got {type(toolbox).__name__}")
    if not isinstance(call, ToolCall):
        raise TypeError(f"item {i}: call must be a ToolCall, got {type(call).__name__}")
    if state is not None and not isinstance(state, dict):
        raise TypeError(f"item {i}: state must be a dict or None, got {type(state).__name__}")
    return item


def _failed(item: CallItem, status: ToolStatus, message: str, seconds: float) -> tuple[ToolResult, Any]:
    _, call, state = item
    return ToolResult(call=call, status=status, error=message, seconds=seconds), state


def _death_status(code: int | None, limits: Limits) -> tuple[ToolStatus, str]:
    if code is not None and code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig == signal.SIGXCPU:
            return "timeout", f"the tool used more than {limits.cpu_s:g} s of CPU time (worker killed by SIGXCPU)"
        if sig == signal.SIGKILL:
            return "memory", "the worker was killed by SIGKILL (most likely out of memory)"
        return "crash", f"the worker died with {name} (exit code {code}); it was replaced"
    return "crash", f"the worker exited abruptly with code {code}; it was replaced"
