"""`dataengine pipeline`, `dataengine schedule ...`, `dataengine report`: the Prefect flows and
the run report from the command line (flows/ holds the flows; dataengine/report.py the report)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

schedule_app = typer.Typer(help="Cron schedules of the generate flow (Prefect deployments).", no_args_is_help=True)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.add_typer(schedule_app, name="schedule")

    @app.command("report")
    def report(
        run: Annotated[str, typer.Option("--run", help="Run id (a pipeline's run id covers all its rounds).")],
        store: Annotated[Path, typer.Option("--store", help="Store folder.")] = Path("runs/store"),
        out: Annotated[Path, typer.Option("--out", help="Folder for report.html, report.md and the PNGs.")] = Path("runs/report"),
    ) -> None:
        """Write an HTML (and markdown) report of a run: success by round and suite, reward and
        value distributions, verifier pass rates, pair margins and a rendered search tree."""
        from dataengine.report import build_report
        from storage import Store, StoreError

        try:
            written = build_report(Store(store, create=False), run, out)
        except (StoreError, ValueError) as exc:
            _fail(str(exc))
        typer.echo(f"report: {written.html}")
        typer.echo(f"markdown: {written.markdown}")
