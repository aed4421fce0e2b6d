"""What every command module shares: the one-line error exit and opening a store."""

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
