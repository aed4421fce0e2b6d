"""Would torch.compile speed up the mcts core on CPU without changing its results? One probe.

Compiles the PUCT selection rule (mcts.action_selection.puct_scores plus the tie-break noise,
passed in) with inductor and compares it with eager on random nodes: chosen actions, whether
the scores are bit-identical, and the CPU time per call. The search must give the same trees
as eager, so a compiled step has to match eager bit for bit, not only in its argmax.

    .venv/bin/python benchmarks/bench_mcts_compile.py
"""

from __future__ import annotations

import time

import torch

from mcts.action_selection import TIE_BREAK_SCALE, masked_argmax, puct_scores
from mcts.base import NodeStats


def scores(logits, counts, q, value, visits, noise):
    """mcts.puct_action_selection with its tie-break noise passed in (a generator breaks the graph)."""
    stats = NodeStats(depth=visits.long(), visits=visits, value=value, raw_value=value, prior_logits=logits,
                      children_visits=counts, qvalues=q, invalid=torch.isneginf(logits))
    s = puct_scores(stats) + TIE_BREAK_SCALE * noise
    return masked_argmax(s, stats.invalid), s


def inputs(b: int, k: int = 8):
    g = torch.Generator().manual_seed(b)
    logits = torch.randn(b, k, generator=g)
    logits[torch.rand(b, k, generator=g) < 0.25] = float("-inf")
    logits[:, 0] = 0.3
    counts = torch.randint(0, 5, (b, k), generator=g).float()
    q = torch.rand(b, k, generator=g)
    return logits, counts, q, torch.rand(b, generator=g), counts.sum(-1) + 1, torch.rand(b, k, generator=g)


def per_call(fn, args, calls: int = 2000) -> float:
    for _ in range(50):
        fn(*args)
    start = time.process_time()
    for _ in range(calls):
        fn(*args)
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    torch.set_num_threads(1)
    compiled = torch.compile(scores, dynamic=True, fullgraph=True)
    began = time.process_time()
    for b in (1, 64, 1024, 37):
        args = inputs(b)
        a1, s1 = scores(*args)
        a2, s2 = compiled(*args)
        diff = (s1 - s2).abs().nan_to_num().max().item()
        print(f"B={b:5d}: same actions {torch.equal(a1, a2)}, bit-identical scores {torch.equal(s1, s2)}, max |diff| {diff:.2e}")
    print(f"compile + checks: {time.process_time() - began:.1f} s CPU")
    args = inputs(37)
    eager_us, compiled_us = per_call(scores, args), per_call(compiled, args)
    print(f"B=37 per call: eager {eager_us:.0f} us, compiled {compiled_us:.0f} us ({eager_us / compiled_us:.2f}x)")


if __name__ == "__main__":
    main()
