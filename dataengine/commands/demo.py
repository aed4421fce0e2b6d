"""`dataengine demo`: what the engine is for, measured in one run on the embedded defaults.

1. Writes the built-in suites' task files and runs scripted gold episodes through the
   sandboxed ToolEnv (the foundation's smoke test: gold succeeds, corrupted gold fails).
2. Runs the demo flow (Prefect, embedded ephemeral API, a local store folder): best-of-N
   sampling on the train tasks, then the pipeline: evaluate the starting model on held-out
   tasks, search the same train tasks (MCTS) with the same generated-token budget per task,
   derive -> export -> train (SFT) -> evaluate again, with SmolLM2 on CPU, sized to finish
   within about 10 minutes on 2 cores.
3. Writes the run report and prints one table: search against best-of-N (solved train tasks,
   generated tokens, wall time, solved per M tokens and per wall-minute) and held-out greedy
   success before and after training (95% Wilson intervals); the report holds it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dataengine.commands.common import MCPOption, MCPStatelessOption, ToolsOption, tools_overrides

# Units: SmolLM2 mostly fails one schema edit from a right `convert` call, so search finds
# successes best-of-N misses (docs/results.md: 1.69x solved per M tokens) and one SFT round on
# them moves held-out greedy success (0.21 -> 0.91 after round 1 of the units experiment).
DEMO_SUITES = ["units"]
# Sized to finish inside 10 minutes on 2 cores (docs/results.md, "make demo": on 2026-12-03 the
# two searches took about 2 min each, 10 SFT steps about 2 min, the evaluations 0.6 and 1.3 min:
# the trained model calls the tool and then answers, so its episodes are longer).
DEMO_SIZES: dict[str, Any] = {
    "num_tasks": 12,
    "eval_tasks": 32,
    # The token budget ends a tree before its simulations do, so both methods spend it.
    "simulations": 64,
    "num_actions": 2,
    "max_depth": 3,
    "budget": 400,
    # 64, not 48: a right units `convert` call with a decimal value is 49-50 SmolLM2 tokens.
    "max_new_tokens": 64,
    # docs/policy.md: SmolLM2's first reply is a tool call in 84% of samples at 0.7, 45% at 1.0.
    "temperature": 0.7,
    "train_steps": 10,
}
QUICK_SIZES: dict[str, Any] = {
    "num_tasks": 4,
    "eval_tasks": 3,
    "simulations": 3,
    "num_actions": 2,
    "max_depth": 2,
    "budget": 60,
    "max_new_tokens": 12,
    "train_steps": 1,
}
# The learning-round command whose gain docs/results.md records, for a run too short to show one.
GAIN_COMMAND = ("dataengine experiment --suite units --rounds 2 --train-tasks 40 --heldout-tasks 100 "
                "--trainers sft,dpo --model smollm2 --out runs/exp-units --config docs/configs/experiment-units.yaml")


def demo_config(out: Path, *, model: str, suites: list[str], seed: int, rounds: int, sizes: dict[str, Any],
                tools: dict[str, Any] | None = None) -> Any:
    """The demo's PipelineConfig: store, datasets and checkpoints under `out`; `tools`: the
    engine's tools section (modules, mcp), if any. The search settings are set here in full
    (leaf value zero, greedy first candidate, schema edits, both methods searching until the
    per-task token budget ends), so the demo does not move with the engine's defaults."""
    from flows.pipeline import PipelineConfig

    config = PipelineConfig.model_validate({
        "run_id": "demo",
        "rounds": rounds,
        "trainers": ["sft"],
        "out_dir": str(out / "pipeline"),
        "engine": {
            "store": str(out / "store"),
            "seed": seed,
            "suites": suites,
            "num_tasks": sizes["num_tasks"],
            # One shard: every tree decodes in one batch.
            "shard_size": sizes["num_tasks"],
            "sandbox": {"workers": 2},
            # An episode ends at the search's depth: a units episode needs two turns (call, answer),
            # and a model that repeats a refused call would otherwise spend three more turns on it.
            "env": {"max_steps": sizes["max_depth"]},
            "policy": {"model": model, "device": "cpu", "max_new_tokens": sizes["max_new_tokens"],
                       "temperature": sizes.get("temperature", 1.0)},
            "search": {"num_simulations": sizes["simulations"], "num_actions": sizes["num_actions"],
                       "max_depth": sizes["max_depth"], "value": "zero", "greedy_candidate": True,
                       "widen_arguments": "schema", "solved_policy": "continue",
                       "max_generated_tokens": sizes["budget"], "trees_per_batch": sizes["num_tasks"]},
            # Small models give small value gaps; under pair_rule margin a lower margin still pairs a
            # success with a failure (docs/scripts/pair_audit.py compares the rules).
            "derive": {"margin": 0.1},
            "generate": {"method": "mcts"},
            # Every held-out task in one batch: one decode loop instead of two halves.
            "eval": {"num_tasks": sizes["eval_tasks"], "seed": seed, "max_new_tokens": sizes["max_new_tokens"],
                     "k": 0, "search": False, "batch_size": sizes["eval_tasks"]},
            # Short SFT from the starting model on the search's successes (batch 2, one sequence
            # per micro-step keeps memory low on CPU).
            "train": {"sft": {"max_steps": sizes["train_steps"], "batch_size": 1, "gradient_accumulation_steps": 2,
                              "max_length": 1024, "device": "cpu", "seed": seed}},
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


def search_counts(generated: dict[str, Any]) -> dict[str, Any]:
    """{tasks, solved, tokens, seconds, resumed} of a generate flow's result over every shard.
    A shard committed by an earlier call counts its stored trees, solved tasks and tokens but no
    seconds (resumed=True)."""
    shards = generated["shards"]
    return {"tasks": sum(s["trees"] for s in shards),
            "solved": len({t for s in shards for t in s["solved_task_ids"]}),
            "tokens": sum(s["generated_tokens"] for s in shards),
            "seconds": sum(s.get("seconds", 0.0) for s in shards),
            "resumed": any(s.get("skipped") for s in shards)}


def held_out_gain(evals: list[tuple[int, str, dict[str, tuple]]]) -> list[str]:
    """Suites whose greedy success after the last round lies above the first evaluation's with
    the 95% intervals apart."""
    (_, _, before), (_, _, after) = evals[0], evals[-1]
    return [s for s in sorted(before) if s in after and before[s][2] is not None and after[s][1] is not None
            and after[s][1] > before[s][2]]


def demo_rows(result: dict[str, Any], eval_tasks: int) -> list[tuple[str, str, str, str]]:
    """The demo's table, (measure, baseline, engine, comparison) rows: a header row, the search
    rows (best-of-N against round 1's MCTS on the same train tasks at the same per-task token
    budget; wall seconds of the search and its commit, not the model's loading), then a header
    row and one held-out row per suite (greedy success before and after training)."""
    bon = search_counts(result["best_of_n"])
    mcts = search_counts(result["rounds"][0]["generate"])

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "n/a"

    def per_m(c: dict[str, Any]) -> float:
        return 1e6 * c["solved"] / c["tokens"] if c["tokens"] else 0.0

    def per_minute(c: dict[str, Any]) -> float | None:
        return 60 * c["solved"] / c["seconds"] if c["seconds"] and not c["resumed"] else None

    def shown(v: float | None, spec: str) -> str:
        return format(v, spec) if v is not None else "n/a (resumed)"

    rows = [
        (f"search, {mcts['tasks']} train tasks", "best-of-N", "MCTS", "MCTS / best-of-N"),
        ("train tasks solved", str(bon["solved"]), str(mcts["solved"]), ratio(mcts["solved"], bon["solved"])),
        ("generated tokens", f"{bon['tokens']:,}", f"{mcts['tokens']:,}", ratio(mcts["tokens"], bon["tokens"])),
        ("wall seconds", shown(bon["seconds"] if not bon["resumed"] else None, ".0f"),
         shown(mcts["seconds"] if not mcts["resumed"] else None, ".0f"),
         ratio(mcts["seconds"], bon["seconds"]) if not (bon["resumed"] or mcts["resumed"]) else "n/a"),
        ("solved per M tokens", f"{per_m(bon):.0f}", f"{per_m(mcts):.0f}", ratio(per_m(mcts), per_m(bon))),
        ("solved per wall-minute", shown(per_minute(bon), ".2f"), shown(per_minute(mcts), ".2f"),
         ratio(per_minute(mcts), per_minute(bon))),
    ]
    evals = result["evals"]
    rows.append((f"held-out greedy, {eval_tasks} tasks [95% CI]",
                 f"before ({Path(evals[0][1]).name})", f"after ({Path(evals[-1][1]).name})", "change"))
    rows += [(f"  {suite}", b, a, change) for suite, b, a, change in success_rows(evals)]
    return rows


def markdown_table(rows: list[tuple[str, str, str, str]]) -> str:
    """The demo's table as markdown: the first row is the header, the held-out header row bold."""
    lines = ["| " + " | ".join(rows[0]) + " |", "|---|---|---|---|"]
    for row in rows[1:]:
        bold = row[-1] == "change"
        lines.append("| " + " | ".join(f"**{c.strip()}**" if bold else c.strip() for c in row) + " |")
    return "\n".join(lines)


def add_to_report(report: Any, rows: list[tuple[str, str, str, str]]) -> None:
    """Append the demo's table to the report's markdown and HTML pages."""
    import html

    title = "What the engine is for (this run)"
    report.markdown.write_text(report.markdown.read_text() + f"\n## {title}\n\n{markdown_table(rows)}\n")
    table = "".join("<tr>" + "".join(f"<{tag}>{html.escape(c.strip())}</{tag}>" for c in row) + "</tr>"
                    for row, tag in ((row, "th" if i == 0 or row[-1] == "change" else "td")
                                     for i, row in enumerate(rows)))
    page = report.html.read_text()
    report.html.write_text(page.replace("</body>", f"<h2>{html.escape(title)}</h2><table>{table}</table></body>", 1))


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        out: Annotated[Path, typer.Option("--out", help="Folder for task files, the store, datasets, checkpoints and the report.")] = Path("demo-out"),
        tasks: Annotated[int, typer.Option("--tasks", min=1, help="Gold episodes per suite.")] = 20,
        seed: Annotated[int, typer.Option("--seed", help="Seed of task generation, sampling and search.")] = 0,
        suite: Annotated[list[str] | None, typer.Option("--suite", help="Suite the demo searches and evaluates (repeat; default units).")] = None,
        rounds: Annotated[int, typer.Option("--rounds", min=1, help="Pipeline rounds.")] = 1,
        model: Annotated[str | None, typer.Option("--model", help="Starting model (default smollm2; tiny with --quick).")] = None,
        quick: Annotated[bool, typer.Option("--quick", help="Tiny random model and tiny sizes: checks the plumbing in a minute or two.")] = False,
        gold_only: Annotated[bool, typer.Option("--gold-only", help="Only the task files and the gold-episode table.")] = False,
        tools: ToolsOption = None,
        mcp: MCPOption = None,
        mcp_stateless: MCPStatelessOption = None,
    ) -> None:
        """Gold episodes through the sandboxed ToolEnv, then best-of-N and the pipeline (search ->
        datasets -> SFT -> evaluation) as Prefect flows on the embedded defaults, a report, and
        one table: search against best-of-N at equal tokens, held-out success before and after."""
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
        from flows.demo import run_demo
        from storage import Store

        start = time.perf_counter()
        sizes = QUICK_SIZES if quick else DEMO_SIZES
        config = demo_config(out.resolve(), model=model or ("tiny" if quick else "smollm2"),
                             suites=list(suite) if suite else DEMO_SUITES, seed=seed, rounds=rounds, sizes=sizes,
                             tools=section)
        console.rule("best-of-N, then the pipeline: evaluate -> generate (MCTS) -> derive -> export -> SFT -> evaluate")
        result = run_demo(config)
        # The pipeline's run id covers the best-of-N run (`<run>/best-of-n`) too.
        report = build_report(Store(result["store"]), config.run_id, out.resolve() / "report")
        rows = demo_rows(result, config.engine.eval.num_tasks)
        add_to_report(report, rows)

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
        budget = config.engine.search.max_generated_tokens
        table = Table(*rows[0], title=f"What the engine is for: search against best-of-N at {budget} generated tokens "
                                      "per task, and held-out greedy success before and after training "
                                      f"(model {config.engine.policy.model}, seed {seed})")
        table.columns[0].no_wrap = True
        for row in rows[1:]:
            if row[-1] == "change":
                table.add_section()
                table.add_row(*row, style="bold")
            else:
                table.add_row(*row)
        console.print(table)
        if not held_out_gain(result["evals"]):
            console.print("No held-out gain with the intervals apart at these sizes. The learning rounds that show "
                          f"one (docs/results.md, Learning rounds): {GAIN_COMMAND}")
        console.print(f"took {time.perf_counter() - start:.0f} s (best-of-N, pipeline and report)")
