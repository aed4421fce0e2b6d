"""Search yield benchmark: MCTS (each leaf-value option) against best-of-N and greedy sampling at
equal generated tokens per task, on several tool suites, with 95% intervals, in one run.

    .venv/bin/python benchmarks/bench_search.py                       # SmolLM2, 4 suites x 32 tasks
    .venv/bin/python benchmarks/bench_search.py --tasks 16 --suite arithmetic --suite units
    .venv/bin/python benchmarks/bench_search.py --quick               # tiny model, smoke run
    # level-2 arithmetic, oracle-assisted leaf value (docs/eval.md "Level-2 search probe"):
    .venv/bin/python benchmarks/bench_search.py --suite arithmetic --level 2 --tasks 8 --budget 1500 \
        --batch 16 --values reference --objective success --widen-arguments --solved stop --pb-c-init 0.5 --max-depth 6

Every method runs through the generate stage (dataengine.stages.generate.generate) with the same
policy (SmolLM2-135M-Instruct, the example-episode template, temperature 0.7), the same train
tasks and the same per-task budget of generated tokens (`--budget`; every token of expansions,
rollouts and critic calls is charged to its task). Per method and suite it prints:

- successes per million generated tokens (successful trajectories), distinct successful
  trajectories (by trajectory hash) per million tokens, and solved tasks per million tokens,
  each with a 95% bootstrap interval over tasks (ratio of sums, 2,000 resamples);
- the ratio MCTS / best-of-N of each, with a paired bootstrap interval (same tasks resampled);
- tokens spent, solved tasks, wall time, generated tokens per second of wall time and solved
  tasks per wall-minute (its MCTS / best-of-N ratio with a paired bootstrap interval over tasks;
  the wall times are the runs' own, one each, so the interval covers the tasks, not the timing).

Targets: MCTS at least 2x best-of-N in successes per M tokens and at least 1.3x in
solved tasks per M tokens on at least two of the four suites; in wall time, MCTS generated
tok/s at least 0.9x best-of-N's and solved tasks per wall-minute at least 1.3x.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataengine.config import load_config  # noqa: E402
from dataengine.policy import policy_from_config  # noqa: E402
from dataengine.stages.generate import config_tasks, generate  # noqa: E402
from dataengine.stages.resources import make_sandbox  # noqa: E402
from storage import Store  # noqa: E402

RESAMPLES = 2000


def per_task(store: Store, run_id: str, task_ids: list[str], tokens: dict[str, int]) -> list[tuple[int, int, int, int]]:
    """(successes, distinct successes, solved 0/1, tokens) per task of a run."""
    import polars as pl

    trajs = store.trajectories().filter(pl.col("run_id") == run_id).select("task_id", "success", "traj_hash").collect()
    out = []
    for task_id in task_ids:
        ok = trajs.filter((pl.col("task_id") == task_id) & pl.col("success"))
        out.append((ok.height, ok["traj_hash"].n_unique() if ok.height else 0, int(ok.height > 0),
                    tokens.get(task_id, 0)))
    return out


def rate(rows: list[tuple[int, ...]], column: int) -> float:
    tokens = sum(r[3] for r in rows)
    return 1e6 * sum(r[column] for r in rows) / tokens if tokens else 0.0


def interval(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return values[int(0.025 * len(values))], values[min(len(values) - 1, int(0.975 * len(values)))]


def bootstrap(rows: list[tuple[int, ...]], column: int, seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    n = len(rows)
    return interval([rate([rows[rng.randrange(n)] for _ in range(n)], column) for _ in range(RESAMPLES)])


def paired_ratio(a: list[tuple[int, ...]], b: list[tuple[int, ...]], column: int, seed: int) -> tuple[float, float] | None:
    rng = random.Random(seed)
    n = len(a)
    ratios = []
    for _ in range(RESAMPLES):
        picks = [rng.randrange(n) for _ in range(n)]
        denominator = rate([b[i] for i in picks], column)
        if denominator > 0:
            ratios.append(rate([a[i] for i in picks], column) / denominator)
    return interval(ratios) if len(ratios) > RESAMPLES // 2 else None


def paired_count_ratio(a: list[tuple[int, ...]], b: list[tuple[int, ...]], column: int, scale: float,
                       seed: int) -> tuple[float, float] | None:
    """Paired bootstrap interval of scale * sum(a[column]) / sum(b[column]) over tasks (solved
    per wall-minute: scale is best-of-N's wall time over MCTS's)."""
    rng = random.Random(seed)
    n = len(a)
    ratios = []
    for _ in range(RESAMPLES):
        picks = [rng.randrange(n) for _ in range(n)]
        denominator = sum(b[i][column] for i in picks)
        if denominator > 0:
            ratios.append(scale * sum(a[i][column] for i in picks) / denominator)
    return interval(ratios) if len(ratios) > RESAMPLES // 2 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 tasks, small budget (smoke run)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--suite", action="append", help="suite (repeat); default arithmetic, units, shop, chains")
    parser.add_argument("--tasks", type=int, default=32, help="tasks per suite (of --split)")
    parser.add_argument("--budget", type=int, default=600, help="generated tokens per task, every method")
    parser.add_argument("--sims", type=int, default=64, help="MCTS simulations per tree (the budget usually ends first)")
    parser.add_argument("--k", type=int, default=2, help="candidate actions per expansion (widening adds more); best-of-N wave size")
    parser.add_argument("--batch", type=int, default=32, help="trees (tasks) decoded together: more rows per forward")
    parser.add_argument("--solved", default="continue", choices=["continue", "stop"], help="MCTS search.solved_policy")
    parser.add_argument("--algorithm", default="puct", choices=["puct", "uct", "gumbel"])
    parser.add_argument("--values", default="zero,rollout",
                        help="MCTS leaf-value options to compare (comma-separated; `reference` is oracle-assisted)")
    parser.add_argument("--level", type=int, action="append", help="task difficulty level (repeat); default all")
    parser.add_argument("--objective", default="composite", choices=["composite", "success", "efficient_success"],
                        help="MCTS search.objective: what trees back up and rollouts score")
    parser.add_argument("--widen-arguments", nargs="?", const=True, default=False, choices=[True, "schema"],
                        help="MCTS search.widen_arguments (variant rounds); '--widen-arguments schema' adds the schema edits")
    parser.add_argument("--widen-tool-names", action="store_true",
                        help="MCTS search.widen_tool_names: every other widening round forces the likeliest untried tool's name")
    parser.add_argument("--greedy-candidate", default="no", choices=["no", "yes", "both"],
                        help="MCTS search.greedy_candidate: the first of K candidates is the greedy decode "
                             "(both: each MCTS option without and with it; with it the method is named +greedy)")
    parser.add_argument("--pb-c-init", type=float, help="PUCT exploration constant c1 (default: the config's)")
    parser.add_argument("--value-model", help="fitted value head for the value_model option")
    parser.add_argument("--leaves", default="1",
                        help="MCTS leaves per tree per iteration to compare (comma-separated; L > 1 adds rows "
                             "per decode step, with virtual loss); method names get @L<n> for L > 1")
    parser.add_argument("--no-baselines", action="store_true",
                        help="MCTS only (no greedy, no best-of-N, so no ratios): to compare MCTS settings")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train", choices=["train", "heldout"],
                        help="which split's tasks to search: heldout for a model trained on train tasks")
    parser.add_argument("--json", help="also write the results to this JSON file (after each suite)")
    parser.add_argument("--store", help="keep the runs' trajectory store in this folder (default: a temporary one), "
                                        "e.g. for docs/scripts/call_failures.py; each method's run id is printed (a rerun into the "
                                        "same folder resumes those runs instead of searching again)")
    parser.add_argument("--report", metavar="JSON", help="only print the tables of earlier --json files (repeat)", action="append")
    args = parser.parse_args()
    if args.report:
        merged: dict = {}
        for path in args.report:
            saved = json.loads(Path(path).read_text())
            merged.update(saved["results"])
            methods = list(next(iter(saved["results"].values())))
        report(merged, methods, argparse.Namespace(**{**saved["args"], "report": args.report}))
        return
    suites = args.suite or ["arithmetic", "units", "shop", "chains"]
    if args.quick:
        args.model, args.tasks, args.budget, args.sims, suites = "tiny", 2, 60, 4, suites[:1]
    leaves = [int(x) for x in args.leaves.split(",") if x]
    methods = [] if args.no_baselines else ["greedy", "best_of_n"]
    greedy = {"no": [""], "yes": ["+greedy"], "both": ["", "+greedy"]}[args.greedy_candidate]
    methods += [f"mcts-{v}{g}" + (f"@L{n}" if n != 1 else "") for v in args.values.split(",") if v for g in greedy for n in leaves]

    base = load_config(
        None, seed=args.seed, split=args.split, shard_size=args.tasks, policy__model=args.model, policy__device="cpu",
        policy__temperature=args.temperature, policy__max_new_tokens=args.max_new_tokens,
        search__algorithm=args.algorithm, search__num_simulations=args.sims, search__num_actions=args.k,
        search__max_generated_tokens=args.budget, search__trees_per_batch=min(args.tasks, args.batch),
        search__solved_policy=args.solved, search__objective=args.objective,
        search__widen_arguments=args.widen_arguments, search__widen_tool_names=args.widen_tool_names, levels=args.level,
        **({"search__pb_c_init": args.pb_c_init} if args.pb_c_init is not None else {}),
        search__max_depth=args.max_depth, env__max_steps=args.max_depth, generate__n=10_000,
        generate__value_model=args.value_model,
    )
    started = time.perf_counter()
    policy = policy_from_config(base.policy)
    print(f"model {policy.model_id} loaded in {time.perf_counter() - started:.1f} s; suites {', '.join(suites)}, "
          f"{args.tasks} {args.split} tasks each (seed {args.seed}), {args.budget} generated tokens per task, K={args.k}, {args.algorithm}, "
          f"solved trees {args.solved}, temperature {args.temperature}, objective {args.objective}, "
          f"levels {args.level or 'all'}, widen_arguments {args.widen_arguments}, widen_tool_names {args.widen_tool_names}, greedy candidate {args.greedy_candidate}",
          flush=True)
    results: dict[str, dict[str, dict]] = {}
    with contextlib.ExitStack() as stack:  # a temporary store only when --store is not given
        store = Store(Path(args.store) if args.store
                      else Path(stack.enter_context(tempfile.TemporaryDirectory())) / "store")
        for suite in suites:
            cfg = base.model_copy(update={"suites": [suite], "num_tasks": args.tasks})
            tasks = config_tasks(cfg)
            results[suite] = {}
            with make_sandbox(cfg, sorted({t.toolbox for t in tasks})) as sandbox:
                from dataengine.env import ToolEnv

                env = ToolEnv(sandbox, max_steps=cfg.env.max_steps)
                for method in methods:
                    name, _, rest = method.partition("-")
                    value, _, n_leaves = rest.partition("@L")
                    value, greedy_first = value.removesuffix("+greedy"), value.endswith("+greedy")
                    run_cfg = cfg.model_copy(update={
                        "generate": cfg.generate.model_copy(update={"method": name}),
                        "search": cfg.search.model_copy(update={
                            "value": value or "zero", "leaves_per_iteration": int(n_leaves or 1),
                            "greedy_candidate": greedy_first}),
                    })
                    t0 = time.perf_counter()
                    summary = generate(run_cfg, tasks=tasks, store=store, policy=policy, env=env, progress=False)
                    rows = per_task(store, summary.run_id, [t.id for t in tasks], summary.task_tokens)
                    results[suite][method] = {"rows": rows, "seconds": time.perf_counter() - t0,
                                              "tokens": sum(r[3] for r in rows)}
                    print(f"  {suite:<10} {method:<21} {results[suite][method]['tokens']:>7} tokens "
                          f"{sum(r[0] for r in rows):>4} successes {sum(r[2] for r in rows):>3}/{len(rows)} solved "
                          f"{results[suite][method]['seconds']:>7.1f} s  run {summary.run_id}", flush=True)
            if args.json:  # after each suite, so a stopped run keeps the suites it finished
                Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    report(results, methods, args)


def report(results: dict, methods: list[str], args: argparse.Namespace) -> None:
    columns = ((0, "succ/Mtok"), (1, "distinct/Mtok"), (2, "solved/Mtok"))
    print()
    print(f"{'suite':<10} {'method':<21} {'tokens':>7} {'solved':>7} {'wall s':>7} {'tok/s':>6} {'solved/min':>10} "
          + " ".join(f"{n + ' [95% CI]':>22}" for _, n in columns))
    for suite, by_method in results.items():
        for method in methods:
            r = by_method[method]
            rows = r["rows"]
            cells = []
            for column, _ in columns:
                low, high = bootstrap(rows, column, args.seed)
                cells.append(f"{rate(rows, column):>6.0f} [{low:>5.0f}, {high:>5.0f}]".rjust(22))
            seconds = max(r["seconds"], 1e-9)
            print(f"{suite:<10} {method:<21} {r['tokens']:>7} {sum(x[2] for x in rows):>3}/{len(rows):<3} "
                  f"{seconds:>7.1f} {r['tokens'] / seconds:>6.1f} {60 * sum(x[2] for x in rows) / seconds:>10.2f} "
                  + " ".join(cells))
    if "best_of_n" not in methods:
        return
    print()
    print("MCTS / best-of-N at equal tokens (paired bootstrap over tasks, 95%):")
    for suite, by_method in results.items():
        bon = by_method["best_of_n"]["rows"]
        for method in methods[2:]:
            rows = by_method[method]["rows"]
            parts = []
            for column, name in ((0, "successes/Mtok"), (1, "distinct/Mtok"), (2, "solved/Mtok")):
                b = rate(bon, column)
                ci = paired_ratio(rows, bon, column, args.seed)
                shown = f"{rate(rows, column) / b:.2f}x" if b else "n/a (best-of-N found none)"
                parts.append(f"{name} {shown}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and b else ""))
            m, o = by_method[method], by_method["best_of_n"]
            parts.append(f"tok/s {(m['tokens'] / m['seconds']) / (o['tokens'] / o['seconds']):.2f}x")
            scale = o["seconds"] / m["seconds"]
            solved_b = sum(x[2] for x in bon)
            ci = paired_count_ratio(rows, bon, 2, scale, args.seed)
            shown = f"{scale * sum(x[2] for x in rows) / solved_b:.2f}x" if solved_b else "n/a (best-of-N solved none)"
            parts.append(f"solved/wall-min {shown}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and solved_b else ""))
            print(f"  {suite:<10} {method:<21} " + "; ".join(parts))


if __name__ == "__main__":
    main()
