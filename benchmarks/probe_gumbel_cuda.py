"""Does gumbel_muzero_policy(compiled=True) build on CUDA, and how fast does it run? One search
shape per process (a failed Triton build can leave the process unusable).

Builds the compiled search with the options given (over the policy's own: it passes
max_fusion_size=8 on CUDA, inductor's default is 64), times it, then the default CUDA graphs in
the same process (bench_mcts.batched for both), and compares root visits. `--expand eager`
hides that the environment is graph-safe: the expand function runs between compiled selection
and backup (the form an LLM policy's search takes).

    python3 benchmarks/probe_gumbel_cuda.py --size 64
    python3 benchmarks/probe_gumbel_cuda.py --size 64 --options '{"max_fusion_size": 64}'
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

import mcts
from mcts.runners import Compiled
from mcts.synthetic import SyntheticEnv

sys.path.insert(0, str(Path(__file__).parent))
from bench_mcts import batched  # noqa: I001 -- the benchmark's timing of one batched search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="trees per batch B")
    parser.add_argument("--expand", choices=["compiled", "eager"], default="compiled")
    parser.add_argument("--options", default="{}", help="inductor options (JSON) for this search")
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs the same probe on the C++ path")
    parser.add_argument("--repeats", type=int, default=2, help="timed searches per path; the fastest counts")
    args = parser.parse_args()
    options = json.loads(args.options)
    compiler = Compiled.compiler
    Compiled.compiler = staticmethod(lambda fn, given: compiler(fn, {**given, **options}))
    b, split = args.size, args.expand == "eager"
    env = SyntheticEnv(num_actions=8, depth=6, discount=0.97)

    def best(**kwargs) -> tuple[float, torch.Tensor, float]:
        runs = [batched(env, mcts.gumbel_muzero_policy, b, 64, 1, args.device, split=split, **kwargs) for _ in range(args.repeats)]
        return max(r[0] for r in runs), runs[0][1], runs[0][2]

    label = f"gumbel_muzero_policy B={b} expand={args.expand} options={options}"
    try:
        rate, visits, compile_seconds = best(compiled=True)
    except Exception as e:  # noqa: BLE001 -- the probe reports any build failure
        print(f"FAILED {label}: {type(e).__name__}")
        traceback.print_exc()
        return
    graphs, graph_visits, _ = best(graphs=args.device == "cuda")
    same = sum(torch.equal(x, y) for x, y in zip(visits, graph_visits))
    print(f"RESULT {label}: compiled {rate:,.0f} sim/s (first search, compiling: {compile_seconds:.0f} s), "
          f"{'CUDA graphs' if args.device == 'cuda' else 'eager'} {graphs:,.0f} sim/s, root visits equal in {same}/{b} trees")


if __name__ == "__main__":
    main()
