"""Progress of a stage over trees: a rich bar on a terminal, a log line every `every_s` seconds
otherwise (output to a file, CI, a Prefect task's run logger), each with the rate and an ETA."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Self

FIELDS = ("trees_done", "simulations", "tokens", "successes")


class Progress:
    """Progress over `trees` trees with simulations, tokens and successes.

    update(shard_totals): running totals of the current shard; finish_shard(): fold them in.
    """

    def __init__(self, trees: int, label: str, *, enabled: bool = True, every_s: float = 30.0,
                 terminal: bool | None = None, log: Callable[[str], None] | None = None) -> None:
        self.trees, self.label, self.enabled, self.every_s = trees, label, enabled, every_s
        self.base = dict.fromkeys(FIELDS, 0)
        self.current = dict(self.base)
        self.started = self.last_line = time.perf_counter()
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        # Lines go to `log` when given (a Prefect run logger), else to stderr.
        self.log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        self.bar = None
        if enabled and self.terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(
                TextColumn(f"[bold]{label}[/] trees"), BarColumn(), MofNCompleteColumn(),
                TextColumn("sims {task.fields[simulations]}  tokens {task.fields[tokens]}  "
                           "successes {task.fields[successes]}"),
                TimeElapsedColumn(), TimeRemainingColumn(),
            )
            self.task = self.bar.add_task("trees", total=trees, simulations=0, tokens=0, successes=0)

    def __enter__(self) -> Self:
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        elif self.enabled and not any(exc):
            self._line(final=True)

    def update(self, shard: dict[str, int]) -> None:
        if not self.enabled:
            return
        self.current = {k: self.base[k] + shard.get(k, 0) for k in FIELDS}
        if self.bar is not None:
            self.bar.update(self.task, completed=self.current["trees_done"], simulations=self.current["simulations"],
                            tokens=self.current["tokens"], successes=self.current["successes"])
        elif time.perf_counter() - self.last_line >= self.every_s:
            self._line()

    def finish_shard(self) -> None:
        self.base = dict(self.current)

    def line(self) -> str:
        """One plain progress line: done/total, rate, ETA and the counters."""
        c, elapsed = self.current, time.perf_counter() - self.started
        rate = c["tokens"] / elapsed if elapsed > 0 else 0.0
        done = c["trees_done"]
        eta = f"{elapsed / done * (self.trees - done):.0f} s" if done else "?"
        return (f"{self.label}: {done}/{self.trees} trees, {c['simulations']} sims, {c['tokens']} tokens "
                f"({rate:.1f} tok/s), {c['successes']} successes, {elapsed:.0f} s elapsed, ETA {eta}")

    def _line(self, final: bool = False) -> None:
        self.last_line = time.perf_counter()
        self.log(self.line() + (" (done)" if final else ""))
