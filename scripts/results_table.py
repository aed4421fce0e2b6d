"""The results experiment: one round of the engine's loop on a built-in suite, and a table.

    .venv/bin/python scripts/results_table.py                 # default size (SmolLM2, ~25-30 min on 2 CPU cores)
    .venv/bin/python scripts/results_table.py --quick         # tiny random model, ~2 minutes: exercises every stage
    .venv/bin/python scripts/results_table.py --eval-tasks 50 --train-tasks 24 --sims 8 ...

Stages (each model is evaluated on the same held-out tasks, greedy, with 95% Wilson intervals):
1. base: the model with the few-shot system prompt, no training;
2. MCTS over the train tasks with the base model -> store (nodes, trajectories);
3. derive: rejection-sampling SFT set, trajectory pairs, step pairs, GRPO replay prompts;
4. rs-SFT from base on the SFT set; trajectory DPO from base; step DPO from base (MCTS pairs);
   GRPO from the step-DPO checkpoint on the replay prompts (tools executing in the sandbox);
5. search at inference: the base model as the search policy on the held-out tasks.
Every stage writes to one store (--out/store): trees, derived sets, checkpoints (models table)
and evals, so the whole table can be re-read and re-derived. A stage whose training set came
out empty (no successful trajectory, no pair above the margin) is reported as skipped, with the
reason, instead of being trained on nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Size:
    """Everything that sets the experiment's cost. Defaults are the 25-30 minute CPU size."""

    model: str = "smollm2"
    suite: str = "arithmetic"
    seed: int = 0
    train_tasks: int = 12
    eval_tasks: int = 24
    sims: int = 6
    actions: int = 3
    value: str = "zero"
    max_steps: int = 4
    max_new_tokens: int = 64
    temperature: float = 1.0
    search_sims: int = 4
    search_actions: int = 2
    pass_k: int = 0
    margin: float = 0.2
    sft_steps: int = 12
    dpo_steps: int = 12
    grpo_steps: int = 3
    batch_size: int = 2
    max_length: int = 1024
    grpo_generations: int = 2
    grpo_completion: int = 96


QUICK = Size(model="tiny", train_tasks=2, eval_tasks=2, sims=3, actions=2, max_steps=2, max_new_tokens=10,
             search_sims=2, search_actions=2, pass_k=2, margin=0.0, sft_steps=1, dpo_steps=1, grpo_steps=1,
             batch_size=2, max_length=768, grpo_generations=2, grpo_completion=16)


@dataclass
class Row:
    """One line of the table."""

    stage: str
    model_id: str | None = None
    greedy: tuple[float, float, float, int] | None = None
    pass_k: tuple[float, float, float] | None = None
    tokens_per_solved: float | None = None
    train_rows: int | None = None
    seconds: float = 0.0
    note: str = ""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def engine_config(size: Size, store: Path, *, sims: int, actions: int) -> Any:
    from dataengine.config import EngineConfig

    return EngineConfig(
        store=str(store), seed=size.seed, suites=[size.suite], num_tasks=size.train_tasks, shard_size=size.train_tasks,
        env={"max_steps": size.max_steps},
        policy={"model": size.model, "max_new_tokens": size.max_new_tokens, "temperature": size.temperature,
                "device": "cpu", "few_shot": True},
        search={"num_simulations": sims, "num_actions": actions, "max_depth": size.max_steps, "value": size.value,
                "trees_per_batch": max(1, min(8, size.train_tasks))},
    )


def evaluate_model(name: str, model: str, size: Size, tasks: list, store: Any, *, search: bool = False) -> Row:
    """Evaluate `model` on the held-out tasks (greedy, pass@k, or search at inference)."""
    from dataengine.env import ToolEnv
    from dataengine.evaluation import EvalConfig, evaluate, write_report
    from dataengine.evaluation.search import search_at_inference
    from dataengine.policy import make_policy
    from dataengine.tools.sandbox import Sandbox

    start = time.perf_counter()
    policy = make_policy("hf", model, device="cpu", fewshot=True)
    config = EvalConfig(k=0 if search else size.pass_k, max_new_tokens=size.max_new_tokens, seed=size.seed,
                        greedy=not search)
    with Sandbox(workers=2, preload=[tasks[0].toolbox]) as sandbox:
        env = ToolEnv(sandbox, max_steps=size.max_steps)
        finder = None
        if search:
            engine = engine_config(size, Path(store.root), sims=size.search_sims, actions=size.search_actions)
            finder = search_at_inference(policy, env, engine, seed=size.seed)
        report = evaluate(policy, env, tasks, config, search=finder)
    write_report(store, report, run_id=f"results-eval-{name}", config={"stage": name, "size": asdict(size)})
    main = report.metric("search_success" if search else "greedy_success")
    row = Row(name, report.model_id, (main.value, main.ci_low, main.ci_high, main.n),
              tokens_per_solved=main.details.get("tokens_per_solved"), seconds=time.perf_counter() - start)
    if size.pass_k and not search:
        pk = report.metric(f"pass@{size.pass_k}")
        row.pass_k = (pk.value, pk.ci_low, pk.ci_high)
    if search:
        found = report.metric("search_found")
        row.note = f"any success in tree: {found.value:.2f} (oracle bound)"
    log(f"{name}: {main.metric} {main.value:.3f} [{main.ci_low:.3f}, {main.ci_high:.3f}] in {row.seconds:.0f} s")
    return row


def training_rows(store: Any, kind: str, run_id: str, pair_kind: str | None = None) -> Any:
    """TrainingData of one derived set of `run_id` (exported through storage, exact dedup)."""
    from dataengine.train.data import as_training_data
    from storage.export import ExportFilters, export_frame

    table = {"sft": "sft", "preference": "pairs", "prompt": "replay"}[kind]
    if not store.has_table(table):
        return None
    kinds = [pair_kind] if pair_kind else (["rs"] if kind == "sft" else None)
    frame, _, versions = export_frame(store, table, filters=ExportFilters(run_ids=[run_id], kinds=kinds))
    if frame.is_empty():
        return None
    data = as_training_data(kind, frame.to_dicts())
    data.versions = dict(versions)
    return data


def train_stage(kind: str, init: str, out: Path, data: Any, size: Size, store: Any) -> Any:
    """Train one checkpoint (registered in the store) and return its CheckpointInfo."""
    from dataengine.train import (
        DPOTrainConfig,
        GRPOTrainConfig,
        SFTTrainConfig,
        train_dpo,
        train_grpo,
        train_sft,
    )

    common: dict[str, Any] = {
        "init": init, "out_dir": str(out), "batch_size": size.batch_size, "max_length": size.max_length,
        "seed": size.seed, "device": "cpu", "logging_steps": 1, "run_id": "results-train",
    }
    if kind == "sft":
        return train_sft(SFTTrainConfig(**common, max_steps=size.sft_steps, learning_rate=5e-5), data, store)
    if kind == "dpo":
        return train_dpo(DPOTrainConfig(**common, max_steps=size.dpo_steps, learning_rate=2e-5, beta=0.1), data, store)
    common.update(batch_size=size.grpo_generations)
    return train_grpo(GRPOTrainConfig(**common, max_steps=size.grpo_steps, learning_rate=1e-5,
                                      num_generations=size.grpo_generations,
                                      max_completion_length=size.grpo_completion, max_tool_calls=2,
                                      max_episode_steps=size.max_steps, sandbox_workers=2), data, store)


def run(size: Size, out: Path) -> list[Row]:
    from dataengine.derive import DeriveOptions, derive
    from dataengine.search import generate
    from dataengine.suites import generate_suite
    from storage import Store

    out.mkdir(parents=True, exist_ok=True)
    store = Store(out / "store")
    held_out = generate_suite(size.suite, n_train=0, n_heldout=size.eval_tasks, seed=size.seed)
    rows = [evaluate_model("base (few-shot)", size.model, size, held_out, store)]

    start = time.perf_counter()
    config = engine_config(size, out / "store", sims=size.sims, actions=size.actions)
    run_id = f"results-mcts-{size.suite}-{size.seed}"
    summary = generate(config, method="mcts", run_id=run_id, store=store, progress=False)
    log(f"mcts on {summary.trees} train tasks: {summary.successes} successful trajectories, "
        f"{summary.solved} tasks solved, {summary.generated_tokens} tokens, {time.perf_counter() - start:.0f} s")
    derived = derive(store, run_ids=[run_id], options=DeriveOptions(margin=size.margin, replay_prefixes=False))
    counts = {d.kind: d.rows for d in derived}
    log(f"derived: {counts}")

    from dataengine.train.data import as_training_data

    checkpoints = out / "checkpoints"
    sft_data = training_rows(store, "sft", run_id)
    traj_data = training_rows(store, "preference", run_id, "trajectory")
    step_data = training_rows(store, "preference", run_id, "step")
    replay_data = training_rows(store, "prompt", run_id)
    replay_note = ""
    if replay_data is None:
        # Every train task was always or never solved by the search: GRPO gets all train tasks,
        # and TRL's group advantages then only move on tasks where its own rollouts disagree.
        import polars as pl

        task_frame = store.tasks().filter(pl.col("run_id") == run_id).collect()
        replay_data = as_training_data("prompt", [
            {"prompt": json.loads(t)["messages"], "tools": json.dumps([{"type": "function", "function": s}
                                                                         for s in json.loads(t)["tools"]]),
             "task_id": i, "task_json": t}
            for i, t in zip(task_frame["task_id"], task_frame["task_json"])
        ])
        replay_note = "no prompt with 0 < p < 1: all train tasks used"

    stages = [
        ("rs-SFT", "sft", size.model, sft_data, "no successful trajectory to imitate"),
        ("trajectory DPO", "dpo", size.model, traj_data, "no task with both a success and a failure"),
        ("step DPO (MCTS pairs)", "dpo", size.model, step_data, f"no sibling pair with margin >= {size.margin}"),
    ]
    trained: dict[str, str] = {}
    for name, kind, init, data, reason in stages:
        if data is None:
            rows.append(Row(name, note=f"skipped: {reason}"))
            log(f"{name}: skipped ({reason})")
            continue
        t0 = time.perf_counter()
        info = train_stage(kind, init, checkpoints / name.split()[0].lower().replace("-", "_"), data, size, store)
        trained[name] = info.path
        log(f"{name}: trained on {len(data)} rows in {time.perf_counter() - t0:.0f} s")
        row = evaluate_model(name, info.path, size, held_out, store)
        row.train_rows, row.seconds = len(data), row.seconds + time.perf_counter() - t0
        rows.append(row)

    grpo_init = trained.get("step DPO (MCTS pairs)") or trained.get("trajectory DPO") or size.model
    t0 = time.perf_counter()
    info = train_stage("grpo", grpo_init, checkpoints / "grpo", replay_data, size, store)
    row = evaluate_model("GRPO (from DPO)", info.path, size, held_out, store)
    row.train_rows, row.seconds = len(replay_data), row.seconds + time.perf_counter() - t0
    source = "step DPO" if "step DPO (MCTS pairs)" in trained else ("trajectory DPO" if "trajectory DPO" in trained else "base")
    row.note = "; ".join(x for x in (f"started from {source}", replay_note) if x)
    rows.append(row)

    rows.append(evaluate_model("search at inference (base)", size.model, size, held_out, store, search=True))
    (out / "derived.json").write_text(json.dumps(counts, indent=1))
    return rows


def markdown(rows: list[Row], size: Size, seconds: float, command: str) -> str:
    """The results table with the settings that produced it."""
    def interval(v: tuple | None) -> str:
        return "-" if v is None or v[0] is None else f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"

    k = f"pass@{size.pass_k}" if size.pass_k else "pass@k"
    lines = [
        f"| stage | success (greedy; search: chosen path) [95% CI] | {k} [95% CI] | tokens / solved | train rows | notes |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        tokens = "-" if r.tokens_per_solved is None else f"{r.tokens_per_solved:.0f}"
        lines.append(f"| {r.stage} | {interval(r.greedy)} | {interval(r.pass_k)} | {tokens} | "
                     f"{'-' if r.train_rows is None else r.train_rows} | {r.note} |")
    n = next((r.greedy[3] for r in rows if r.greedy), 0)
    lines += [
        "",
        (f"{n} held-out {size.suite} tasks (seed {size.seed}); model {size.model}; MCTS on {size.train_tasks} train "
         f"tasks with {size.sims} simulations x {size.actions} actions (value: {size.value}); search at inference "
         f"{size.search_sims} x {size.search_actions}; training steps SFT {size.sft_steps}, DPO {size.dpo_steps}, "
         f"GRPO {size.grpo_steps}; step-pair margin {size.margin}. Wall time {seconds / 60:.1f} min."),
        f"Command: `{command}`",
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> tuple[Size, Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny random model, ~2 minutes (exercises the code)")
    parser.add_argument("--out", type=Path, default=Path("runs/results"), help="folder for the store and checkpoints")
    base = Size()
    for name, value in asdict(base).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=None, help=f"default {value}")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else base
    size = replace(size, **{k: getattr(args, k) for k in asdict(base) if getattr(args, k) is not None})
    return size, args.out


def main(argv: list[str] | None = None) -> str:
    size, out = parse(argv)
    command = "python scripts/results_table.py " + " ".join(sys.argv[1:] if argv is None else argv)
    start = time.perf_counter()
    rows = run(size, out)
    table = markdown(rows, size, time.perf_counter() - start, command.strip())
    (out / "results.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps({"size": asdict(size), "rows": [asdict(r) for r in rows]}, indent=1))
    print(table)
    return table


if __name__ == "__main__":
    main()
