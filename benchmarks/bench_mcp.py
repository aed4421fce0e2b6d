"""What branch isolation costs on an MCP server, against direct calls, measured in one run.

    .venv/bin/python benchmarks/bench_mcp.py            # default size (a few minutes)
    .venv/bin/python benchmarks/bench_mcp.py --quick    # under a minute

Uses tests/mcp_servers/bank.py over stdio, under four configs:
  direct     stateful: false, every call on one long-lived session (the baseline);
  line       stateful replay, a branch extended call after call (each call finds the session
             left at its branch's end: no replay);
  replay@d   stateful replay with idle_sessions=0, a call from a branch of depth d: a fresh
             session (a new server process) replays the d earlier calls first; what a
             sibling branch pays;
  snapshot   stateful with snapshot/restore tools: restore, call, snapshot on one session.
Prints calls/s and each mode's time per call as a ratio to `direct`, and the replay cost per
unit of depth (the slope over d) as a ratio to one direct call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataengine.config import MCPServerConfig  # noqa: E402
from dataengine.tools.mcp import MCPClient  # noqa: E402
from dataengine.types import ToolCall  # noqa: E402

DEPOSIT = ToolCall(name="deposit", arguments={"account": "a", "amount": 1})


def bank(name: str, *args: str, **fields) -> MCPServerConfig:
    return MCPServerConfig(name=name, command=[sys.executable, "-m", "tests.mcp_servers.bank", *args], cwd=str(ROOT),
                           timeout_s=60, **fields)


def per_call(client: MCPClient, n: int, state, chain: bool) -> float:
    """Seconds per call over n calls (after 5 untimed ones); chain: each call on the state the
    last one left."""
    for _ in range(5 if n > 1 else 0):
        (_, new_state), = client.call_many([(DEPOSIT, state)])
        state = new_state if chain else state
    start = time.perf_counter()
    for _ in range(n):
        (result, new_state), = client.call_many([(DEPOSIT, state)])
        assert result.ok, result.error
        if chain:
            state = new_state
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small run")
    args = parser.parse_args()
    n = 40 if args.quick else 300
    fresh_n = 2 if args.quick else 6
    depths = (0, 4, 8) if args.quick else (0, 4, 8, 16, 32)

    rows: list[tuple[str, float]] = []
    direct = MCPClient(bank("direct", stateful=False))
    base = per_call(direct, n, None, chain=False)
    rows.append(("direct", base))
    direct.close()

    line = MCPClient(bank("line"))
    rows.append(("line", per_call(line, n, line.initial_state, chain=True)))
    line.close()

    fresh = MCPClient(bank("replay", idle_sessions=0))
    state, replay = fresh.initial_state, {}
    for d in range(max(depths) + 1):
        if d in depths:
            replay[d] = statistics.median(per_call(fresh, 1, state, chain=False) for _ in range(fresh_n))
            rows.append((f"replay@{d}", replay[d]))
        (_, state), = fresh.call_many([(DEPOSIT, state)])
    fresh.close()

    snap = MCPClient(bank("snapshot", "--snapshots", snapshot_tool="snapshot", restore_tool="restore"))
    rows.append(("snapshot", per_call(snap, n, snap.initial_state, chain=True)))
    snap.close()

    print(f"{'mode':<12} {'calls/s':>9} {'time / direct':>14}")
    for mode, seconds in rows:
        print(f"{mode:<12} {1 / seconds:>9.1f} {seconds / base:>14.2f}")
    slope = (replay[depths[-1]] - replay[0]) / depths[-1]
    print(f"replay cost per unit of depth: {slope / base:.2f} direct calls; "
          f"a fresh session (depth 0): {replay[0] / base:.1f} direct calls")


if __name__ == "__main__":
    main()
