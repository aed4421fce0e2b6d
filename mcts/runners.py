"""How the fixed-step runner (`mcts.fixed_steps.search_fixed_steps`) runs a fixed-step function
`fn(steps, generator)`: recorded once and replayed as CUDA graphs, or compiled by torch.compile
(C++ on CPU, Triton kernels on CUDA).

Both need `fn` to read and write only tensors that live across calls and to take a fixed number
of steps, never asking the device anything; mcts.search supplies such functions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._inductor.exc import InductorError

from mcts.action_selection import NoiseTape
from mcts.base import ActionSelectionFn


class CudaGraphs:
    """Runs `fn(steps, generator)` eagerly the first time it sees `name`, then records it in a CUDA graph
    the first time it sees each `steps` and replays that graph from then on, returning the
    graph's (fixed) output tensors.

    A graph replays the same kernels on the same memory: `fn` must read and write only tensors
    that live across calls (the tree's, `done`, the backup's inputs) and must not ask the device
    anything (no `.item()`, `.any()` in Python, `nonzero`). The eager first call fills the caches
    a capture must not create (the Gumbel halving table, say).
    """

    def __init__(self, generator: torch.Generator | None):
        self.generator = generator
        self.warm: set[str] = set()
        self.graphs: dict[tuple[str, int], tuple[Any, Any]] = {}

    def __call__(self, name: str, fn: Callable[[int, Any], Any], steps: int) -> Any:
        if name not in self.warm:
            self.warm.add(name)
            return fn(steps, self.generator)
        key = (name, steps)
        if key not in self.graphs:
            graph = torch.cuda.CUDAGraph()
            if self.generator is not None:
                graph.register_generator_state(self.generator)
            # capture_begin/end on a side stream, as torch.cuda.graph does, without its
            # gc.collect() and empty_cache() per capture.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                graph.capture_begin()
                try:
                    out = fn(steps, self.generator)
                finally:
                    graph.capture_end()
            torch.cuda.current_stream().wait_stream(side)
            self.graphs[key] = (graph, out)
        graph, out = self.graphs[key]
        graph.replay()
        return out


class Compiled:
    """Runs `fn(steps, generator)` compiled by torch.compile (inductor): a selection walk,
    a backup or whole iterations (with a graph-safe expand function) become a few fused C++
    loops (CPU) or Triton kernels (CUDA) instead of hundreds of ATen calls, each paying Python
    and dispatch overhead (and on CUDA a kernel launch). Same contract for `fn` as CudaGraphs (fixed tensors, no
    data-dependent shapes, nothing asked of the data from Python).

    Compiled code cannot call a torch.Generator, so the rules draw their tie-break noise from a
    NoiseTape filled before the call: room for one `[B, K]` draw per rule call (`rule_calls[name]`
    per walk step), the first time; afterwards exactly what that call took (learnt from the tape, padded
    to the compiled shape). The generator is then moved on by exactly the numbers used, as the
    eager loop moves it. Every call is compiled, so a search gives the same tree whatever ran
    before it in the process. A CUDA generator's one flat draw is not the same numbers as the
    draws made one by one (Philox offsets), so on CUDA exact ties can break another way than in
    the eager loop.
    """

    # Each (function, walk length, batch shape, rule) is one compiled variant. Past torch's
    # limit (8 by default) dynamo would run eagerly, which rounds differently and so changes
    # the trees: allow more, and fail loudly instead of falling back.
    RECOMPILE_LIMIT = 256
    # Inductor's options per device. On CPU its C++ wrapper, with stack allocation: otherwise
    # the wrapper creates a heap tensor for each of the ~490 intermediate buffers of a whole
    # Gumbel iteration on every call, which at B = 1 cost more than the arithmetic (docs/mcts.md).
    # Inductor keeps buffers on the heap when they total over 100 KB (large B). It picks its C++
    # wrapper class once per process, at the first CPU compile: if another compile came first
    # with the option off, this one runs without it. A stack-allocated output is copied into a
    # buffer the same compiled function reuses on its next call: the search uses each step's
    # outputs before that. On CUDA its Python wrapper around the Triton kernels (the measured path).
    options = {
        "cpu": {"cpp_wrapper": True, "aot_inductor.allow_stack_allocation": True},
        "cuda": {},
    }
    # What compiles `fn`; the tests swap in the identity to check the tape against the eager loop.
    compiler = staticmethod(lambda fn, options: torch.compile(fn, dynamic=False, options=options))
    # (signature, name, fn's code, steps) -> noise values one call takes, for the whole process.
    used: dict[tuple[Any, ...], int] = {}
    entry: dict[Any, Callable[..., Any]] = {}

    def __init__(
        self, generator: torch.Generator | None, batch_size: int, num_actions: int, signature: Any,
        rule_calls: dict[str, int], device: torch.device = torch.device("cpu"), extra_options: dict[str, Any] | None = None,
    ):
        if generator is None:
            generator = torch.cuda.default_generators[device.index or 0] if device.type == "cuda" else torch.default_generator
        self.generator = generator
        self.device = device
        self.rule_calls = rule_calls
        self.draw = batch_size * num_actions
        self.signature = (batch_size, num_actions, signature)
        self.compile_options = tuple(sorted({**self.options.get(device.type, {}), **(extra_options or {})}.items()))
        # The noise a learnt call is handed, per (name, steps): filled in place each call
        # (zeros past what the call takes), rather than drawn and padded into a new tensor.
        self.tapes: dict[tuple[str, int], torch.Tensor] = {}

    def settings(self) -> Any:
        """Dynamo's settings, entered once per search: patched around every call they were a
        visible share of a compiled step at B = 1 (cProfile)."""
        return torch._dynamo.config.patch(recompile_limit=self.RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True)

    def __call__(self, name: str, fn: Callable[[int, Any], Any], steps: int) -> Any:
        room = self.rule_calls[name] * steps * self.draw
        key = (self.signature, name, fn.__code__, steps)
        used = self.used.get(key)
        state = self.generator.get_state() if used is None else None
        if used is None:
            noise = torch.rand(room, generator=self.generator, device=self.device)
        else:
            noise = self.tapes.get((name, steps))
            if noise is None:
                noise = self.tapes[name, steps] = torch.zeros(room, device=self.device)
            if used:
                torch.rand(used, generator=self.generator, device=self.device, out=noise[:used])
        tape = NoiseTape(noise=noise)
        # One compiled entry point for every search: dynamo keys its code on fn's code, so a new
        # search's closure reuses the compiled variants (torch.compile per search costs ~1.6 ms).
        compiled = self.entry.get((self.compiler, self.compile_options))
        if compiled is None:
            compiled = self.entry[self.compiler, self.compile_options] = self.compiler(_call, dict(self.compile_options))
        try:
            out = compiled(fn, steps, tape)
        except InductorError as e:
            # Seen on CUDA: Triton failed to build the Gumbel search's fused kernel (torch 2.11).
            if state is not None:
                self.generator.set_state(state)
            reason = str(e).strip().splitlines()[-1][:300]
            raise RuntimeError(
                f"compiled=True: torch.compile could not build this search's {name} step on {self.device.type} "
                f"({reason}); run it with compiled=False"
                + (" (CUDA graphs)" if self.device.type == "cuda" else "")
            ) from e
        if state is not None:
            # Move the generator on by what the call took, not by the room it was given.
            self.used[key] = tape.offset
            self.generator.set_state(state)
            torch.rand(tape.offset, generator=self.generator, device=self.device)
        elif tape.offset != used:
            raise RuntimeError(
                f"compiled search: the selection rules drew {tape.offset} noise values where an earlier search "
                f"of the same kind drew {used}; a rule whose draws change between searches needs compiled=False"
            )
        return out


def _call(fn: Callable[[int, Any], Any], steps: int, tape: NoiseTape) -> Any:
    return fn(steps, tape)


def rule_key(rule: ActionSelectionFn) -> Any:
    """What decides a selection rule's draws: its function, not its constants (the built-in
    rules draw once per call or never, whatever their parameters)."""
    if isinstance(rule, functools.partial):
        return rule.func, tuple(sorted(rule.keywords))
    return rule
