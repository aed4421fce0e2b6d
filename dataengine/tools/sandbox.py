"""Sandboxed tool execution: a pool of reusable worker processes with limits.

Each worker is a separate process started through a multiprocessing "forkserver" context
(the parent may hold torch threads, so it never forks itself). A worker resolves toolboxes
by name with registry.get_toolbox, validates arguments against the tool's JSON schema, and
runs the tool under an address-space limit (RLIMIT_AS) and a CPU-time limit (RLIMIT_CPU), both
set relative to the worker's own usage just before the call. The parent enforces a wall-clock
timeout and replaces workers that time out, crash or run out of memory. Network access is
refused, best effort: the worker moves into fresh user+network namespaces when the kernel allows
it (then there is no network interface but loopback), and Python's socket constructors raise.

Every outcome is a ToolResult; no tool can hang or kill the engine.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import random
import resource
import signal
import sys
import threading
import time
import traceback
import zlib
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Sequence

from dataengine.types import ToolCall, ToolResult, ToolStatus

# Seconds a worker may take to start (interpreter, imports, preloaded toolboxes).
STARTUP_TIMEOUT_S = 120.0
# Seconds a worker may take to import a toolbox on first use, on top of the call's timeout.
LOAD_TIMEOUT_S = 120.0
# A pool that cannot start this many workers in a row is broken: raise instead of looping.
MAX_START_FAILURES = 3
# Characters of traceback kept in an "exception" message.
TRACEBACK_CHARS = 600

CallItem = tuple[str, ToolCall, "dict[str, Any] | None"]


@dataclass(frozen=True)
class Limits:
    """Per-call limits, sent to every worker.

    timeout_s: wall-clock seconds per call, enforced by the parent (kill and replace).
    memory_mb: MiB of extra address space a call may map above the worker's baseline.
    cpu_s: CPU seconds per call (RLIMIT_CPU, whole seconds, rounded up).
    max_output_bytes: largest JSON encoding of a tool's output that is returned.
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    cpu_s: float = 10.0
    max_output_bytes: int = 65536


class Sandbox:
    """A pool of worker processes that execute tool calls under limits.

    Usage::

        with Sandbox(workers=2) as sandbox:
            result, state = sandbox.call("arithmetic", ToolCall(name="add", arguments={...}))

    preload: toolbox names every worker resolves at start, so no call pays for the import.
    modules: modules every worker imports at start, for toolboxes that register themselves
        on import but are not listed in registry.TOOLBOX_MODULES (the caller's own suites).
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
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        for label, value in (("timeout_s", timeout_s), ("memory_mb", memory_mb), ("cpu_s", cpu_s),
                             ("max_output_bytes", max_output_bytes)):
            if not value > 0:
                raise ValueError(f"{label} must be > 0, got {value!r}")
        self.limits = Limits(float(timeout_s), int(memory_mb), float(cpu_s), int(max_output_bytes))
        self.preload = tuple(preload)
        self.modules = tuple(modules)
        self._ctx = mp.get_context("forkserver")
        # Imported once in the fork server, so each worker (and each replacement) starts fast.
        self._ctx.set_forkserver_preload(["dataengine.tools.sandbox", "transformers.utils.chat_template_utils"])
        self._lock = threading.Lock()
        self._closed = False
        self._start_failures = 0
        self._workers = [_Worker(self._ctx, self.limits, self.preload, self.modules) for _ in range(workers)]

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
                ready = wait([w.conn for w in starting], left)
                for w in starting:
                    if w.conn in ready:
                        self._receive(w, [], [])

    @property
    def pids(self) -> list[int | None]:
        """Process ids of the workers (None for one still starting)."""
        return [w.pid for w in self._workers]

    def close(self) -> None:
        """Stop all workers. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in self._workers:
                w.stop()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ----------------------------------------------------------------- scheduling

    def _run(self, items: list[CallItem], results: list[Any]) -> None:
        pending = deque(range(len(items)))
        while pending or any(w.job is not None for w in self._workers):
            for w in self._workers:
                if pending and w.ready and w.job is None:
                    i = pending.popleft()
                    if not w.send(i, items[i]):
                        results[i] = _failed(items[i], "bad_arguments", w.send_error or "", 0.0)
            busy = [w for w in self._workers if w.job is not None or (pending and not w.ready)]
            if not busy:
                continue
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = wait([w.conn for w in busy], timeout)
            for w in busy:
                if w.conn in ready and not w.retired:
                    self._receive(w, items, results)
            now = time.monotonic()
            for w in busy:
                if not w.retired and w.deadline <= now and (w.job is not None or not w.ready):
                    self._expire(w, items, results)

    def _receive(self, w: "_Worker", items: list[CallItem], results: list[Any]) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            self._died(w, items, results)
            return
        kind = msg[0]
        if kind == "ready":
            w.ready, w.pid, w.deadline = True, msg[1], math.inf
            self._start_failures = 0
        elif kind == "loading":
            # A first-time toolbox import does not count against the call's timeout.
            w.loading = True
            w.deadline = time.monotonic() + LOAD_TIMEOUT_S
        elif kind == "loaded":
            w.loading = False
            w.deadline = time.monotonic() + self.limits.timeout_s
        elif kind == "result" and w.job is not None:
            _, status, output_json, error, state_json, seconds = msg
            i = w.job
            toolbox, call, state = items[i]
            output = json.loads(output_json) if output_json is not None else None
            new_state = json.loads(state_json) if state_json is not None else state
            results[i] = (
                ToolResult(call=call, status=status, output=output, error=error, seconds=seconds),
                new_state,
            )
            w.job = None
            w.deadline = math.inf
            if status == "memory":
                # A MemoryError can leave the interpreter in a poor state: start afresh.
                self._replace(w)

    def _died(self, w: "_Worker", items: list[CallItem], results: list[Any]) -> None:
        code = w.reap()
        if w.job is None:
            self._start_failures += 1
            if self._start_failures >= MAX_START_FAILURES:
                raise RuntimeError(
                    f"sandbox workers keep dying at start (last exit code {code}); "
                    "check that dataengine imports cleanly in a fresh process"
                )
        else:
            status, message = _death_status(code, self.limits)
            i = w.job
            results[i] = _failed(items[i], status, message, time.monotonic() - w.sent_at)
            w.job = None
        self._replace(w)

    def _expire(self, w: "_Worker", items: list[CallItem], results: list[Any]) -> None:
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

    def _replace(self, w: "_Worker") -> None:
        w.kill()
        w.retired = True
        self._workers[self._workers.index(w)] = _Worker(self._ctx, self.limits, self.preload, self.modules)


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

    def __init__(self, ctx: Any, limits: Limits, preload: tuple[str, ...], modules: tuple[str, ...]) -> None:
        self.limits = limits
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = _WorkerProcess(
            target=_worker_main, args=(child, limits, preload, modules), daemon=True, name="dataengine-sandbox"
        )
        self.process.start()
        child.close()
        self.ready = False
        self.pid: int | None = None
        self.job: int | None = None
        self.sent_at = time.monotonic()
        self.deadline = self.sent_at + STARTUP_TIMEOUT_S
        self.send_error: str | None = None
        self.retired = False  # replaced in the pool; its handle may still sit in a local list
        self.loading = False  # importing a toolbox for the current call

    def send(self, index: int, item: CallItem) -> bool:
        toolbox, call, state = item
        try:
            self.conn.send(("call", toolbox, call.name, call.arguments, state))
        except Exception as exc:  # unpicklable arguments or state: nothing was written
            self.send_error = f"arguments or state cannot be sent to the sandbox: {exc}"
            return False
        self.job = index
        self.sent_at = time.monotonic()
        self.deadline = self.sent_at + self.limits.timeout_s
        return True

    def reap(self) -> int | None:
        self.process.join(timeout=2.0)
        return self.process.exitcode

    def kill(self) -> None:
        if self.process.pid is not None:
            try:
                # The worker leads its own session, so this also ends processes its tools started.
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5.0)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except Exception:
            pass
        self.process.join(timeout=1.0)
        self.kill()


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
    toolbox, call, state = item
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


# --------------------------------------------------------------------- worker side


class CpuLimitExceeded(BaseException):
    """Raised in a worker on SIGXCPU; a BaseException so tools' `except Exception` miss it."""


_in_call = False
_IMPORT_ERRORS: list[str] = []
_DEVNULL = _STDERR = -1


def _on_sigxcpu(signum: int, frame: Any) -> None:
    if _in_call:
        raise CpuLimitExceeded()


def _isolate_network() -> None:
    """Refuse network access in this process, best effort."""
    import ctypes
    import socket

    try:
        # A new user namespace lets an unprivileged process own a new, empty network namespace.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.unshare(0x10000000 | 0x40000000)  # CLONE_NEWUSER | CLONE_NEWNET
    except Exception:
        pass

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


def _worker_main(conn: Connection, limits: Limits, preload: tuple[str, ...], modules: tuple[str, ...]) -> None:
    import importlib

    from dataengine.tools.registry import get_toolbox

    global _DEVNULL, _STDERR
    try:
        os.setsid()  # own process group: a kill reaches the processes a tool started too
    except OSError:
        pass
    # Tool prints must not reach the engine's stdout (stderr is silenced during calls only,
    # so a worker that fails to start still says why).
    _DEVNULL = os.open(os.devnull, os.O_RDWR)
    _STDERR = os.dup(2)
    os.dup2(_DEVNULL, 0)
    os.dup2(_DEVNULL, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    _isolate_network()
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            _IMPORT_ERRORS.append(f"module {module!r} failed to import: {_describe(exc)}")
    loaded: set[str] = set()
    for name in preload:
        try:
            get_toolbox(name)
            loaded.add(name)
        except Exception:
            pass  # reported when a call names it
    conn.send(("ready", os.getpid()))
    validators: dict[tuple[str, str], Any] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        _, toolbox, name, arguments, state = msg
        if toolbox not in loaded:
            loaded.add(toolbox)
            conn.send(("loading",))
            try:
                get_toolbox(toolbox)
            except Exception:
                pass  # _execute reports it
            conn.send(("loaded",))
        conn.send(("result", *_execute(toolbox, name, arguments, state, limits, validators)))


def _execute(
    toolbox_name: str, name: str, arguments: dict, state: dict | None, limits: Limits,
    validators: dict,
) -> tuple[ToolStatus, str | None, str | None, str | None, float]:
    """Run one call in the worker: (status, output JSON, error, new state JSON, seconds)."""
    global _in_call
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
    seed = json.dumps([toolbox_name, name, arguments], sort_keys=True, default=str)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(zlib.crc32(seed.encode()))
    soft_as, hard_as = resource.getrlimit(resource.RLIMIT_AS)
    soft_cpu, hard_cpu = resource.getrlimit(resource.RLIMIT_CPU)
    status: ToolStatus = "ok"
    output_json = error = state_json = None
    start = time.perf_counter()
    try:
        _set_limits(limits, hard_as, hard_cpu)
        _in_call = True
        if _DEVNULL >= 0:
            os.dup2(_DEVNULL, 2)
        try:
            out = tool.fn(state, **arguments) if tool.stateful else tool.fn(**arguments)
            output_json = _to_json(out, "output")
            if tool.stateful and tool.writes_state:
                # ASCII escapes: about 30% faster to encode for multi-MB states (tau2 databases).
                state_json = _to_json(state, "state", ascii_only=True)
        finally:
            _in_call = False
            if _STDERR >= 0:
                sys.stderr.flush()
                os.dup2(_STDERR, 2)
            resource.setrlimit(resource.RLIMIT_AS, (soft_as, hard_as))
            resource.setrlimit(resource.RLIMIT_CPU, (soft_cpu, hard_cpu))
    except CpuLimitExceeded:
        status, error = "timeout", f"the tool used more than {limits.cpu_s:g} s of CPU time"
    except MemoryError:
        status, error = "memory", f"the tool needed more than {limits.memory_mb} MiB of memory"
    except _NotJSON as exc:
        status, error = "exception", str(exc)
    except BaseException as exc:  # SystemExit and friends from a tool must not stop the worker
        status, error = "exception", _describe(exc)
    seconds = time.perf_counter() - start
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
    resource.setrlimit(resource.RLIMIT_AS, (new_as, hard_as))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    new_cpu = math.ceil(usage.ru_utime + usage.ru_stime + limits.cpu_s)
    if hard_cpu != resource.RLIM_INFINITY:
        new_cpu = min(new_cpu, hard_cpu)
    resource.setrlimit(resource.RLIMIT_CPU, (new_cpu, hard_cpu))


class _NotJSON(Exception):
    """A tool returned (or left as state) a value JSON cannot encode."""


def _to_json(value: Any, what: str, ascii_only: bool = False) -> str:
    try:
        return json.dumps(value, ensure_ascii=ascii_only)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit("dataengine.tools.sandbox is a library module")
