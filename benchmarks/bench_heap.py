"""Generation speed of the `hf` backend under the C-heap settings a pipeline process passes through.

A pipeline trains on CPU and then searches and evaluates in the same process. Training maps
every block over 128 KiB (`dataengine.heap.map_large_blocks`, for its memory); generation
allocates and frees the same KV and logits blocks at every decode step. Each mode runs in its
own process (glibc's threshold cannot be reset), on the same workload: SmolLM2, 8 arithmetic
root prompts and the same 8 after their first tool result (bench_policy.py's states), K = 2
samples, 48 new tokens, temperature 0.7, after one warm-up call. Modes:

- `default`: glibc as a fresh process has it (the baseline);
- `mapped`: after `map_large_blocks`, the state a CPU training stage used to leave behind;
- `restored`: `map_large_blocks` then `serve_from_heap`, what a trainer leaves now.

Prints generated tokens/s per mode and each mode's ratio to `default` (same run), the timed
part's user and system CPU seconds and minor page faults (what a mapped block costs: fresh
zeroed pages at every decode step; steadier than tokens/s on a shared machine), and checks
that every mode sampled the same tokens.

    .venv/bin/python benchmarks/bench_heap.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

MODES = ("default", "mapped", "restored")


def run_mode(mode: str, repeats: int) -> dict:
    from bench_policy import build_states

    from dataengine import heap
    from dataengine.policy.hf import HFPolicy

    if mode in ("mapped", "restored"):
        heap.map_large_blocks()
    if mode == "restored":
        heap.serve_from_heap()
    roots, children = build_states(8)
    policy = HFPolicy.load("smollm2")
    policy.sample(roots[:2], 2, max_new_tokens=4, temperature=0.7, seed=99)  # warm-up
    rates, ids = [], []
    usage = resource.getrusage(resource.RUSAGE_SELF)
    for r in range(repeats):
        before = policy.stats.generated_tokens
        start = time.perf_counter()
        out = [policy.sample(convs, 2, max_new_tokens=48, temperature=0.7, seed=r) for convs in (roots, children)]
        seconds = time.perf_counter() - start
        rates.append((policy.stats.generated_tokens - before) / seconds)
        ids.append([s.token_ids for batch in out for row in batch for s in row])
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"mode": mode, "tok_s": rates, "ids": ids, "user_s": after.ru_utime - usage.ru_utime,
            "sys_s": after.ru_stime - usage.ru_stime, "minor_faults": after.ru_minflt - usage.ru_minflt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per mode (the median is reported)")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in a child process
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.repeats)))
        return
    results = {}
    for mode in MODES:
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--repeats", str(args.repeats)],
                             check=True, capture_output=True, text=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results["default"]
    base_rate = statistics.median(base["tok_s"])
    print("SmolLM2, 2 x 8 arithmetic prompts x K=2, 48 new tokens; median of", args.repeats, "repeats")
    for mode in MODES:
        res = results[mode]
        rate = statistics.median(res["tok_s"])
        print(f"{mode:9s} {rate:6.1f} generated tok/s ({rate / base_rate:4.2f}x default); timed part: "
              f"user {res['user_s']:6.1f} s, system {res['sys_s']:5.1f} s ({res['sys_s'] / base['sys_s']:4.1f}x), "
              f"{res['minor_faults']:,} page faults; same tokens as default: {res['ids'] == base['ids']}")


if __name__ == "__main__":
    main()
