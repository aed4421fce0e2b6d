"""A stateful MCP server: accounts whose balances every deposit and withdrawal changes.

The state lives in the server process, so two search branches calling one process would see
each other's deposits. `--snapshots` adds `snapshot` / `restore` tools that dump and load the
whole state (for the engine's snapshot mode).
"""

from __future__ import annotations

import argparse
import json

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def build(snapshots: bool = False) -> MCPServer:
    server = MCPServer("bank", log_level="WARNING")
    accounts: dict[str, int] = {}

    @server.tool()
    def deposit(account: str, amount: int) -> int:
        """Add amount (cents, > 0) to an account; returns the new balance."""
        if amount <= 0:
            raise ToolError("amount must be positive")
        accounts[account] = accounts.get(account, 0) + amount
        return accounts[account]

    @server.tool()
    def withdraw(account: str, amount: int) -> int:
        """Take amount (cents, > 0) from an account; returns the new balance."""
        if amount <= 0:
            raise ToolError("amount must be positive")
        if accounts.get(account, 0) < amount:
            raise ToolError(f"insufficient funds in {account}")
        accounts[account] -= amount
        return accounts[account]

    @server.tool()
    def balance(account: str) -> int:
        """The balance of an account (0 if it never had a deposit)."""
        return accounts.get(account, 0)

    if snapshots:

        @server.tool()
        def snapshot() -> str:
            """The whole state as a JSON text."""
            return json.dumps(accounts, sort_keys=True)

        @server.tool()
        def restore(snapshot: str) -> str:
            """Replace the whole state by one snapshot gave."""
            accounts.clear()
            accounts.update(json.loads(snapshot))
            return "restored"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, help="serve streamable HTTP on 127.0.0.1:PORT instead of stdio")
    parser.add_argument("--snapshots", action="store_true")
    args = parser.parse_args()
    server = build(args.snapshots)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
