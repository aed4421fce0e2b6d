"""`dataengine pipeline`, `dataengine schedule ...`, `dataengine report`: the Prefect flows and
the run report from the command line (flows/ holds the flows; dataengine/report/ the report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from dataengine.commands.common import (
    SET_HELP,
    MCPOption,
    MCPStatelessOption,
    ToolsOption,
    dotted_overrides,
    tools_overrides,
)

schedule_app = typer.Typer(help="Cron schedules of the generate flow (Prefect deployments; need a Prefect server).",
                           no_args_is_help=True)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _engine_overrides(suite: list[str] | None, tasks: int | None, model: str | None, store: Path | None,
                      sims: int | None, k: int | None, seed: int | None, prefix: str = "") -> dict[str, Any]:
    """Dotted load_config overrides (None: keep the file's or the default value)."""
    return {
        f"{prefix}suites": list(suite) if suite else None,
        f"{prefix}num_tasks": tasks,
        f"{prefix}policy__model": model,
        f"{prefix}store": str(store) if store is not None else None,
        f"{prefix}search__num_simulations": sims,
        f"{prefix}search__num_actions": k,
        f"{prefix}seed": seed,
    }


Suite = Annotated[list[str] | None, typer.Option("--suite", help="Suite to search (repeat for several).")]
Tasks = Annotated[int | None, typer.Option("--tasks", min=1, help="Tasks per suite.")]
Model = Annotated[str | None, typer.Option("--model", help="'smollm2', 'tiny' or a checkpoint folder.")]
StoreOpt = Annotated[Path | None, typer.Option("--store", help="Store folder.")]
Sims = Annotated[int | None, typer.Option("--sims", min=1, help="MCTS simulations per tree.")]
K = Annotated[int | None, typer.Option("--k", min=1, help="Candidate actions per expansion.")]
Seed = Annotated[int | None, typer.Option("--seed", help="Seed of tasks, sampling and search.")]
Config = Annotated[Path | None, typer.Option("--config", help="YAML/TOML file (flags override it).")]


def register(app: typer.Typer) -> None:
    app.add_typer(schedule_app, name="schedule")

    @app.command("report")
    def report(
        run: Annotated[list[str], typer.Option("--run", help="Run id; repeat for several (a generate run, a train "
                                                "run, an eval run...). A pipeline's run id covers all its rounds.")],
        store: Annotated[Path, typer.Option("--store", help="Store folder.")] = Path("runs/store"),
        out: Annotated[Path, typer.Option("--out", help="Folder for report.html, report.md and the PNGs.")] = Path("runs/report"),
    ) -> None:
        """Write an HTML (and markdown) report of one or more runs, with the models trained on
        their data and those models' evals: success by round and suite, evaluation, training
        curves, reward and value distributions, verifier pass rates, datasets, pair margins,
        checkpoints, and a solved and an unsolved search tree with action labels."""
        from dataengine.report import build_report
        from storage import Store, StoreError

        try:
            written = build_report(Store(store, create=False), run, out)
        except (StoreError, ValueError) as exc:
            _fail(str(exc))
        typer.echo(f"report: {written.html}")
        typer.echo(f"markdown: {written.markdown}")

    @app.command("pipeline")
    def pipeline(
        config: Config = None,
        run_id: Annotated[str | None, typer.Option("--run-id", help="Run id prefix of the pipeline's runs.")] = None,
        rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="generate->derive->train->evaluate rounds.")] = None,
        trainer: Annotated[list[str] | None, typer.Option("--trainer", help="dpo, sft or grpo, in order (repeat).")] = None,
        suite: Suite = None, tasks: Tasks = None, model: Model = None, store: StoreOpt = None, sims: Sims = None,
        k: K = None, seed: Seed = None,
        eval_tasks: Annotated[int | None, typer.Option("--eval-tasks", min=1, help="Held-out tasks per suite per evaluation.")] = None,
        train_steps: Annotated[int | None, typer.Option("--train-steps", help="Optimizer steps per trainer.")] = None,
        temperature: Annotated[float | None, typer.Option("--temperature", min=0.0, help="Sampling temperature of the search.")] = None,
        out: Annotated[Path | None, typer.Option("--out", help="Folder for datasets and checkpoints.")] = None,
        ray: Annotated[bool, typer.Option("--ray", help="Run shards on Ray (prefect-ray's RayTaskRunner).")] = False,
        ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster address (default: local Ray).")] = None,
        report_dir: Annotated[Path | None, typer.Option("--report", help="Also write the run report to this folder.")] = None,
        set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
        tools: ToolsOption = None,
        mcp: MCPOption = None,
        mcp_stateless: MCPStatelessOption = None,
    ) -> None:
        """Run rounds of generate -> derive -> export -> train -> evaluate as Prefect flows
        (embedded ephemeral API unless PREFECT_API_URL is set); prints the success table."""
        from dataengine.config import ConfigError, load_config

        overrides = _engine_overrides(suite, tasks, model, store, sims, k, seed, prefix="engine__")
        overrides.update(run_id=run_id, rounds=rounds, trainers=list(trainer) if trainer else None,
                         engine__eval__num_tasks=eval_tasks, engine__policy__temperature=temperature,
                         out_dir=str(out) if out else None)
        for kind in ("dpo", "sft", "grpo"):
            overrides[f"engine__train__{kind}__max_steps"] = train_steps
        if ray or ray_address:
            overrides.update(runtime__task_runner="ray", runtime__ray_address=ray_address)
        overrides.update(dotted_overrides(set_))
        overrides.update(tools_overrides(tools, mcp, mcp_stateless, config=config, prefix="engine__"))
        from dataengine.config import PipelineConfig
        from flows.pipeline import run_pipeline

        try:
            cfg = load_config(config, model=PipelineConfig, **overrides)
        except ConfigError as exc:
            _fail(str(exc))
        result = run_pipeline(cfg)
        typer.echo(result["table"])
        typer.echo(f"store: {result['store']}\nfinal model: {result['model']}")
        if report_dir is not None:
            from dataengine.report import build_report
            from storage import Store

            typer.echo(f"report: {build_report(Store(result['store']), cfg.run_id, report_dir).html}")

    @schedule_app.command("generate")
    def schedule_generate(
        name: Annotated[str, typer.Option("--name", help="Schedule (deployment) name.")],
        cron: Annotated[str, typer.Option("--cron", help="Cron expression, e.g. '0 * * * *' (hourly).")],
        config: Config = None,
        method: Annotated[str, typer.Option("--method", help="mcts, best_of_n or greedy.")] = "mcts",
        suite: Suite = None, tasks: Tasks = None, model: Model = None, store: StoreOpt = None, sims: Sims = None,
        k: K = None, seed: Seed = None,
        same_tasks: Annotated[bool, typer.Option("--same-tasks", help="Every run searches the same tasks (no seed change).")] = False,
        serve_now: Annotated[bool, typer.Option("--serve/--no-serve", help="Serve it now (blocks) or only register it.")] = True,
        pool: Annotated[str | None, typer.Option("--pool", help="Register it on this work pool (implies --no-serve): "
                                                 "`prefect worker start --pool NAME` then runs it.")] = None,
    ) -> None:
        """Create a cron schedule of the generate flow and serve it (needs PREFECT_API_URL). Runs
        start only while this process (or `schedule serve`, or a worker of --pool) is running."""
        from dataengine.config import ConfigError, EngineConfig, load_config
        from flows.schedule import ScheduleError, create_schedule, deployment_for, serve

        try:
            engine = load_config(config, model=EngineConfig, **_engine_overrides(suite, tasks, model, store, sims, k, seed))
            if method not in ("mcts", "best_of_n", "greedy"):
                raise ScheduleError(f"unknown method {method!r}; choose mcts, best_of_n or greedy")
            options = {"method": method, "vary_seed": not same_tasks}
            if pool is not None:
                deployment = create_schedule(name, cron, engine, pool=pool, **options)
                typer.echo(f"schedule {name!r} created on work pool {pool!r}: deployment {deployment}\n"
                           f"its runs start while a worker runs: prefect worker start --pool {pool}")
            elif serve_now:
                typer.echo(f"serving schedule {name!r} (cron {cron!r}): its runs start in this process when due; "
                           "keep it running (Ctrl-C stops serving and pauses the schedule; "
                           f"`dataengine schedule serve {name}` serves and resumes it)")
                serve([deployment_for(name, cron, engine, **options)])
            else:
                typer.echo(f"schedule {name!r} created: deployment {create_schedule(name, cron, engine, **options)}\n"
                           f"its runs start while `dataengine schedule serve {name}` runs")
        except (ConfigError, ScheduleError) as exc:
            _fail(str(exc))

    @schedule_app.command("list")
    def schedule_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
        """List the dataengine schedules on the Prefect server: name, cron, suites, tasks per suite,
        next run the scheduler created (UTC) and state (paused; ready: a serving process or worker
        polls it; not served: nothing will run it)."""
        from rich.console import Console

        from flows.schedule import ScheduleError, list_schedules, schedule_table

        try:
            rows = list_schedules()
        except ScheduleError as exc:
            _fail(str(exc))
        if as_json:
            typer.echo(json.dumps(rows, indent=1))
            return
        if not rows:
            typer.echo("no schedules")
            return
        Console().print(schedule_table(rows))

    def _by_name(action: str):
        def command(name: Annotated[str, typer.Argument(help="Schedule name.")]) -> None:
            from flows import schedule

            try:
                getattr(schedule, f"{action}_schedule")(name)
            except schedule.ScheduleError as exc:
                _fail(str(exc))
            typer.echo(f"schedule {name!r}: {action}d")

        command.__doc__ = f"{action.capitalize()} a schedule."
        return command

    for action in ("pause", "resume", "delete"):
        schedule_app.command(action)(_by_name(action))

    @schedule_app.command("serve")
    def schedule_serve(names: Annotated[list[str] | None, typer.Argument(help="Schedules to serve (default: all).")] = None) -> None:
        """Serve existing schedules in this process, resuming paused ones: their runs start here
        when due (blocks; Ctrl-C stops serving and pauses them)."""
        from flows.schedule import ScheduleError, serve, stored_deployments

        try:
            serve(stored_deployments(list(names) if names else None))
        except ScheduleError as exc:
            _fail(str(exc))
