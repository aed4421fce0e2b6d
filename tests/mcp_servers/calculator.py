"""A stateless MCP server: arithmetic tools whose answers depend only on their arguments.

Run: `python -m tests.mcp_servers.calculator` (stdio) or `... --http PORT` (streamable HTTP on
127.0.0.1). `--misbehave` adds tools that crash the process, hang, or write garbage to stdout,
for the tests of a server that fails mid-call.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# The stdio transport moves fd 1 to stderr and writes the protocol to a duplicate of the
# original stdout pipe; the misbehaving tools find that duplicate to corrupt the wire.
_STDOUT = os.fstat(1)


def _wire() -> int:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if fd != 1 and (st.st_dev, st.st_ino) == (_STDOUT.st_dev, _STDOUT.st_ino):
            return fd
    return 1


def build(misbehave: bool = False) -> MCPServer:
    server = MCPServer("calculator", log_level="WARNING")

    @server.tool()
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    @server.tool()
    def multiply(a: float, b: float) -> float:
        """Multiply two numbers."""
        return a * b

    @server.tool()
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        if b == 0:
            raise ToolError("division by zero")
        return a / b

    if misbehave:

        @server.tool()
        def crash() -> str:
            """Exit the server process at once."""
            os._exit(3)

        @server.tool()
        def hang(seconds: float = 3600.0) -> str:
            """Sleep far longer than any call limit."""
            time.sleep(seconds)
            return "woke"

        @server.tool()
        def garbage() -> str:
            """Write a line that is not JSON-RPC to the wire, then answer nothing."""
            os.write(_wire(), b"this is not json\n")
            time.sleep(3600)
            return "never"

        @server.tool()
        def malformed(ctx: Context) -> str:
            """Answer this call with a JSON-RPC response whose result is not a tool result."""
            reply = {"jsonrpc": "2.0", "id": ctx.request_id, "result": {"content": "not a list of blocks"}}
            os.write(_wire(), (json.dumps(reply) + "\n").encode())
            time.sleep(3600)
            return "never"

        @server.tool()
        def huge(n: int) -> str:
            """A text of n characters."""
            return "x" * n

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, help="serve streamable HTTP on 127.0.0.1:PORT instead of stdio")
    parser.add_argument("--misbehave", action="store_true")
    args = parser.parse_args()
    server = build(args.misbehave)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
