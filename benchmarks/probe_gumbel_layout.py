"""Would a [K, B] layout (actions outer, trees in the vector lanes) speed up the compiled Gumbel walk on CPU?

The compiled Gumbel iteration is a few fused C++ functions, but inside them inductor's CPU code
makes one loop over the B trees per reduction over the K actions (max, sum, min, argmax: about a
dozen per walk step, each dependent on the last), and each loop reduces a row of K = 8 values
inside one 16-lane AVX-512 vector. This probe times STEPS interior Gumbel steps (completed Q by
the mixed value, then argmax of the improved policy minus the visit share) over a random table
of B trees, compiled with the search's own inductor options, in two layouts:

  rows   the tree's fields as today, [B * N, K]: each step gathers one row per tree;
  cols   the same fields stored [K, B * N]: each step gathers one column per tree, and every
         reduction over K runs across vectors of 16 trees.

Both must choose the same actions, and the rows variant the actions of mcts's own interior rule.
Prints microseconds per call (process CPU time, 1 thread) and the ratio.

    .venv/bin/python benchmarks/probe_gumbel_layout.py --sizes 1,64,1024
    .venv/bin/python benchmarks/probe_gumbel_layout.py --options '{"cpp.simdlen": 256}'   # other inductor options
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from mcts.action_selection import gumbel_muzero_interior_action_selection
from mcts.base import NodeStats
from mcts.runners import Compiled

K, N, STEPS = 8, 65, 6


def softmax(x: torch.Tensor, d: int) -> torch.Tensor:
    e = (x - x.max(d, keepdim=True).values).exp()
    return e / e.sum(d, keepdim=True)


def interior_step(logits, visits, q, raw, d: int) -> torch.Tensor:
    """gumbel_muzero_interior_action_selection with qtransform_completed_by_mix_value, reducing over dim d."""
    visited = visits > 0
    invalid = torch.isneginf(logits)
    total = visits.sum(d, keepdim=True)
    p = softmax(logits, d).clamp_min(torch.finfo(torch.float32).tiny)
    sp = torch.where(visited, p, 0.0).sum(d, keepdim=True)
    wq = torch.where(visited, p * q / torch.where(sp > 0, sp, 1.0), 0.0).sum(d, keepdim=True)
    mixed = (raw + total * wq) / (total + 1)
    completed = torch.where(visited, q, mixed)
    lo = completed.masked_fill(invalid, float("inf")).min(d, keepdim=True).values
    hi = completed.masked_fill(invalid, float("-inf")).max(d, keepdim=True).values
    completed = ((completed - lo) / (hi - lo).clamp_min(1e-8)).masked_fill(invalid, 0.0)
    sigma = (50.0 + visits.max(d, keepdim=True).values) * 0.1 * completed
    scores = softmax(logits + sigma, d) - visits / (1.0 + total)
    return scores.masked_fill(invalid, float("-inf")).argmax(d)


def table(b: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, N, K, generator=g)
    logits[torch.rand(b, N, K, generator=g) < 0.2] = float("-inf")
    return {
        "logits": logits,
        "visits": torch.randint(0, 5, (b, N, K), generator=g).float(),
        "q": torch.randn(b, N, K, generator=g),
        "raw": torch.randn(b, N, 1, generator=g),
        "child": torch.randint(-1, N, (b, N, K), generator=g),
    }


def walks(t: dict[str, torch.Tensor]):
    b = t["logits"].shape[0]
    offsets = torch.arange(b) * N
    rows = {name: x.reshape(b * N, -1) for name, x in t.items()}
    cols = {name: x.t().contiguous() for name, x in rows.items()}

    def walk(fields, gather, step_dim):
        def run() -> torch.Tensor:
            node, out = torch.zeros(b, dtype=torch.int64), []
            for _ in range(STEPS):
                flat = offsets + node
                action = interior_step(*(gather(fields[f], flat) for f in ("logits", "visits", "q", "raw")), step_dim)
                nxt = fields["child"].reshape(-1)[flat * K + action if step_dim == -1 else action * (b * N) + flat]
                node = torch.where(nxt >= 0, nxt, node)
                out.append(action)
            return torch.stack(out)

        return run

    def real_rule() -> torch.Tensor:
        node, out = torch.zeros(b, dtype=torch.int64), []
        for _ in range(STEPS):
            flat = offsets + node
            lg, cv, q, raw = (rows[f].index_select(0, flat) for f in ("logits", "visits", "q", "raw"))
            stats = NodeStats(depth=torch.zeros(b, dtype=torch.int64), visits=cv.sum(-1), value=raw[:, 0], raw_value=raw[:, 0],
                              prior_logits=lg, children_visits=cv, qvalues=q, invalid=torch.isneginf(lg))
            action = gumbel_muzero_interior_action_selection(stats)
            nxt = rows["child"].reshape(-1)[flat * K + action]
            node = torch.where(nxt >= 0, nxt, node)
            out.append(action)
        return torch.stack(out)

    return {
        "rows": walk(rows, lambda x, flat: x.index_select(0, flat), -1),
        "cols": walk(cols, lambda x, flat: x.index_select(1, flat), 0),
    }, real_rule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,64,1024", help="comma-separated batch sizes B")
    parser.add_argument("--options", default="{}", help="inductor options (JSON) over the search's own")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = {**Compiled.options["cpu"], **json.loads(args.options)}
    for b in (int(s) for s in args.sizes.split(",")):
        variants, real_rule = walks(table(b))
        expected = real_rule()
        per_call = {}
        for name, fn in variants.items():
            compiled = torch.compile(fn, dynamic=False, options=options)
            start = time.perf_counter()
            actions = compiled()
            compile_s = time.perf_counter() - start
            assert torch.equal(actions, expected), f"{name} chose other actions than mcts's interior rule"
            calls = max(20, 2000 * 64 // b)
            for _ in range(5):
                compiled()
            start = time.process_time()
            for _ in range(calls):
                compiled()
            per_call[name] = (time.process_time() - start) / calls
            print(f"B={b} {name}: {per_call[name] * 1e6:.1f} us per {STEPS}-step walk, compile {compile_s:.0f} s")
        print(f"B={b} rows / cols time: {per_call['rows'] / per_call['cols']:.2f}x (same actions as mcts's rule)")


if __name__ == "__main__":
    main()
