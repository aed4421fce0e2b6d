"""Task files: JSON Lines (.jsonl) and Parquet (.parquet), chosen by the file suffix.

JSON Lines: one Task per line as its JSON object (blank lines are skipped).
Parquet: one row per task with columns
    id: string, suite: string, split: string, toolbox: string  (for filtering with Polars)
    task: string  (the whole Task as JSON; the source of truth on load)
A bad file raises TaskFileError naming the file, the line (1-based) or row (0-based) and the
field path inside the task (from pydantic's error locations, e.g. "gold.calls.0.name").
`check_tasks` collects one error per bad row instead; rows may use the short forms written for
hand-made task files (tool names, level, gold.end_state; docs/your-own-tools.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

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


def load_tasks(path: Path | str, tools: Sequence[str] = ()) -> list[Task]:
    """Read the tasks in `path` (.jsonl or .parquet); TaskFileError names what is wrong and where.

    tools: tools entries (registry.load_tools: .py files or module names) imported first, so
    the tasks may name their toolboxes. The row forms of the task-file schema are described in
    `check_tasks`.
    """
    tasks, errors = check_tasks(path, tools)
    if errors:
        raise errors[0]
    return tasks


def check_tasks(path: Path | str, tools: Sequence[str] = ()) -> tuple[list[Task], list[TaskFileError]]:
    """The good tasks of `path` and one TaskFileError per bad row (line or row, field, problem).

    A file that cannot be read at all (suffix, missing, not UTF-8, not Parquet) raises its
    TaskFileError; a bad tools entry raises registry.ToolsError. Besides a whole Task, a row
    may use the short forms of the task-file schema (docs/your-own-tools.md):
        suite: defaults to the toolbox name.
        tools: tool names of the toolbox (or whole schemas); left out: every tool of the toolbox.
        level: an integer >= 1, kept as metadata["level"].
        gold.end_state: the expected tool state after the task (a JSON object), kept as
            gold.end_state_hash; with gold.calls, replaying them must reach it.
        initial_state: left out: the toolbox's initial state (`Toolbox.initial_state`).
    A row is bad when its toolbox, a tool it offers or a gold call's tool is unknown, or when
    its request is one of the toolbox's worked examples (a tools file's `EXAMPLES`: the model
    is shown their answers, so no task may be one of them).
    """
    from dataengine.tools.registry import load_tools

    path = Path(path)
    suffix = _suffix(path)
    if not path.is_file():
        raise TaskFileError(path, "task file not found" if not path.exists() else "not a file")
    load_tools(tools)
    rows = _read_jsonl(path) if suffix == ".jsonl" else _read_parquet(path)
    tasks: list[Task] = []
    errors: list[TaskFileError] = []
    seen: dict[str, str] = {}
    toolboxes: dict[str, Any] = {}
    for data, place in rows:
        try:
            if isinstance(data, TaskFileError):
                raise data
            task = _row_task(path, data, place, toolboxes)
            if task.id in seen:
                raise TaskFileError(path, f"duplicate task id {task.id!r} (first seen at {seen[task.id]})",
                                    field="id", **place)
            seen[task.id] = " ".join(f"{k} {v}" for k, v in place.items())
        except TaskFileError as exc:
            errors.append(exc)
            continue
        tasks.append(task)
    return tasks, errors


def _toolbox(path: Path, name: Any, place: dict[str, int], cache: dict[str, Any]) -> Any:
    """The toolbox `name` (an unknown one is a TaskFileError on field toolbox), or None when
    the row's toolbox is not a string (validation reports that)."""
    from dataengine.tools.registry import get_toolbox

    if not isinstance(name, str):
        return None
    if name not in cache:
        try:
            cache[name] = get_toolbox(name)
        except (KeyError, ImportError, ValueError) as exc:
            cache[name] = str(exc.args[0] if exc.args else exc)
    if isinstance(cache[name], str):
        raise TaskFileError(path, cache[name], field="toolbox", **place)
    return cache[name]


def _row_task(path: Path, data: dict[str, Any], place: dict[str, int], cache: dict[str, Any]) -> Task:
    """One row (a JSON object) as a Task: short forms expanded, validated, checked against its
    toolbox. An unknown toolbox fails here, before a model loads or a run is recorded."""
    data = dict(data)
    box = _toolbox(path, data.get("toolbox"), place, cache)
    fail = lambda field, problem: TaskFileError(path, problem, field=field, **place)  # noqa: E731
    end_state = _MISSING
    if box is not None:
        data.setdefault("suite", box.name)
        if "level" in data:
            level = data.pop("level")
            if isinstance(level, bool) or not isinstance(level, int) or level < 1:
                raise fail("level", f"level must be an integer >= 1, got {level!r}")
            metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
            if metadata.get("level", level) != level:
                raise fail("level", f"level {level} disagrees with metadata.level {metadata['level']!r}")
            data["metadata"] = {**metadata, "level": level}
        if "tools" not in data:
            data["tools"] = [t.spec.model_dump(mode="json") for t in box.tools.values()]
        elif isinstance(data["tools"], list):
            specs = []
            for i, item in enumerate(data["tools"]):
                if isinstance(item, str):
                    if item not in box.tools:
                        raise fail(f"tools.{i}", f"unknown tool {item!r} in toolbox {box.name!r} "
                                   f"(its tools: {', '.join(box.tools)})")
                    item = box.tools[item].spec.model_dump(mode="json")
                specs.append(item)
            data["tools"] = specs
        gold = data.get("gold")
        if isinstance(gold, dict) and "end_state" in gold:
            gold = dict(gold)
            end_state = gold.pop("end_state")
            if not isinstance(end_state, dict):
                raise fail("gold.end_state", f"gold.end_state must be a JSON object (the tool state), "
                           f"got {type(end_state).__name__}")
            if gold.get("end_state_hash") is not None:
                raise fail("gold.end_state", "give gold.end_state or gold.end_state_hash, not both")
            data["gold"] = gold
    task = _validate(path, data, **place)
    if box is None:
        return task
    for i, spec in enumerate(task.tools):
        if spec.name not in box.tools:
            raise fail(f"tools.{i}.name", f"unknown tool {spec.name!r} in toolbox {box.name!r} "
                       f"(its tools: {', '.join(box.tools)})")
    for i, call in enumerate(task.gold.calls):
        if call.name not in box.tools:
            raise fail(f"gold.calls.{i}.name", f"unknown tool {call.name!r} in toolbox {box.name!r} "
                       f"(its tools: {', '.join(box.tools)})")
    shown = {e[0]["content"].strip() for e in box.examples}
    asked = [m.content.strip() for m in task.messages if m.role == "user" and isinstance(m.content, str)]
    if shown and shown.intersection(asked):
        raise fail("messages", f"this request is one of toolbox {box.name!r}'s EXAMPLES, whose answers the model "
                   "is shown before every task; a task must not be one of them")
    if "initial_state" not in data and box.make_initial_state is not None:
        task = task.model_copy(update={"initial_state": box.make_initial_state(task)})
    if task.user_turns:  # functions a later user turn adds must be tools of the toolbox
        from dataengine.env import schedule_errors

        problems = schedule_errors(task)
        if problems:
            raise fail("user_turns", problems[0])
    if end_state is not _MISSING:
        from dataengine.verifiers.end_state import end_state_hash, replay_in_process

        expected = end_state_hash(task, end_state)
        if task.gold.calls:
            reached = replay_in_process(task, list(task.gold.calls))
            if end_state_hash(task, reached) != expected:
                raise fail("gold.end_state", f"replaying gold.calls reaches another state: {json.dumps(reached)[:200]}")
        task = task.model_copy(update={"gold": task.gold.model_copy(update={"end_state_hash": expected})})
    return task


_MISSING = object()


def _validate(path: Path, data: object, **where: int) -> Task:
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(part) for part in err["loc"]) or None
        more = f" (and {exc.error_count() - 1} more errors)" if exc.error_count() > 1 else ""
        raise TaskFileError(path, f"{err['msg']}{more}", field=field, **where) from None
    return task


def _read_jsonl(path: Path) -> list[tuple[Any, dict[str, int]]]:
    """(JSON object or TaskFileError, {"line": n}) per non-blank line."""
    rows: list[tuple[Any, dict[str, int]]] = []
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
            data = TaskFileError(path, f"invalid JSON: {exc.msg} at column {exc.colno}", line=number)
        if not isinstance(data, (dict, TaskFileError)):
            data = TaskFileError(path, f"expected a JSON object (one task), got {type(data).__name__}", line=number)
        rows.append((data, {"line": number}))
    return rows


def _read_parquet(path: Path) -> list[tuple[Any, dict[str, int]]]:
    """(JSON object or TaskFileError, {"row": n}) per row of the `task` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise TaskFileError(path, f"not a readable Parquet file ({exc})") from None
    if "task" not in table.column_names:
        raise TaskFileError(path, f"missing column 'task' (columns: {', '.join(table.column_names)})")
    ids = table.column("id").to_pylist() if "id" in table.column_names else None
    rows: list[tuple[Any, dict[str, int]]] = []
    for row, text in enumerate(table.column("task").to_pylist()):
        data: Any
        if not isinstance(text, str):
            data = TaskFileError(path, "the task column must hold the task as a JSON string", row=row, field="task")
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                data = TaskFileError(path, f"invalid JSON in column 'task': {exc.msg}", row=row)
        if not isinstance(data, (dict, TaskFileError)):
            data = TaskFileError(path, f"expected a JSON object (one task), got {type(data).__name__}", row=row)
        if isinstance(data, dict) and ids is not None and ids[row] != data.get("id"):
            data = TaskFileError(path, f"column 'id' says {ids[row]!r} but the task JSON says {data.get('id')!r}",
                                 row=row, field="id")
        rows.append((data, {"row": row}))
    return rows
