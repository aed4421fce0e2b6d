"""Step-pair quality per suite and pair rule: search train tasks with the demo's or the
learning-round experiments' settings, derive step pairs under the margin rule and the evidence
rule, and audit each pair against the task's gold (docs/derive.md, "Pairs you can trust").

    .venv/bin/python docs/scripts/pair_audit.py --settings demo --suite arithmetic --suite units \\
        --suite shop --tasks 8 --store runs/pair-audit

demo: `dataengine demo`'s search (`demo_config` with its sizes: K = 2 with the greedy candidate,
depth 3, 64 new tokens at temperature 0.7, 400 generated tokens per task, leaf value zero,
schema edits) and its derive margin 0.1 for the margin rule; experiment: the `engine`
section of docs/configs/experiment-<suite>.yaml (round 1). A rerun with the same arguments
reuses the stored trees (the run id names settings, suite, tasks and seed). Prints one
markdown row per (suite, rule): rules `margin` (value gap >= theta), `evidence` (the default)
and its two parts, `verified` (a success below the chosen side) and `bound` (confidence bounds
only).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl
import yaml

ROOT = Path(__file__).resolve().parents[2]


def engine_config(settings: str, suite: str, tasks: int, store: str, model: str, seed: int, overrides: list[str]):
    from dataengine.commands.demo import DEMO_SIZES, demo_config
    from dataengine.config import EngineConfig

    if settings == "demo":
        base = demo_config(Path(store).parent, model=model, suites=[suite], seed=seed, rounds=1,
                           sizes=DEMO_SIZES).engine.model_dump()
    else:
        base = yaml.safe_load((ROOT / "docs" / "configs" / f"experiment-{suite}.yaml").read_text())["engine"]
        base.setdefault("policy", {})["model"] = model
    base.update(store=store, suites=[suite], num_tasks=tasks, seed=seed)
    for item in overrides:  # dotted.key=value, YAML-parsed value
        key, value = item.split("=", 1)
        *path, last = key.split(".")
        node = base
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    return EngineConfig.model_validate(base)


def rows_for(store, run_id: str, config, suite: str) -> list[dict]:
    from dataengine.derive import DeriveOptions, derive_frame
    from dataengine.derive.audit import audit_pairs, audit_table

    sources = {t: store.scan(t).filter(pl.col("run_id") == run_id) for t in ("nodes", "tasks")}
    tasks = sources["tasks"].collect()
    roots = sources["nodes"].filter(pl.col("terminal") & pl.col("success")).select("tree_id").unique().collect()
    rules = {
        "margin": DeriveOptions.from_config(config.derive, pair_rule="margin"),
        "evidence": DeriveOptions.from_config(config.derive, pair_rule="evidence"),
        "verified": DeriveOptions.from_config(config.derive, pair_rule="evidence", bound_min_gap=float("inf")),
    }
    out, counts = [], {}
    for name, options in rules.items():
        pairs = derive_frame("step-pairs", sources, options, [run_id]).with_columns(kind=pl.lit("step"))
        table = audit_table(audit_pairs(pairs, tasks), {suite: tasks.height})
        counts[name] = table.row(0, named=True)
    bound = {k: counts["evidence"][k] - counts["verified"][k] if isinstance(counts["evidence"][k], int) else None
             for k in counts["evidence"]}
    bound.update(suite=suite, trees=tasks.height, pairs_per_tree=bound["pairs"] / max(tasks.height, 1))
    known = bound["pairs"] - bound["no_gold"]
    bound["gold_share"] = bound["prefers_gold"] / known if known else None
    counts["bound"] = bound
    for name, row in counts.items():
        out.append({"rule": name, "solved": roots.height, **row})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", choices=["demo", "experiment"], required=True)
    parser.add_argument("--suite", action="append", required=True)
    parser.add_argument("--tasks", type=int, default=8, help="train tasks searched per suite")
    parser.add_argument("--store", default="runs/pair-audit/store")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], dest="overrides",
                        help="engine setting, dotted.key=value (e.g. search.solved_contrast=true); part of the run id")
    args = parser.parse_args()

    from dataengine.stages.generate import generate
    from storage import Store

    print(f"settings {args.settings}, {args.tasks} train tasks per suite, seed {args.seed}, model {args.model}"
          + (f", {' '.join(args.overrides)}" if args.overrides else ""))
    print("| suite | trees | solved | rule | pairs | prefer gold | inverted | wrong>wrong | both gold | no gold "
          "| gold share | pairs per tree |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for suite in args.suite:
        config = engine_config(args.settings, suite, args.tasks, args.store, args.model, args.seed, args.overrides)
        tag = "-".join(o.replace("=", "_").replace(".", "_") for o in args.overrides)
        run_id = f"audit-{args.settings}-{suite}-{args.tasks}-s{args.seed}" + (f"-{tag}" if tag else "")
        generate(config, run_id=run_id, progress=False)
        for r in rows_for(Store(args.store), run_id, config, suite):
            share = "-" if r["gold_share"] is None else f"{r['gold_share']:.0%}"
            print(f"| {suite} | {r['trees']} | {r['solved']} | {r['rule']} | {r['pairs']} | {r['prefers_gold']} "
                  f"| {r['inverted']} | {r['wrong_over_wrong']} | {r['both_gold']} | {r['no_gold']} | {share} "
                  f"| {r['pairs_per_tree']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
