"""What every command module shares: the one-line error exit, opening a store, `--set` settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

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


# --tools and --mcp: the same two options on generate, eval, experiment, pipeline and demo.
ToolsOption = Annotated[
    list[str] | None,
    typer.Option("--tools", metavar="PATH_OR_MODULE",
                 help="Your own tools: a .py file or an importable module whose type-hinted functions (or the "
                      "Toolbox it registers) become a toolbox, imported in every sandbox worker (repeat; config tools.modules)."),
]
MCPOption = Annotated[
    list[str] | None,
    typer.Option("--mcp", metavar="NAME=COMMAND",
                 help="An MCP server over stdio offered as toolbox NAME, e.g. --mcp 'files=npx -y server-fs /data' "
                      "(repeat; stateful; config tools.mcp)."),
]
MCPStatelessOption = Annotated[
    list[str] | None,
    typer.Option("--mcp-stateless", metavar="NAME=COMMAND",
                 help="As --mcp, for a server whose calls never change its state (repeat)."),
]


def parse_mcp(item: str, *, stateful: bool = True, flag: str = "--mcp") -> dict[str, Any]:
    """`NAME=COMMAND` -> a tools.mcp entry {name, command: [argv...], stateful} (COMMAND split
    as a shell would, with shlex)."""
    import shlex

    name, sep, command = item.partition("=")
    if not sep or not name.strip():
        raise typer.BadParameter(f"{flag} takes NAME=COMMAND, got {item!r}", param_hint=flag)
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise typer.BadParameter(f"{flag} {item!r}: the command does not split into words ({exc})", param_hint=flag) from None
    if not argv:
        raise typer.BadParameter(f"{flag} {name.strip()}=: the command is empty", param_hint=flag)
    return {"name": name.strip(), "command": argv, "stateful": stateful}


def tools_overrides(tools: list[str] | None = None, mcp: list[str] | None = None,
                    mcp_stateless: list[str] | None = None, *, config: Path | str | None = None,
                    prefix: str = "") -> dict[str, Any]:
    """--tools / --mcp / --mcp-stateless -> load_config overrides ({prefix}tools__modules,
    {prefix}tools__mcp; prefix "engine__" for a pipeline or experiment config).

    The flags add to the entries the `config` file already has; a .py file becomes its absolute
    path, so a run does not depend on the folder it was started in. Empty when no flag is
    given. A missing file or a malformed NAME=COMMAND is a BadParameter naming it."""
    from dataengine.config import ConfigError, read_mapping
    from dataengine.tools.registry import ToolsError, tools_entry

    servers = [parse_mcp(m) for m in mcp or []]
    servers += [parse_mcp(m, stateful=False, flag="--mcp-stateless") for m in mcp_stateless or []]
    if not tools and not servers:
        return {}
    section: Any = {}
    if config is not None:
        try:
            section = read_mapping(config)
        except ConfigError:
            section = {}  # load_config reports the file itself
        for part in [*prefix.split("__")[:-1], "tools"] if prefix else ["tools"]:
            section = section.get(part, {}) if isinstance(section, dict) else {}
    if not isinstance(section, dict):
        section = {}
    out: dict[str, Any] = {}
    if tools:
        try:
            entries = [tools_entry(t) for t in tools]
        except ToolsError as exc:
            raise typer.BadParameter(str(exc), param_hint="--tools") from None
        out[f"{prefix}tools__modules"] = list(dict.fromkeys([*list(section.get("modules") or []), *entries]))
    if servers:
        out[f"{prefix}tools__mcp"] = [*list(section.get("mcp") or []), *servers]
    return out
