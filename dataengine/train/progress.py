"""Training progress the user can see: transformers' tqdm step bar (rate, ETA) when stderr is a
terminal; otherwise one line every `DATAENGINE_TRAIN_LOG_EVERY` seconds (default 30; 0: every
step; negative: none) with step/max_steps, the last logged loss (and reward), elapsed time and ETA.
A run shorter than the interval prints nothing, so tests stay quiet."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TextIO

EVERY_ENV = "DATAENGINE_TRAIN_LOG_EVERY"
DEFAULT_EVERY_S = 30.0


def bar_wanted() -> bool:
    """Whether training shows tqdm's step bar (stderr is a terminal)."""
    return sys.stderr.isatty()


def log_every_s() -> float | None:
    """Seconds between progress lines from DATAENGINE_TRAIN_LOG_EVERY (None: no lines)."""
    raw = os.environ.get(EVERY_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{EVERY_ENV}={raw!r}: expected seconds between progress lines (negative: none)") from None
    return value if value >= 0 else None


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(max(seconds, 0.0))))


def step_log_class() -> type:
    """The TrainerCallback class (built here so transformers is imported only when training)."""
    from transformers import TrainerCallback

    class StepLog(TrainerCallback):
        """Writes `<label>: step S/M (P%) loss L reward R | elapsed, ETA, s/step` to `stream`
        when `every_s` seconds passed since the last line; the values are the latest logged."""

        def __init__(self, label: str, every_s: float, stream: TextIO | None = None,
                     clock: Callable[[], float] = time.monotonic) -> None:
            self.label, self.every_s, self.stream, self.clock = label, every_s, stream, clock
            self.latest: dict[str, float] = {}
            self.pending = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = self.last = self.clock()
            self.start_step = state.global_step

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._flush(state)  # a due line whose step logged nothing
            self.pending = self.clock() - self.last >= self.every_s

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            for key in ("loss", "reward"):
                if isinstance((logs or {}).get(key), (int, float)):
                    self.latest[key] = float(logs[key])
            self._flush(state)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._flush(state)

        def _flush(self, state: Any) -> None:
            if not self.pending:
                return
            self.pending = False
            now = self.clock()
            self.last = now
            step, total = state.global_step, state.max_steps
            elapsed = now - self.start
            done = max(step - self.start_step, 1)
            per_step = elapsed / done
            parts = [f"{self.label}: step {step}/{total}" + (f" ({100 * step / total:.0f}%)" if total else "")]
            parts += [f"{k} {v:.4g}" for k, v in self.latest.items()]
            eta = f", ETA {_clock(per_step * (total - step))}" if total and total >= step else ""
            line = " ".join(parts) + f" | {_clock(elapsed)} elapsed{eta}, {per_step:.2f} s/step"
            print(line, file=self.stream or sys.stderr, flush=True)

    return StepLog


def attach_progress(trainer: Any, label: str) -> Any:
    """Give `trainer` its progress display: with tqdm on (trl_kwargs turns it on for a terminal)
    transformers' bar stays; otherwise transformers' PrinterCallback (every log dict printed to
    stdout) is replaced by StepLog lines. Returns the trainer."""
    if getattr(trainer.args, "disable_tqdm", False):
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)
        every = log_every_s()
        if every is not None:
            trainer.add_callback(step_log_class()(label, every))
    return trainer
