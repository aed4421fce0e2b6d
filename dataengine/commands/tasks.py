"""`dataengine tasks validate FILE [--tools ...]`: check a task file against its toolboxes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dataengine.commands.common import ToolsOption, fail


def register(app: typer.Typer) -> None:
    tasks_app = typer.Typer(help="Task files: check them before a run.", no_args_is_help=True)

    @tasks_app.command("validate")
    def validate_command(
        file: Annotated[Path, typer.Argument(help="Task file (.jsonl or .parquet).")],
        tools: ToolsOption = None,
    ) -> None:
        """Check every row of a task file (schema, toolbox, tool names, gold calls and end state).
        Prints one line per bad row (file, line or row, field, what is wrong) and exits 1, or
        the count of good tasks per toolbox and level and exits 0."""
        from collections import Counter

        from dataengine.suites.io import TaskFileError, check_tasks
        from dataengine.tools.registry import ToolsError

        try:
            tasks, errors = check_tasks(file, tools or ())
        except (TaskFileError, ToolsError) as exc:
            fail(exc)
        for error in errors:
            typer.echo(str(error), err=True)
        if errors:
            typer.echo(f"{file}: {len(errors)} bad row(s), {len(tasks)} good", err=True)
            raise typer.Exit(code=1)
        if not tasks:
            fail(f"{file} holds no tasks")
        counts = Counter((t.toolbox, t.metadata.get("level")) for t in tasks)
        detail = ", ".join(f"{box}" + (f" level {level}" if level is not None else "") + f": {n}"
                           for (box, level), n in sorted(counts.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))))
        typer.echo(f"{file}: {len(tasks)} tasks OK ({detail})")

    app.add_typer(tasks_app, name="tasks")
