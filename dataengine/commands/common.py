"""What every command module shares: the one-line error exit, opening a store, `--set` settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer


def fail(message: Any, code: int = 1) -> NoReturn:
    """Print `error: <message>` as one line on stderr and exit with `code`."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    typer.echo(f"error: {'; '.join(lines) or 'failed'}", err=True)
    raise typer.Exit(code=code)


def open_store(path: Path | str, *, create: bool = False) -> Any:
    """storage.Store at `path`; a missing or unreadable store is a one-line error."""
    from storage import Store, StoreError

    try:
        return Store(path, create=create)
    except StoreError as exc:
        fail(exc)


SET_HELP = "Any setting as dotted=value, e.g. engine.search.num_simulations=8 (repeat)."


def dotted_overrides(items: list[str] | None) -> dict[str, Any]:
    """`--set a.b=value` items -> load_config overrides {"a__b": value}; values are YAML scalars."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--set takes dotted.name=value, got {item!r}", param_hint="--set")
        out[key.strip().replace(".", "__")] = yaml.safe_load(value)
    return out
