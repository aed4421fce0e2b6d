"""LLM search benchmark: MCTS against best-of-N sampling at equal generated-token budgets.

    .venv/bin/python benchmarks/bench_search.py            # SmolLM2, arithmetic, ~5 min on 2 cores
    .venv/bin/python benchmarks/bench_search.py --quick    # tiny run

Both methods search the same arithmetic tasks with the same policy (SmolLM2-135M-Instruct with
the few-shot tool prompt), the same per-task budget of generated tokens, and write their rows
to a throwaway store (store writes are inside the timed runs). Printed:

- share of wall time outside the model in the MCTS run (env steps, verifiers, tree core, store
  writes; model load and sandbox start are excluded): target under 5%;
- successes per million generated tokens (successful trajectories, distinct successful
  trajectories, solved tasks) for MCTS and best-of-N, and their ratios (best-of-N = 1.00).
  best-of-N's per-task budget is what MCTS actually spent per task (MCTS stops spending on a
  tree whose leaves are all terminal), so both generate about the same number of tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataengine.config import load_config
from dataengine.env import ToolEnv
from dataengine.search import generate, make_policy_from_config
from dataengine.suites import generate_suite
from dataengine.tools.sandbox import Sandbox
from storage import Store


def per_million(count: int, tokens: int) -> float:
    return 1e6 * count / tokens if tokens else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny run (2 tasks, small budget)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--suite", default="arithmetic", help="suite searched (notool: tasks SmolLM2 can solve without tools)")
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--budget", type=int, default=600, help="generated tokens per task, both methods")
    parser.add_argument("--sims", type=int, default=32, help="MCTS simulations per tree (the budget usually ends first)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--algorithm", default="gumbel", choices=["puct", "uct", "gumbel"])
    parser.add_argument("--value", default="zero", choices=["zero", "rollout", "critic"])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.budget, args.sims = 2, 200, 8

    cfg = load_config(
        None,
        seed=args.seed,
        num_tasks=args.tasks,
        shard_size=args.tasks,
        policy__model=args.model,
        policy__device="cpu",
        policy__max_new_tokens=args.max_new_tokens,
        search__algorithm=args.algorithm,
        search__num_simulations=args.sims,
        search__num_actions=args.k,
        search__value=args.value,
        search__max_generated_tokens=args.budget,
        search__trees_per_batch=args.tasks,
        search__max_depth=4,
        env__max_steps=4,
    )
    # One-call problems (and tool-free ones): the ones SmolLM2 can solve at all.
    tasks = [t for t in generate_suite(args.suite, n_train=8 * args.tasks, n_heldout=0, seed=args.seed) if len(t.gold.calls) <= 1]
    tasks = tasks[: args.tasks]
    start = time.perf_counter()
    policy = make_policy_from_config(cfg)
    print(f"model {policy.model_id} loaded in {time.perf_counter() - start:.1f} s; {len(tasks)} tasks, "
          f"{args.suite}, {args.budget} generated tokens per task, K={args.k}, {args.algorithm}, value={args.value}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp, Sandbox(workers=2, preload=sorted({t.toolbox for t in tasks})) as sandbox:
        env = ToolEnv(sandbox, max_steps=cfg.env.max_steps)
        sandbox.wait_ready()
        store = Store(Path(tmp) / "store")
        for method in ("mcts", "best_of_n"):
            if method == "best_of_n":
                # Equal tokens: best-of-N gets what MCTS actually spent per task (a tree whose
                # leaves are all terminal stops spending before its budget).
                spent = max(1, results["mcts"][0].generated_tokens // len(tasks))
                cfg = cfg.model_copy(update={"search": cfg.search.model_copy(update={"max_generated_tokens": spent})})
            summary = generate(cfg, method=method, tasks=tasks, store=store, policy=policy, env=env, n=10_000, progress=False)
            trajs = store.trajectories().collect().filter(store.trajectories().collect()["run_id"] == summary.run_id)
            ok = trajs.filter(trajs["success"])
            results[method] = (summary, ok["traj_hash"].n_unique())
    print()
    print(f"{'method':<10} {'tokens':>7} {'wall s':>7} {'model s':>8} {'outside':>8} {'succ traj':>9} {'distinct':>8} "
          f"{'solved':>6} {'succ/Mtok':>9} {'dist/Mtok':>9} {'solved/Mtok':>11}")
    for method, (s, distinct) in results.items():
        print(f"{method:<10} {s.generated_tokens:>7} {s.seconds:>7.1f} {s.model_seconds:>8.1f} {s.outside_model_share:>8.1%} "
              f"{s.successes:>9} {distinct:>8} {s.solved:>6} {s.successes_per_million_tokens:>9.0f} "
              f"{per_million(distinct, s.generated_tokens):>9.0f} {per_million(s.solved, s.generated_tokens):>11.0f}")
    m, b = results["mcts"], results["best_of_n"]

    def ratio(x: float, y: float) -> str:
        return f"{x / y:.2f}" if y else "n/a (best-of-N found none)"

    print()
    print(f"MCTS share of wall time outside the model: {m[0].outside_model_share:.1%} (target < 5%)")
    print(f"successes per M tokens, MCTS / best-of-N: {ratio(m[0].successes_per_million_tokens, b[0].successes_per_million_tokens)}")
    print(f"distinct successes per M tokens, MCTS / best-of-N: "
          f"{ratio(per_million(m[1], m[0].generated_tokens), per_million(b[1], b[0].generated_tokens))}")
    print(f"solved tasks per M tokens, MCTS / best-of-N: "
          f"{ratio(per_million(m[0].solved, m[0].generated_tokens), per_million(b[0].solved, b[0].generated_tokens))}")
    print(f"MCTS: {m[0].simulations} simulations, {m[0].nodes} nodes, {m[0].trajectories} trajectories; outside the "
          f"model: env {m[0].env_seconds:.2f} s, verifiers {m[0].verify_seconds:.2f} s, store {m[0].store_seconds:.2f} s, "
          f"rest {m[0].seconds - m[0].model_seconds - m[0].env_seconds - m[0].verify_seconds - m[0].store_seconds:.2f} s")


if __name__ == "__main__":
    main()
