"""Sandboxed tool calls per second against calling the tool in-process, measured in one run.

    .venv/bin/python benchmarks/bench_sandbox.py            # default size (well under 2 min)
    .venv/bin/python benchmarks/bench_sandbox.py --quick    # a few seconds

Prints calls/s for a trivial tool (`add`) in-process, through `Sandbox.call` one at a time,
and through `Sandbox.call_many` in batches; the same for a tool that waits 20 ms (what a
real API or database tool looks like), where batches run in parallel across workers; and the
worker start times (cold pool, and replacing a worker after a crash). Last, the cost of a call
that shares nothing (each call in a process forked from a template worker, the default)
against the reused worker of earlier versions (`Sandbox(fork_calls=False)`), both measured
here, interleaved, as ms per call and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataengine.tools.registry import get_toolbox  # noqa: E402
from dataengine.tools.sandbox import Sandbox  # noqa: E402
from dataengine.types import ToolCall  # noqa: E402


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny run (a few seconds)")
    parser.add_argument("--workers", type=int, default=2, help="sandbox worker processes")
    args = parser.parse_args()
    n = 300 if args.quick else 3000
    batch = 64
    naps = 16 if args.quick else 64

    add = get_toolbox("testing").tools["add"].fn
    call = ToolCall(name="add", arguments={"a": 1, "b": 2})

    start = time.perf_counter()
    for _ in range(n * 10):
        add(**call.arguments)
    in_process = rate(n * 10, time.perf_counter() - start)

    sleep = get_toolbox("testing").tools["sleep"].fn
    start = time.perf_counter()
    for _ in range(naps):
        sleep(0.02)
    nap_in_process = rate(naps, time.perf_counter() - start)

    start = time.perf_counter()
    sandbox = Sandbox(workers=args.workers)
    sandbox.wait_ready()
    cold_start = time.perf_counter() - start
    with sandbox:
        sandbox.call_many([("testing", call, None)] * args.workers * 2)  # toolbox import in every worker

        start = time.perf_counter()
        for _ in range(n):
            sandbox.call("testing", call)
        sequential = rate(n, time.perf_counter() - start)

        start = time.perf_counter()
        for _ in range(n // batch):
            sandbox.call_many([("testing", call, None)] * batch)
        batched = rate(n // batch * batch, time.perf_counter() - start)

        nap = ToolCall(name="sleep", arguments={"seconds": 0.02})
        start = time.perf_counter()
        for _ in range(naps):
            sandbox.call("testing", nap)
        nap_sequential = rate(naps, time.perf_counter() - start)
        start = time.perf_counter()
        sandbox.call_many([("testing", nap, None)] * naps)
        nap_batched = rate(naps, time.perf_counter() - start)

        state_rows = []
        for megabytes in ([0.1] if args.quick else [0.1, 1.3]):
            # A synthetic database of about `megabytes` MB of JSON (tau2 retail is 1.3 MB).
            rows = int(megabytes * 1e6 / 45)
            state = {"items": [], "db": {f"{i:07d}": {"name": "x" * 12, "price": i} for i in range(rows)}}
            for label, tool, arguments in [("write (push)", "push", {"item": "a"}), ("read-only (count)", "count", {}),
                                           ("stateless (add)", "add", {"a": 1, "b": 2})]:
                one = ToolCall(name=tool, arguments=arguments)
                sandbox.call("testing", one, state)
                reps = 3 if args.quick else 10
                start = time.perf_counter()
                for _ in range(reps):
                    assert sandbox.call("testing", one, state)[0].ok
                state_rows.append((megabytes, label, (time.perf_counter() - start) / reps * 1000))

        replace_times = []
        for _ in range(3 if args.quick else 10):
            start = time.perf_counter()
            result, _ = sandbox.call("testing", ToolCall(name="hard_exit", arguments={"code": 1}))
            assert result.status == "crash"
            sandbox.wait_ready()
            sandbox.call_many([("testing", call, None)] * args.workers * 2)
            replace_times.append(time.perf_counter() - start)

    isolation_rows = fork_against_reuse(args.workers, n // 3, call)

    print(f"workers={args.workers} n={n} batch={batch} (2-core machine shared with other jobs: noisy)")
    print(f"{'tool add, in-process':34s} {in_process:12,.0f} calls/s  (baseline)")
    print(f"{'tool add, Sandbox.call':34s} {sequential:12,.0f} calls/s  ratio {sequential / in_process:.5f}")
    print(f"{'tool add, Sandbox.call_many':34s} {batched:12,.0f} calls/s  ratio {batched / in_process:.5f}"
          f"  ({batched / sequential:.2f}x Sandbox.call)")
    print(f"{'tool sleep 20 ms, in-process':34s} {nap_in_process:12,.1f} calls/s  (baseline)")
    print(f"{'tool sleep 20 ms, Sandbox.call':34s} {nap_sequential:12,.1f} calls/s  ratio {nap_sequential / nap_in_process:.2f}")
    print(f"{'tool sleep 20 ms, Sandbox.call_many':34s} {nap_batched:12,.1f} calls/s  ratio {nap_batched / nap_in_process:.2f}"
          f"  ({nap_batched / nap_sequential:.2f}x Sandbox.call)")
    for megabytes, label, ms in state_rows:
        print(f"tool state {megabytes:.1f} MB, {label:18s} {ms:8.1f} ms/call")
    print(f"cold start of the pool (fork server + {args.workers} workers): {cold_start:.2f} s")
    print(f"crash -> replaced worker -> first call done: median {statistics.median(replace_times) * 1000:.0f} ms")
    for label, forked, reused in isolation_rows:
        print(f"{label:34s} fork per call {forked:7.3f} ms, reused worker {reused:7.3f} ms: ratio {forked / reused:.2f}")


def fork_against_reuse(workers: int, n: int, call: ToolCall) -> list[tuple[str, float, float]]:
    """[(case, ms per call with fork_calls, ms per call with a reused worker)], the two pools
    measured in alternating rounds so load on the machine hits both alike."""
    state = {"items": [], "db": {f"{i:07d}": {"name": "x" * 12, "price": i} for i in range(2000)}}
    cases = [("tool add, Sandbox.call", [("testing", call, None)], 1),
             ("tool add, Sandbox.call_many x64", [("testing", call, None)] * 64, 64),
             ("tool push, 0.1 MB state", [("testing", ToolCall(name="push", arguments={"item": "a"}), state)], 1)]
    pools = {True: Sandbox(workers=workers), False: Sandbox(workers=workers, fork_calls=False)}
    times: dict[tuple[str, bool], list[float]] = {}
    try:
        for sandbox in pools.values():
            sandbox.wait_ready()
            sandbox.call_many([("testing", call, None)] * workers * 2)
        for _ in range(5):
            for label, items, per in cases:
                for forked, sandbox in pools.items():
                    reps = max(1, n // per // 5)
                    start = time.perf_counter()
                    for _ in range(reps):
                        sandbox.call_many(items)
                    times.setdefault((label, forked), []).append((time.perf_counter() - start) / (reps * per) * 1000)
    finally:
        for sandbox in pools.values():
            sandbox.close()
    return [(label, statistics.median(times[label, True]), statistics.median(times[label, False]))
            for label, _, _ in cases]


if __name__ == "__main__":
    main()
