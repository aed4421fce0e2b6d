"""`dataengine demo`: the main job on the embedded defaults.

1. Writes the built-in suites' task files and runs scripted gold episodes through the
   sandboxed ToolEnv (the foundation's smoke test: gold succeeds, corrupted gold fails).
2. Runs the pipeline flow (Prefect, embedded ephemeral API, a local store folder): evaluate the
   starting model, then generate (MCTS) -> derive -> export -> train (DPO) -> evaluate, with
   SmolLM2 on CPU, sized to finish within about 15 minutes on 2 cores.
3. Writes the run report and prints where the store, datasets, checkpoint and report are, and
   the before/after success table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dataengine.commands.common import MCPOption, MCPStatelessOption, ToolsOption, tools_overrides

# notool gives SmolLM2 some successes (so search finds pairs to train on); arithmetic shows the
# tool-use failures the engine exists to fix.
DEMO_SUITES = ["notool", "arithmetic"]
# SmolLM2 on 2 CPU cores: about 35 generated tokens/s (measured, no prefix reuse). These sizes keep one round
# of search + DPO + two evaluations well inside 15 minutes.
DEMO_SIZES: dict[str, Any] = {
    "num_tasks": 6,
    "eval_tasks": 8,
    "simulations": 6,
    "num_actions": 4,
    "max_depth": 3,
    "max_new_tokens": 48,
    # docs/policy.md: SmolLM2's first reply on arithmetic is a tool call in 84% of samples at
    # 0.7 and 45% at 1.0.
    "temperature": 0.7,
    "train_steps": 4,
}
QUICK_SIZES: dict[str, Any] = {
    "num_tasks": 4,
    "eval_tasks": 3,
    "simulations": 3,
    "num_actions": 2,
    "max_depth": 2,
    "max_new_tokens": 12,
    "train_steps": 1,
}


def demo_config(out: Path, *, model: str, suites: list[str], seed: int, rounds: int, sizes: dict[str, Any],
                tools: dict[str, Any] | None = None) -> Any:
    """The demo's PipelineConfig: store, datasets and checkpoints under `out`; `tools`: the
    engine's tools section (modules, mcp), if any."""
    from flows.pipeline import PipelineConfig

    config = PipelineConfig.model_validate({
        "run_id": "demo",
        "rounds": rounds,
        "trainers": ["dpo"],
        "out_dir": str(out / "pipeline"),
        "engine": {
            "store": str(out / "store"),
            "seed": seed,
            "suites": suites,
            "num_tasks": sizes["num_tasks"],
            "shard_size": 4,
            "sandbox": {"workers": 2},
            "policy": {"model": model, "device": "cpu", "max_new_tokens": sizes["max_new_tokens"],
                       "temperature": sizes.get("temperature", 1.0)},
            "search": {"num_simulations": sizes["simulations"], "num_actions": sizes["num_actions"],
                       "max_depth": sizes["max_depth"], "value": "zero", "trees_per_batch": 8},
            # Small models give small value gaps; a lower margin still pairs a success with a failure.
            "derive": {"margin": 0.1},
            "generate": {"method": "mcts"},
            "eval": {"num_tasks": sizes["eval_tasks"], "seed": seed, "max_new_tokens": sizes["max_new_tokens"]},
            # Checkpointed activations, reference log-probs computed once and one pair per micro-step
            # (two per optimizer step) keep full-weight DPO under 4 GB on CPU (benchmarks/bench_train_memory.py).
            "train": {"dpo": {"max_steps": sizes["train_steps"], "batch_size": 1, "gradient_accumulation_steps": 2,
                              "max_length": 1024, "device": "cpu", "learning_rate": 5e-6, "seed": seed,
                              "gradient_checkpointing": True, "precompute_ref_log_probs": True}},
        },
    })
    if tools:
        config.engine.tools = type(config.engine.tools).model_validate(tools)
    return config


def gold_table(out: Path, tasks: int, seed: int, modules: list[str] | None = None) -> Any:
    """Write each suite's task files and run `tasks` gold episodes per suite; returns the table.
    modules: tools entries the sandbox workers import (so the pipeline's own toolboxes load)."""
    from rich.console import Console
    from rich.table import Table

    from dataengine.env import ToolEnv
    from dataengine.gold_demo import run_gold
    from dataengine.suites import generate_suite, list_suites, save_tasks
    from dataengine.tools.sandbox import Sandbox

    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    suites = list_suites()
    for name in suites:
        path = save_tasks(generate_suite(name, n_train=1000, n_heldout=200, seed=seed), out / f"{name}.jsonl")
        console.print(f"wrote 1000 train + 200 held-out {name} tasks to {path}")
    table = Table("suite", "episodes", "tool calls", "tool errors", "gold success",
                  "corrupted: success", "seconds", title="Scripted gold episodes (sandboxed ToolEnv)")
    with Sandbox(workers=2, preload=suites, modules=modules or ()) as sandbox:
        env = ToolEnv(sandbox, max_steps=8)
        for name in suites:
            s = run_gold(env, name, tasks, seed=seed)
            table.add_row(name, str(s.tasks), str(s.tool_calls), str(s.tool_errors),
                          f"{s.gold_success}/{s.tasks}", f"{s.corrupted_success}/{s.corrupted}",
                          f"{s.seconds:.1f}")
    console.print(table)
    return table


def success_rows(evals: list[tuple[int, str, dict[str, tuple]]]) -> list[tuple[str, str, str, str]]:
    """(suite, before, after, change) of the first and last evaluation (greedy success [95% CI])."""
    (_, _, before), (_, _, after) = evals[0], evals[-1]
    rows = []
    for suite in sorted(set(before) | set(after)):
        b, a = before.get(suite), after.get(suite)
        fmt = lambda v: f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]" if v else "n/a"
        change = f"{a[0] - b[0]:+.2f}" if a and b else ""
        rows.append((suite, fmt(b), fmt(a), change))
    return rows


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        out: Annotated[Path, typer.Option("--out", help="Folder for task files, the store, datasets, checkpoints and the report.")] = Path("demo-out"),
        tasks: Annotated[int, typer.Option("--tasks", min=1, help="Gold episodes per suite.")] = 20,
        seed: Annotated[int, typer.Option("--seed", help="Seed of task generation, sampling and search.")] = 0,
        suite: Annotated[list[str] | None, typer.Option("--suite", help="Suite the pipeline searches (repeat; default notool and arithmetic).")] = None,
        rounds: Annotated[int, typer.Option("--rounds", min=1, help="Pipeline rounds.")] = 1,
        model: Annotated[str | None, typer.Option("--model", help="Starting model (default smollm2; tiny with --quick).")] = None,
        quick: Annotated[bool, typer.Option("--quick", help="Tiny random model and tiny sizes: checks the plumbing in a minute or two.")] = False,
        gold_only: Annotated[bool, typer.Option("--gold-only", help="Only the task files and the gold-episode table.")] = False,
        tools: ToolsOption = None,
        mcp: MCPOption = None,
        mcp_stateless: MCPStatelessOption = None,
    ) -> None:
        """Gold episodes through the sandboxed ToolEnv, then the whole pipeline (search ->
        datasets -> DPO -> evaluation) as Prefect flows on the embedded defaults, and a report."""
        from rich.console import Console
        from rich.table import Table

        console = Console()
        overrides = tools_overrides(tools, mcp, mcp_stateless)
        section = {key.removeprefix("tools__"): value for key, value in overrides.items()}
        if section.get("modules"):
            from dataengine.tools.registry import ToolsError, load_tools

            try:
                load_tools(section["modules"])
            except ToolsError as exc:
                raise typer.BadParameter(str(exc), param_hint="--tools") from None
        gold_table(out, tasks, seed, section.get("modules"))
        if gold_only:
            return
        import time

        from dataengine.report import build_report
        from flows.pipeline import run_pipeline
        from storage import Store

        start = time.perf_counter()
        sizes = QUICK_SIZES if quick else DEMO_SIZES
        config = demo_config(out.resolve(), model=model or ("tiny" if quick else "smollm2"),
                             suites=list(suite) if suite else DEMO_SUITES, seed=seed, rounds=rounds, sizes=sizes,
                             tools=section)
        console.rule("pipeline: evaluate -> generate (MCTS) -> derive -> export -> DPO -> evaluate")
        result = run_pipeline(config)
        report = build_report(Store(result["store"]), config.run_id, out.resolve() / "report")

        table = Table("suite", f"before ({Path(result['evals'][0][1]).name})", "after", "change",
                      title=f"Greedy success on {config.engine.eval.num_tasks} held-out tasks per suite (95% Wilson interval)")
        for row in success_rows(result["evals"]):
            table.add_row(*row)
        console.print(table)
        last = result["rounds"][-1]
        gen = last["generate"]
        done = [s for s in gen["shards"] if not s.get("skipped")]
        resumed = f" ({gen['skipped']} shard(s) already in the store, skipped)" if gen["skipped"] else ""
        console.print(f"search (round {last['round']}): {sum(s['trees'] for s in done)} trees searched now{resumed}, "
                      f"{sum(s['successes'] for s in done)} successful trajectories, "
                      f"{sum(s['generated_tokens'] for s in done)} generated tokens; derived: "
                      + ", ".join(f"{d['kind']} {d['rows']}" for d in last["derived"]))
        datasets = {k: v["path"] for k, v in last["exported"].items() if v.get("path")}
        console.print(f"store:      {result['store']}")
        console.print(f"datasets:   {', '.join(f'{k}={v}' for k, v in datasets.items()) or 'none (no pairs or examples this round)'}")
        ckpt = last["checkpoints"][-1]["path"] if last["checkpoints"] else None
        console.print(f"checkpoint: {ckpt or 'none (nothing to train on this round)'}")
        console.print(f"report:     {report.html}")
        console.print(f"query it:   dataengine query --store {result['store']} "
                      "\"SELECT run_id, source, count(*) AS episodes, avg(CAST(success AS INT)) AS success "
                      "FROM trajectories GROUP BY run_id, source ORDER BY run_id\"")
        console.print(f"took {time.perf_counter() - start:.0f} s (pipeline and report)")
