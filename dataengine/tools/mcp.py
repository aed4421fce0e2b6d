"""MCP servers as toolboxes: tool calls of a toolbox sent to a Model Context Protocol server.

`register_servers(config.tools.mcp, config.sandbox)` connects to each server (stdio command or
streamable-HTTP URL, through the official `mcp` SDK), lists its tools and registers a Toolbox
of that name whose `client` is an `MCPClient`; ToolEnv sends that toolbox's calls to the client
instead of the sandbox. The tools' names, descriptions and input schemas are offered as the
server lists them (ToolSpec.parameters is the tool's inputSchema).

Branches must not see each other's effects. How a call is run depends on the server:

- stateless (`stateful: false`): every call goes to one long-lived session; the tool state is
  None.
- stateful with snapshot/restore tools: the tool state is `{"snapshot": <snapshot_tool's
  output>}`; a call is restore(snapshot), the call, snapshot(), serialised on one session.
- stateful (replay): the tool state is `{"calls": [{"name", "arguments"}, ...]}`, every call
  the server answered on this branch. A call needs a session whose server has run exactly those
  calls: an idle session left at that branch's end is taken when there is one (no replay);
  otherwise a fresh session (a new server process for stdio, a new connection for HTTP) replays
  them first. A session that failed (timeout, crash, garbage) is closed, never reused.

Every call runs under a wall-clock limit (the server's `timeout_s`, else the sandbox's) and the
sandbox's output limit. A server that crashes, hangs or answers something that is not MCP gives
that call an error result (crash / timeout) and the next call starts a new session.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from dataengine.tools.registry import Tool, Toolbox, get_toolbox, register_toolbox
from dataengine.types import ToolCall, ToolResult, ToolSpec, ToolStatus, canonical_json, stable_hash

# Seconds a session may take to close (stdio: the SDK then terminates the process).
CLOSE_TIMEOUT_S = 10.0
# Bytes of a stdio server's stderr quoted when it dies.
STDERR_TAIL_BYTES = 400


class MCPServerError(RuntimeError):
    """An MCP server could not be started or listed (names the server and what went wrong)."""


class _Failure(Exception):
    """A call that did not get an answer: status and message for its ToolResult."""

    def __init__(self, status: ToolStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Loop:
    """One asyncio loop on a daemon thread: every MCP session of the process lives on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="mcp-clients", daemon=True).start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_LOOP: _Loop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> _Loop:
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = _Loop()
        return _LOOP


class _Session:
    """One connection to the server, owned by one task (the SDK's context managers must be
    entered and left in the same task). `broken` holds why it can no longer be trusted."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.client: Any = None
        self.broken: str | None = None
        self.garbage = asyncio.Event()  # the transport delivered something that is not JSON-RPC
        self._stop = asyncio.Event()
        self._ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._stderr = tempfile.TemporaryFile() if config.command else None
        self._task: asyncio.Task | None = None

    async def open(self) -> _Session:
        self._task = asyncio.ensure_future(self._own())
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self.config.startup_timeout_s)
        except TimeoutError:
            tail = self.stderr_tail()
            await self.close()
            raise _Failure("timeout", f"MCP server {self.config.name!r} did not start within "
                           f"{self.config.startup_timeout_s:g} s{tail}") from None
        except Exception as exc:
            await asyncio.sleep(0.05)  # let the dead process's last stderr lines land
            tail = self.stderr_tail()
            await self.close()
            raise _Failure("crash", f"MCP server {self.config.name!r} could not be started: {_describe(exc)}{tail}") from exc
        return self

    async def _own(self) -> None:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        cfg = self.config
        if cfg.command:
            params = StdioServerParameters(command=cfg.command[0], args=list(cfg.command[1:]), env=dict(cfg.env) or None,
                                           cwd=cfg.cwd)
            errlog = open(self._stderr.fileno(), "w", closefd=False)  # type: ignore[union-attr]
            server: Any = stdio_client(params, errlog=errlog)
        else:
            server = cfg.url
        try:
            async with Client(server, cache=None, message_handler=self._message) as client:
                self.client = client
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            self.broken = self.broken or f"the connection ended: {_describe(exc)}"
            if not isinstance(exc, Exception):
                raise
        finally:
            self.broken = self.broken or "closed"

    async def _message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.broken = f"it sent something that is not an MCP message ({_describe(message)})"
            self.garbage.set()

    async def close(self) -> None:
        self.broken = self.broken or "closed"
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_TIMEOUT_S)
            except BaseException:
                self._task.cancel()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def stderr_tail(self) -> str:
        """The end of a stdio server's stderr, as `; stderr: ...` (empty if none)."""
        if self._stderr is None or self._stderr.closed:
            return ""
        size = os.fstat(self._stderr.fileno()).st_size
        data = os.pread(self._stderr.fileno(), STDERR_TAIL_BYTES, max(0, size - STDERR_TAIL_BYTES))
        text = " | ".join(line.strip() for line in data.decode(errors="replace").splitlines() if line.strip())
        return f"; stderr: {text}" if text else ""

    async def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The server's CallToolResult; _Failure (and a broken session) when there is none."""
        from mcp import MCPError

        request = asyncio.ensure_future(self.client.call_tool(name, arguments))
        garbage = asyncio.ensure_future(self.garbage.wait())
        try:
            done, _ = await asyncio.wait({request, garbage}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            garbage.cancel()
        label = f"MCP server {self.config.name!r}"
        if request not in done:
            request.cancel()
            if garbage in done:
                raise _Failure("crash", f"{label}: {self.broken}")
            self.broken = "a call timed out"
            raise _Failure("timeout", f"{label} gave no answer to {name!r} within {timeout_s:g} s")
        try:
            return request.result()
        except MCPError as exc:
            if self.broken is None and "closed" not in str(exc).lower():
                # A JSON-RPC error answer: the server is alive and the session still usable.
                raise _Failure("exception", f"{label} answered {name!r} with error {exc.error.code}: {exc.error.message}") from exc
            self.broken = self.broken or "the connection closed"
            await asyncio.sleep(0.05)  # let the dead process's last stderr lines land
            raise _Failure("crash", f"{label}: {self.broken} during {name!r} (the server exited or dropped the "
                           f"connection){self.stderr_tail()}") from exc
        except Exception as exc:  # a malformed answer: the protocol state is unknown
            self.broken = f"answered {name!r} with something that is not a tool result ({_describe(exc)})"
            raise _Failure("crash", f"{label}: {self.broken}") from exc


class MCPClient:
    """Runs tool calls on one MCP server with the isolation its config asks for (module doc).

    config: a dataengine.config.MCPServerConfig. timeout_s: wall-clock limit per call;
    max_output_bytes: largest JSON output kept (both the sandbox's unless the config overrides
    the timeout). `stats` counts calls, replayed calls, sessions started and idle sessions
    reused (replay mode), for tests and the benchmark.
    """

    def __init__(self, config: Any, timeout_s: float = 5.0, max_output_bytes: int = 65536) -> None:
        self.config = config
        self.timeout_s = float(config.timeout_s or timeout_s)
        self.max_output_bytes = int(max_output_bytes)
        self.mode = "direct" if not config.stateful else ("snapshot" if config.snapshot_tool else "replay")
        self.stats = {"calls": 0, "replayed_calls": 0, "sessions": 0, "reused": 0}
        self._loop = _loop()
        self._closed = False
        self._shared: _Session | None = None
        self._idle: OrderedDict[str, list[_Session]] = OrderedDict()  # call-log hash -> sessions at it
        self._idle_count = 0
        self._sem: asyncio.Semaphore | None = None
        self._lock: asyncio.Lock | None = None
        self.specs, self.initial_state = self._loop.run(self._start())
        self._specs = {spec.name: spec for spec in self.specs}
        self._validators: dict[str, Any] = {}

    # ------------------------------------------------------------------ sync surface

    def call_many(self, items: Sequence[tuple[ToolCall, dict[str, Any] | None]]) -> list[tuple[ToolResult, Any]]:
        """Run independent calls (each on its own branch's state); results in input order."""
        if self._closed:
            raise RuntimeError(f"the client of MCP server {self.config.name!r} is closed")
        return self._loop.run(self._call_all(list(items)))

    def close(self) -> None:
        """Close every session (stdio: stop the server processes). Idempotent."""
        if not self._closed:
            self._closed = True
            self._loop.run(self._close_all())

    # ------------------------------------------------------------------ async side

    async def _start(self) -> tuple[list[ToolSpec], dict[str, Any] | None]:
        self._sem = asyncio.Semaphore(self.config.sessions)
        self._lock = asyncio.Lock()
        try:
            conn = await self._open()
            listed = await _list_tools(conn, self.timeout_s)
        except _Failure as exc:
            raise MCPServerError(str(exc)) from None
        hidden = {self.config.snapshot_tool, self.config.restore_tool} - {None}
        missing = hidden - {t.name for t in listed}
        if missing:
            await conn.close()
            raise MCPServerError(f"MCP server {self.config.name!r} lists no tool {sorted(missing)[0]!r} "
                                 f"(named by snapshot_tool/restore_tool)")
        specs = [ToolSpec(name=t.name, description=t.description or "", parameters=t.input_schema)
                 for t in listed if t.name not in hidden]
        initial: dict[str, Any] | None = None
        if self.mode == "direct":
            self._shared = conn
        elif self.mode == "snapshot":
            self._shared = conn
            try:
                initial = {"snapshot": _snapshot(await conn.call(self.config.snapshot_tool, {}, self.timeout_s))}
            except _Failure as exc:
                raise MCPServerError(f"MCP server {self.config.name!r}: the first snapshot failed: {exc}") from None
        else:
            initial = {"calls": []}
            self._keep(stable_hash([]), conn)
        return specs, initial

    async def _open(self) -> _Session:
        self.stats["sessions"] += 1
        return await _Session(self.config).open()

    async def _call_all(self, items: list[tuple[ToolCall, Any]]) -> list[tuple[ToolResult, Any]]:
        return list(await asyncio.gather(*(self._call(call, state) for call, state in items)))

    async def _call(self, call: ToolCall, state: Any) -> tuple[ToolResult, Any]:
        start = time.perf_counter()
        self.stats["calls"] += 1
        problem = self._problem(call)
        if problem is not None:  # never sent: the server's state is unchanged
            return ToolResult(call=call, status=problem[0], error=problem[1]), state
        try:
            if self.mode == "direct":
                result, new_state = await self._direct(call), state
            elif self.mode == "snapshot":
                result, new_state = await self._snapshotted(call, state)
            else:
                result, new_state = await self._replayed(call, state)
        except _Failure as exc:
            return ToolResult(call=call, status=exc.status, error=str(exc), seconds=time.perf_counter() - start), state
        return self._result(call, result, time.perf_counter() - start), new_state

    async def _direct(self, call: ToolCall) -> Any:
        async with self._sem:  # type: ignore[union-attr]
            async with self._lock:  # type: ignore[union-attr]
                if self._shared is None or self._shared.broken:
                    if self._shared is not None:
                        asyncio.ensure_future(self._shared.close())
                    self._shared = None
                    self._shared = await self._open()
                conn = self._shared
            return await conn.call(call.name, call.arguments, self.timeout_s)

    async def _snapshotted(self, call: ToolCall, state: Any) -> tuple[Any, Any]:
        cfg = self.config
        if not (isinstance(state, dict) and "snapshot" in state):
            raise _Failure("exception", f"MCP server {cfg.name!r}: the tool state is not a snapshot ({state!r:.80})")
        async with self._lock:  # type: ignore[union-attr]  # restore, call, snapshot: one at a time
            if self._shared is None or self._shared.broken:
                if self._shared is not None:
                    asyncio.ensure_future(self._shared.close())
                self._shared = None
                self._shared = await self._open()
            conn = self._shared
            restored = await conn.call(cfg.restore_tool, {cfg.restore_argument: state["snapshot"]}, self.timeout_s)
            if restored.is_error:
                raise _Failure("exception", f"MCP server {cfg.name!r}: {cfg.restore_tool} refused the branch's snapshot: {_text(restored)}")
            result = await conn.call(call.name, call.arguments, self.timeout_s)
            snapshot = await conn.call(cfg.snapshot_tool, {}, self.timeout_s)
        if snapshot.is_error:
            raise _Failure("exception", f"MCP server {cfg.name!r}: {cfg.snapshot_tool} failed after the call: {_text(snapshot)}")
        return result, {"snapshot": _snapshot(snapshot)}

    async def _replayed(self, call: ToolCall, state: Any) -> tuple[Any, Any]:
        calls = state.get("calls") if isinstance(state, dict) else None
        if not isinstance(calls, list):
            raise _Failure("exception", f"MCP server {self.config.name!r}: the tool state holds no call log ({state!r:.80})")
        async with self._sem:  # type: ignore[union-attr]
            conn = self._take(stable_hash(calls))
            if conn is None:
                conn = await self._open()
                try:
                    for k, past in enumerate(calls):
                        self.stats["replayed_calls"] += 1
                        await conn.call(past["name"], past["arguments"], self.timeout_s)
                except _Failure as exc:
                    await conn.close()
                    raise _Failure(exc.status, f"replaying this branch's {len(calls)} earlier calls on a fresh "
                                   f"session failed at call {k + 1}: {exc}") from None
            try:
                result = await conn.call(call.name, call.arguments, self.timeout_s)
            except _Failure:
                asyncio.ensure_future(conn.close())
                raise
        # The server answered, so the call happened there: it joins the branch's log.
        new_calls = [*calls, {"name": call.name, "arguments": call.arguments}]
        self._keep(stable_hash(new_calls), conn)
        return result, {"calls": new_calls}

    def _problem(self, call: ToolCall) -> tuple[ToolStatus, str] | None:
        """unknown_tool or bad_arguments (the listed inputSchema), as the sandbox reports them."""
        import jsonschema

        spec = self._specs.get(call.name)
        if spec is None:
            known = ", ".join(sorted(self._specs)) or "(none)"
            return "unknown_tool", f"unknown tool {call.name!r} in toolbox {self.config.name!r}; known tools: {known}"
        if call.name not in self._validators:
            schema = spec.parameters or {"type": "object"}
            self._validators[call.name] = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(self._validators[call.name].iter_errors(call.arguments))
        if error is None:
            return None
        if error.validator == "required":
            return "bad_arguments", f"missing required argument for tool {call.name!r}: {error.message}"
        where = ".".join(str(p) for p in error.absolute_path) or "(arguments)"
        return "bad_arguments", f"argument {where!r} of tool {call.name!r}: {error.message}"

    def _take(self, key: str) -> _Session | None:
        sessions = self._idle.get(key)
        while sessions:
            conn = sessions.pop()
            self._idle_count -= 1
            if not sessions:
                del self._idle[key]
            if conn.broken is None:
                self.stats["reused"] += 1
                return conn
            asyncio.ensure_future(conn.close())
        return None

    def _keep(self, key: str, conn: _Session) -> None:
        if conn.broken is not None or self.config.idle_sessions == 0:
            asyncio.ensure_future(conn.close())
            return
        self._idle.setdefault(key, []).append(conn)
        self._idle.move_to_end(key)
        self._idle_count += 1
        while self._idle_count > self.config.idle_sessions:  # close the least recently kept
            oldest = next(iter(self._idle))
            victim = self._idle[oldest].pop(0)
            if not self._idle[oldest]:
                del self._idle[oldest]
            self._idle_count -= 1
            asyncio.ensure_future(victim.close())

    def _result(self, call: ToolCall, result: Any, seconds: float) -> ToolResult:
        if result.is_error:
            return ToolResult(call=call, status="exception", error=_text(result), seconds=seconds)
        output = _output(result)
        size = len(canonical_json(output).encode())
        if size > self.max_output_bytes:
            return ToolResult(call=call, status="output_too_large", seconds=seconds,
                              error=f"the tool's output is {size} bytes of JSON, over the limit of {self.max_output_bytes}")
        return ToolResult(call=call, status="ok", output=output, seconds=seconds)

    async def _close_all(self) -> None:
        sessions = [s for group in self._idle.values() for s in group] + ([self._shared] if self._shared else [])
        self._idle.clear()
        self._shared = None
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


async def _list_tools(conn: _Session, timeout_s: float) -> list[Any]:
    tools, cursor = [], None
    try:
        while True:
            page = await asyncio.wait_for(conn.client.list_tools(cursor=cursor), timeout_s)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools
    except Exception as exc:
        await conn.close()
        raise _Failure("crash", f"MCP server {conn.config.name!r} could not list its tools: {_describe(exc)}") from exc


def _output(result: Any) -> Any:
    """A CallToolResult as JSON: its structured content, else its text (one block: a str),
    else its content blocks as dicts."""
    if result.structured_content is not None:
        return result.structured_content
    blocks = result.content
    if blocks and all(b.type == "text" for b in blocks):
        return "\n".join(b.text for b in blocks)
    return [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in blocks]


def _snapshot(result: Any) -> Any:
    """What restore_tool gets back: the snapshot tool's text, else its structured content."""
    blocks = result.content
    if blocks and all(b.type == "text" for b in blocks):
        return "\n".join(b.text for b in blocks)
    return result.structured_content


def _text(result: Any) -> str:
    return " ".join(b.text for b in result.content if b.type == "text") or "the tool reported an error"


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:  # the SDK's task groups
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# ---------------------------------------------------------------------------- registration

_CLIENTS: dict[str, tuple[str, MCPClient]] = {}


def register_servers(servers: Sequence[Any], sandbox: Any = None) -> list[str]:
    """Connect to each MCPServerConfig and register its toolbox; the names, in order.

    sandbox: a SandboxConfig whose timeout_s and max_output_bytes limit the calls (defaults:
    the SandboxConfig defaults). A server already registered with the same settings is kept;
    one registered with other settings is closed and replaced. MCPServerError names a server
    that cannot be started or listed.
    """
    from dataengine.config import SandboxConfig

    sandbox = sandbox or SandboxConfig()
    names = []
    for cfg in servers:
        key = cfg.model_dump_json() + f"|{sandbox.timeout_s}|{sandbox.max_output_bytes}"
        held = _CLIENTS.get(cfg.name)
        if held is None or held[0] != key:
            if held is not None:
                held[1].close()
            try:
                existing = get_toolbox(cfg.name)
            except KeyError:
                existing = None
            if existing is not None and existing.client is None:
                raise MCPServerError(f"MCP server name {cfg.name!r} is already a built-in toolbox; choose another name")
            client = MCPClient(cfg, timeout_s=sandbox.timeout_s, max_output_bytes=sandbox.max_output_bytes)
            _CLIENTS[cfg.name] = (key, client)
            register_toolbox(toolbox_of(cfg.name, client))
        names.append(cfg.name)
    return names


def toolbox_of(name: str, client: MCPClient) -> Toolbox:
    """The Toolbox of a connected client: its listed tools, its initial state, the client."""
    initial = client.initial_state

    def remote(**_: Any) -> Any:  # never called: ToolEnv sends this toolbox's calls to the client
        raise RuntimeError(f"tools of MCP server {name!r} run through its client, not in a sandbox worker")

    tools = {spec.name: Tool(fn=remote, spec=spec) for spec in client.specs}
    return Toolbox(name=name, tools=tools, make_initial_state=lambda task: initial, client=client)


@atexit.register
def close_servers() -> None:
    """Close every registered server's client (stdio servers stop)."""
    for _, client in list(_CLIENTS.values()):
        try:
            client.close()
        except Exception:
            pass
    _CLIENTS.clear()
