"""Does gumbel_muzero_policy(compiled=True) build on CUDA, and how fast does it run? One search
shape per process (a failed Triton build can leave the process unusable).

Builds the compiled search with the options given (over the policy's own: it passes
max_fusion_size=8 on CUDA, inductor's default is 64), times the second search,
then the default CUDA graphs in the same process, and compares root visits. `--expand eager`
hides that the environment is graph-safe: the expand function runs between compiled selection
and backup (the form an LLM policy's search takes).

    python3 benchmarks/probe_gumbel_cuda.py --size 64
    python3 benchmarks/probe_gumbel_cuda.py --size 64 --options '{"max_fusion_size": 64}'
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch

import mcts
from mcts.runners import Compiled
from mcts.synthetic import SyntheticEnv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="trees per batch B")
    parser.add_argument("--expand", choices=["compiled", "eager"], default="compiled")
    parser.add_argument("--options", default="{}", help="inductor options (JSON) for this search")
    args = parser.parse_args()
    options = json.loads(args.options)
    compiler = Compiled.compiler
    Compiled.compiler = staticmethod(lambda fn, given: compiler(fn, {**given, **options}))
    b = args.size
    env = SyntheticEnv(num_actions=8, depth=6, discount=0.97)
    expand = env.expand if args.expand == "compiled" else (lambda p, a, v: env.expand(p, a, v))

    def run(**kwargs) -> tuple[float, torch.Tensor]:
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = mcts.gumbel_muzero_policy(env.root(b, device="cuda"), expand, num_simulations=64, device="cuda", **kwargs)
        torch.cuda.synchronize()
        return b * 64 / (time.perf_counter() - start), out.search_tree.children_visits[:, 0].cpu()

    label = f"gumbel_muzero_policy B={b} expand={args.expand} options={options}"
    try:
        start = time.perf_counter()
        run(compiled=True)
        compile_seconds = time.perf_counter() - start
        rate, visits = max((run(compiled=True) for _ in range(2)), key=lambda r: r[0])
    except Exception as e:  # noqa: BLE001 -- the probe reports any build failure
        print(f"FAILED {label}: {type(e).__name__}")
        traceback.print_exc()
        return
    run()  # the graphs' warm-up
    graphs, graph_visits = max((run() for _ in range(2)), key=lambda r: r[0])
    same = sum(torch.equal(x, y) for x, y in zip(visits, graph_visits))
    print(f"RESULT {label}: compiled {rate:,.0f} sim/s (first search, compiling: {compile_seconds:.0f} s), "
          f"CUDA graphs {graphs:,.0f} sim/s, root visits equal in {same}/{b} trees")


if __name__ == "__main__":
    main()
