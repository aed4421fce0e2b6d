"""`dataengine suites ...`: list the built-in suites and write their tasks to a file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    suites_app = typer.Typer(help="Built-in task suites: list them, generate task files.", no_args_is_help=True)

    @suites_app.command("list")
    def list_command() -> None:
        """Show each suite's name, tools and description."""
        from rich.console import Console
        from rich.table import Table

        from dataengine.suites import get_suite, list_suites

        table = Table("suite", "tools", "description")
        for name in list_suites():
            suite = get_suite(name)
            table.add_row(name, ", ".join(suite.toolbox.tools), suite.description)
        Console().print(table)

    @suites_app.command("generate")
    def generate_command(
        suite: Annotated[str, typer.Option("--suite", help="Suite name (see `dataengine suites list`).")],
        out: Annotated[Path, typer.Option("--out", help="Output task file: .jsonl or .parquet.")],
        train: Annotated[int, typer.Option("--train", min=0, help="Number of train tasks.")] = 1000,
        heldout: Annotated[int, typer.Option("--heldout", min=0, help="Number of held-out tasks.")] = 200,
        seed: Annotated[int, typer.Option("--seed", help="Seed; the same seed gives the same tasks.")] = 0,
    ) -> None:
        """Generate train and held-out tasks of one suite and save them to --out."""
        from dataengine.suites import (
            SUITE_MODULES,
            TaskFileError,
            generate_suite,
            save_tasks,
        )
        from dataengine.suites.io import SUFFIXES

        if suite not in SUITE_MODULES:
            raise typer.BadParameter(f"unknown suite {suite!r}; known: {', '.join(SUITE_MODULES)}", param_hint="--suite")
        if out.suffix.lower() not in SUFFIXES:
            # checked before generating, so a typo costs nothing
            raise typer.BadParameter(f"unknown task file suffix {out.suffix!r}; use one of {', '.join(SUFFIXES)}",
                                     param_hint="--out")
        try:
            tasks = generate_suite(suite, n_train=train, n_heldout=heldout, seed=seed)
            path = save_tasks(tasks, out)
        except TaskFileError as exc:
            raise typer.BadParameter(str(exc), param_hint="--out") from None
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=1) from None
        typer.echo(f"wrote {len(tasks)} tasks ({train} train, {heldout} heldout) of suite {suite} to {path}")

    app.add_typer(suites_app, name="suites")
