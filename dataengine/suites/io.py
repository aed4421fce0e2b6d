"""Task files: JSON Lines (.jsonl) and Parquet (.parquet), chosen by the file suffix.

JSON Lines: one Task per line as its JSON object (blank lines are skipped).
Parquet: one row per task with columns
    id: string, suite: string, split: string, toolbox: string  (for filtering with Polars)
    task: string  (the whole Task as JSON; the source of truth on load)
A bad file raises TaskFileError naming the file, the line (1-based) or row (0-based) and the
field path inside the task (from pydantic's error locations, e.g. "gold.calls.0.name").
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from dataengine.types import Task

SUFFIXES = (".jsonl", ".parquet")
PARQUET_COLUMNS = ("id", "suite", "split", "toolbox", "task")


class TaskFileError(ValueError):
    """A task file that cannot be read: names the file, the line or row, and the field."""

    def __init__(self, path: Path | str, problem: str, line: int | None = None, row: int | None = None,
                 field: str | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.row = row
        self.field = field
        where = [self.path]
        if line is not None:
            where.append(f"line {line}")
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{', '.join(where)}: {problem}")


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise TaskFileError(path, f"unknown task file suffix {path.suffix!r}; use one of {', '.join(SUFFIXES)}")
    return suffix


def save_tasks(tasks: Iterable[Task], path: Path | str) -> Path:
    """Write `tasks` to `path` (.jsonl or .parquet, by suffix); parent folders are created."""
    path = Path(path)
    suffix = _suffix(path)
    tasks = list(tasks)
    for i, task in enumerate(tasks):
        if not isinstance(task, Task):
            raise TypeError(f"save_tasks: item {i} is a {type(task).__name__}, not a Task")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as f:
            for task in tasks:
                f.write(task.model_dump_json() + "\n")
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": pa.array([t.id for t in tasks], pa.string()),
            "suite": pa.array([t.suite for t in tasks], pa.string()),
            "split": pa.array([t.split for t in tasks], pa.string()),
            "toolbox": pa.array([t.toolbox for t in tasks], pa.string()),
            "task": pa.array([t.model_dump_json() for t in tasks], pa.string()),
        }
    )
    pq.write_table(table, path)
    return path


def load_tasks(path: Path | str) -> list[Task]:
    """Read the tasks in `path` (.jsonl or .parquet); TaskFileError names what is wrong and where."""
    path = Path(path)
    suffix = _suffix(path)
    if not path.is_file():
        raise TaskFileError(path, "task file not found" if not path.exists() else "not a file")
    tasks, places = _load_jsonl(path) if suffix == ".jsonl" else _load_parquet(path)
    from dataengine.tools.registry import get_toolbox

    seen: dict[str, str] = {}
    toolboxes: dict[str, str | None] = {}
    for task, place in zip(tasks, places):
        if task.id in seen:
            raise TaskFileError(path, f"duplicate task id {task.id!r} (first seen at {seen[task.id]})",
                                field="id", **place)
        seen[task.id] = " ".join(f"{k} {v}" for k, v in place.items())
        # An unknown toolbox fails here, before a model loads or a run is recorded.
        if task.toolbox not in toolboxes:
            try:
                get_toolbox(task.toolbox)
                toolboxes[task.toolbox] = None
            except (KeyError, ImportError, ValueError) as exc:
                toolboxes[task.toolbox] = str(exc.args[0] if exc.args else exc)
        if toolboxes[task.toolbox] is not None:
            raise TaskFileError(path, toolboxes[task.toolbox], field="toolbox", **place)
        if task.user_turns:  # functions a later user turn adds must be tools of the toolbox
            from dataengine.env import schedule_errors

            problems = schedule_errors(task)
            if problems:
                raise TaskFileError(path, problems[0], field="user_turns", **place)
    return tasks


def _validate(path: Path, data: object, **where: int) -> Task:
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(part) for part in err["loc"]) or None
        more = f" (and {exc.error_count() - 1} more errors)" if exc.error_count() > 1 else ""
        raise TaskFileError(path, f"{err['msg']}{more}", field=field, **where) from None
    return task


def _load_jsonl(path: Path) -> tuple[list[Task], list[dict[str, int]]]:
    tasks: list[Task] = []
    places: list[dict[str, int]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFileError(path, f"not UTF-8 text ({exc.reason})") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFileError(path, f"invalid JSON: {exc.msg} at column {exc.colno}", line=number) from None
        if not isinstance(data, dict):
            raise TaskFileError(path, f"expected a JSON object (one task), got {type(data).__name__}", line=number)
        tasks.append(_validate(path, data, line=number))
        places.append({"line": number})
    return tasks, places


def _load_parquet(path: Path) -> tuple[list[Task], list[dict[str, int]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise TaskFileError(path, f"not a readable Parquet file ({exc})") from None
    if "task" not in table.column_names:
        raise TaskFileError(path, f"missing column 'task' (columns: {', '.join(table.column_names)})")
    tasks: list[Task] = []
    for row, text in enumerate(table.column("task").to_pylist()):
        if not isinstance(text, str):
            raise TaskFileError(path, "the task column must hold the task as a JSON string", row=row, field="task")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskFileError(path, f"invalid JSON in column 'task': {exc.msg}", row=row) from None
        if not isinstance(data, dict):
            raise TaskFileError(path, f"expected a JSON object (one task), got {type(data).__name__}", row=row)
        tasks.append(_validate(path, data, row=row))
    if "id" in table.column_names:
        for row, (task, row_id) in enumerate(zip(tasks, table.column("id").to_pylist())):
            if row_id != task.id:
                raise TaskFileError(path, f"column 'id' says {row_id!r} but the task JSON says {task.id!r}",
                                    row=row, field="id")
    return tasks, [{"row": row} for row in range(len(tasks))]
