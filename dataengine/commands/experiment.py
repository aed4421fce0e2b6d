"""`dataengine experiment`: rounds of search -> derive -> SFT -> DPO -> GRPO -> held-out
evaluation with SmolLM2 (the pipeline flow), written up as the per-round results table."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from dataengine.commands.common import (
    SET_HELP,
    MCPOption,
    MCPStatelessOption,
    ToolsOption,
    dotted_overrides,
    tools_overrides,
)


def _levels(text: str | None) -> list[list[int]] | None:
    """'1;1,2;1,2,3' -> [[1], [1, 2], [1, 2, 3]]."""
    if not text:
        return None
    try:
        return [[int(x) for x in part.split(",") if x.strip()] for part in text.split(";")]
    except ValueError:
        raise typer.BadParameter(f"--curriculum takes levels per round like '1;1,2;1,2,3', got {text!r}") from None


def _round_settings(items: list[str] | None) -> dict[int, dict]:
    """['2:search.objective=efficient_success'] -> {2: {'search.objective': 'efficient_success'}}."""
    import yaml

    out: dict[int, dict] = {}
    for item in items or []:
        r, colon, rest = item.partition(":")
        key, eq, value = rest.partition("=")
        if not colon or not eq or not r.strip().isdigit() or not key.strip():
            raise typer.BadParameter(f"--round-set takes ROUND:engine.dotted.name=value, got {item!r}",
                                     param_hint="--round-set")
        out.setdefault(int(r), {})[key.strip().removeprefix("engine.")] = yaml.safe_load(value)
    return out


def experiment_overrides(config: Path | None, set_: list[str] | None, round_set: list[str] | None) -> dict:
    """The load_config overrides of --config, then --set, then --round-set (later ones win)."""
    from dataengine.config import ConfigError, read_mapping

    overrides = {}
    if config is not None:
        try:
            overrides.update(_flatten(read_mapping(config)))
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint="--config") from None
    overrides.update(dotted_overrides(set_))
    for r, settings in _round_settings(round_set).items():
        overrides.update({f"round_settings__{r}__{key}": value for key, value in settings.items()})
    return overrides


def register(app: typer.Typer) -> None:
    @app.command("experiment")
    def experiment_command(
        suite: Annotated[list[str], typer.Option("--suite", help="Suite to train and evaluate on (repeat).")] = ["arithmetic"],  # noqa: B006
        eval_suite: Annotated[list[str] | None, typer.Option("--eval-suite", help="Suite evaluated instead of --suite (repeat), e.g. an eval-only bfcl:<category> (engine.eval.suites).")] = None,
        out: Annotated[Path, typer.Option("--out", help="Folder of the store, datasets, checkpoints and results.")] = Path("runs/experiment"),
        rounds: Annotated[int, typer.Option("--rounds", min=1, help="Search -> train -> evaluate rounds.")] = 3,
        train_tasks: Annotated[int, typer.Option("--train-tasks", min=1, help="Train tasks searched per suite and round.")] = 32,
        heldout_tasks: Annotated[int, typer.Option("--heldout-tasks", min=1, help="Held-out tasks per suite in each evaluation.")] = 100,
        curriculum: Annotated[str | None, typer.Option("--curriculum", help="Task levels per round, e.g. '1;1,2;1,2,3' (last repeats).")] = None,
        trainers: Annotated[str, typer.Option("--trainers", help="Chained trainers per round, in order.")] = "sft,dpo,grpo",
        model: Annotated[str, typer.Option("--model", help="Starting model: 'smollm2', 'tiny' or a checkpoint folder.")] = "smollm2",
        seed: Annotated[int, typer.Option("--seed", help="Seed of tasks, sampling and search.")] = 0,
        config: Annotated[Path | None, typer.Option("--config", help="PipelineConfig file (YAML/TOML) with the rest; flags override it.")] = None,
        set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
        round_set: Annotated[list[str] | None, typer.Option("--round-set", help="An engine setting that changes from a round on, as ROUND:dotted=value, e.g. 2:search.objective=efficient_success (repeat; holds for that round and the later ones).")] = None,
        fork_from: Annotated[Path | None, typer.Option("--fork-from", help="Another experiment's --out: start from its first --fork-rounds finished rounds (store copied, journal stages reused) and run only the later rounds here, under these settings; needs a new run id (--set run_id=NAME).")] = None,
        fork_rounds: Annotated[int, typer.Option("--fork-rounds", min=0, help="Rounds taken from --fork-from.")] = 1,
        tools: ToolsOption = None,
        mcp: MCPOption = None,
        mcp_stateless: MCPStatelessOption = None,
    ) -> None:
        """Run a self-improvement experiment and write results.md / results.json / success.png
        (and the HTML report) under --out. A killed experiment resumes at the stage it reached."""
        from dataengine.config import ConfigError
        from dataengine.evaluation.experiment import experiment_config, write_results
        from flows.pipeline import run_pipeline

        overrides = experiment_overrides(config, set_, round_set)
        overrides.update(tools_overrides(tools, mcp, mcp_stateless, config=config, prefix="engine__"))
        if eval_suite:
            overrides["engine__eval__suites"] = list(eval_suite)
        try:
            cfg = experiment_config(out=str(out), suites=list(suite), rounds=rounds, train_tasks=train_tasks,
                                    heldout_tasks=heldout_tasks, model=model, curriculum=_levels(curriculum),
                                    trainers=[t.strip() for t in trainers.split(",") if t.strip()], seed=seed,
                                    overrides=overrides)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        if fork_from is not None:
            from flows.pipeline import fork_pipeline, forked_from

            source = str(fork_from / "pipeline")
            try:
                if not (Path(cfg.out_dir) / "journal.json").exists():
                    fork_pipeline(source, fork_from / "store", cfg, fork_rounds)
                elif (forked_from(cfg.out_dir) or {}).get("out_dir") != source:
                    raise ValueError(f"{cfg.out_dir} holds a pipeline that was not forked from {source}")
            except ValueError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from None
        result = run_pipeline(cfg)
        command = "dataengine " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        written = write_results(result, out, command=command)
        from dataengine.report import build_report
        from storage import Store

        report = build_report(Store(result["store"]), cfg.run_id, out / "report")
        typer.echo(written["markdown"].read_text())
        typer.echo(f"results: {written['markdown']} ({written['json'].name}, {written['plot'].name}); report: {report.html}")


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and key not in ("weights", "extra", "generation_kwargs"):
            out.update(_flatten(value, f"{prefix}{key}__"))
        else:
            out[f"{prefix}{key}"] = value
    return out
