"""What one decode step of the `hf` backend costs against how many rows it decodes.

SmolLM2 on CPU, arithmetic root prompts (~750 tokens, prefix cached by a warm-up call),
temperature 0.7, 32 new tokens: for each (prompts x samples) shape, the generated tokens per
second and the wall time per decode step. At small row counts a step costs about the same
whatever the rows (the weights are streamed once per step), so a search's wall time follows the
number of decode steps it takes, not the tokens: more rows per step (more trees per batch, more
leaves per iteration) is nearly free.

    .venv/bin/python benchmarks/bench_decode_rows.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

SHAPES = [(1, 2), (1, 4), (4, 2), (8, 2), (8, 4), (16, 4)]
NEW_TOKENS = 32


def main() -> None:
    from bench_policy import build_states

    from dataengine.policy.hf import HFPolicy

    convs = build_states(max(n for n, _ in SHAPES))[0]
    policy = HFPolicy.load("smollm2")
    print(f"model {policy.model_id}, {NEW_TOKENS} new tokens, temperature 0.7")
    for n, k in SHAPES:
        policy.sample(convs[:n], k, max_new_tokens=4, temperature=0.7, seed=99)  # prefixes cached
        before = policy.stats.generated_tokens
        start = time.perf_counter()
        policy.sample(convs[:n], k, max_new_tokens=NEW_TOKENS, temperature=0.7, seed=1)
        seconds = time.perf_counter() - start
        tokens = policy.stats.generated_tokens - before
        print(f"rows {n * k:3d} ({n} prompts x {k}): {tokens:5d} tokens in {seconds:5.2f} s, "
              f"{tokens / seconds:6.1f} tok/s, {seconds / NEW_TOKENS * 1000:4.0f} ms per step (wall / {NEW_TOKENS})")


if __name__ == "__main__":
    main()
