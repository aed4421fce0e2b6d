"""The `dataengine` command line (typer).

Each area adds its commands in its own module under dataengine/commands/, exposing
`register(app)`. Heavy imports (torch, transformers, deltalake) stay inside the commands so
`dataengine --help` is fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="dataengine",
    help="Search-and-preference data engine for tool-using LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# Modules under dataengine/commands/ that register commands, in help order.
COMMAND_MODULES = [
    "demo",
    "suites",
    "tasks",
    "verify",
    "store",
    "policy",
    "generate",
    "derive_eval",
    "train",
    "flows",
    "experiment",
]

for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"dataengine.commands.{_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"dataengine.commands.{_name}":
            raise
        continue
    _module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
