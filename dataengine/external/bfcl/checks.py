"""Checking BFCL predictions the way BFCL does (AST rules; per-turn state and results for
multi-turn), for `dataengine verify bfcl`.

A prediction is {"id": BFCL id, "calls": [{"name": ..., "arguments": {...}}]} (or each call as
BFCL's checker reads it, {name: {arguments}}, as `dataengine eval --predictions` writes); multi-turn:
{"id", "turns": [[call, ...], ...]}, the calls of each user turn in order (a task of one turn
may give "calls"). A multi-turn prediction with another number of turns than the task is
invalid, as BFCL counts a run that stopped early.

A prediction file is scored per task: each id of the category at most once (a repeated id is an
error, not a second vote), and a task with no prediction counts as a failure, so accuracy is
valid / tasks of the category.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from dataengine.external.bfcl.tasks import (
    MULTI_TURN_CATEGORIES,
    RELEVANCE_CATEGORIES,
    _entries,
    canonical_category,
    load_tasks,
)
from dataengine.types import Task, ToolCall


def _turns_from(prediction: dict[str, Any]) -> list[list[ToolCall]]:
    """The calls of each user turn: "turns", or "calls" as one turn."""
    if "turns" in prediction and prediction.get("calls") is None:
        turns = prediction["turns"]
        if not isinstance(turns, list) or not all(isinstance(turn, list) for turn in turns):
            raise ValueError("'turns' must be a list of lists of calls")
        return [_parse_calls(turn) for turn in turns]
    return [_calls_from(prediction)]


def _calls_from(prediction: dict[str, Any]) -> list[ToolCall]:
    raw = prediction.get("calls")
    if raw is None and "turns" in prediction:
        return [c for turn in _turns_from(prediction) for c in turn]
    if raw is None:
        raise ValueError("prediction has neither 'calls' nor 'turns'")
    return _parse_calls(raw)


def _parse_calls(raw: Any) -> list[ToolCall]:
    """Calls as {"name": ..., "arguments": {...}} or as BFCL's checker reads them, {name: {...}}."""
    if not isinstance(raw, list):
        raise ValueError("'calls' must be a list of {'name': ..., 'arguments': {...}}")
    calls = []
    for item in raw:
        if isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item.values())), dict):
            ((name, args),) = item.items()
            calls.append(ToolCall(name=name, arguments=args))
            continue
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"each call must be an object with a string 'name' and 'arguments', or {{name: {{arguments}}}}; got {item!r}")
        args = item.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args)
        if not isinstance(args, dict):
            raise ValueError(f"arguments of {item['name']!r} must be a JSON object; got {args!r}")
        calls.append(ToolCall(name=item["name"], arguments=args))
    return calls


@functools.lru_cache(maxsize=1)
def _multi_turn_verifier() -> Any:
    # one instance, so each task's gold turns are replayed once per process
    from dataengine.verifiers import MultiTurnVerifier

    return MultiTurnVerifier()


def check_turns(task: Task, turns: list[list[ToolCall]]) -> tuple[bool, str]:
    """(valid, reason) of a multi-turn prediction: the calls of each user turn, executed in
    this process and judged turn by turn (MultiTurnVerifier), as BFCL's multi-turn checker."""
    from dataengine.verifiers import run_turns

    if len(turns) != task.num_turns:
        return False, f"expected {task.num_turns} turns of calls, got {len(turns)}"
    v = _multi_turn_verifier().verify(run_turns(task, turns))
    return bool(v.passed), "" if v.passed else f"{v.details['error_type']}: {v.details['error']}"


def check_prediction(task: Task, calls: list[ToolCall]) -> tuple[bool, str]:
    """(valid, reason) of one prediction, BFCL's way for the task's category (a multi-turn
    task: `calls` as its only turn; see check_turns)."""
    from dataengine.types import Action, Episode, Step
    from dataengine.verifiers import ArgumentsVerifier

    category = task.metadata["bfcl_category"]
    if category in RELEVANCE_CATEGORIES:
        want = RELEVANCE_CATEGORIES[category]
        ok = bool(calls) == want
        return ok, "" if ok else ("expected no call" if not want else "expected at least one call")
    if category in MULTI_TURN_CATEGORIES:
        return check_turns(task, [calls])
    episode = Episode(task=task, steps=[Step(action=Action(text="", tool_calls=calls))])
    v = ArgumentsVerifier().verify(episode)
    return bool(v.passed), "" if v.passed else f"{v.details['error_type']}: {v.details['error']}"


def verify_predictions(category: str, predictions: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One {"id", "valid", "reason"} per prediction {"id", "calls": [{"name", "arguments"}]}."""
    tasks = {t.metadata["bfcl_id"]: t for t in load_tasks(category)}
    for prediction in predictions:
        pid = prediction.get("id")
        task = tasks.get(pid) if isinstance(pid, str) else None
        if task is None:
            yield {"id": pid, "valid": False, "reason": f"unknown id for BFCL category {category!r}"}
            continue
        multi_turn = task.metadata["bfcl_category"] in MULTI_TURN_CATEGORIES
        try:
            parsed = _turns_from(prediction) if multi_turn else _calls_from(prediction)
        except (ValueError, json.JSONDecodeError) as exc:
            yield {"id": pid, "valid": False, "reason": f"malformed prediction: {exc}"}
            continue
        valid, reason = check_turns(task, parsed) if multi_turn else check_prediction(task, parsed)
        yield {"id": pid, "valid": valid, "reason": reason}


def _call_dicts(calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": c.arguments} for c in calls]


def gold_prediction(task: Task) -> dict[str, Any]:
    """The prediction line that reproduces the gold calls of a task (for tests and examples):
    "turns" for a multi-turn task, else "calls"."""
    if task.gold.turn_calls:
        return {"id": task.metadata["bfcl_id"], "turns": [_call_dicts(turn) for turn in task.gold.turn_calls]}
    return {"id": task.metadata["bfcl_id"], "calls": _call_dicts(task.gold.calls)}


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


class PredictionError(ValueError):
    """A prediction that cannot be scored per task; the message is one line naming where and what."""


def _row_problem(row: Any, category: str, known: Collection[str], first_seen: dict[str, str], where: str) -> str | None:
    """What makes `row` unscorable (not an object, no or non-string id, unknown id, repeated id), or None.

    Records a new id in `first_seen` (id -> `where`, e.g. "line 3").
    """
    if not isinstance(row, dict):
        return f'expected a JSON object {{"id": ..., "calls": [...]}}, got {_JSON_TYPES.get(type(row), "a non-object")}'
    if "id" not in row:
        return 'no "id"'
    pid = row["id"]
    if not isinstance(pid, str):
        shown = json.dumps(pid)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return f'"id" must be a string, got {shown} ({_JSON_TYPES.get(type(pid), type(pid).__name__)})'
    if pid not in known:
        return f"unknown id {pid!r}: not a task of BFCL category {category!r}"
    if pid in first_seen:
        return f"duplicate id {pid!r} (first seen at {first_seen[pid]}): give one prediction per task"
    first_seen[pid] = where
    return None


def task_ids(category: str) -> list[str]:
    """The BFCL ids of every task of `category`, in file order."""
    return [entry["id"] for entry in _entries(canonical_category(category))]


def read_predictions(path: Path, category: str) -> list[dict[str, Any]]:
    """The rows of a JSONL prediction file, each a prediction of a distinct task of `category`.

    Raises PredictionError "<path>:<line>: <problem>" at the first line that is not JSON, not an
    object, has no string "id", names no task of the category, or repeats an earlier id.
    """
    category = canonical_category(category)
    ids = set(task_ids(category))
    first_seen: dict[str, str] = {}
    rows = []
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise PredictionError(f"{path}:{number}: not UTF-8 text") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise PredictionError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
                problem = _row_problem(row, category, ids, first_seen, f"line {number}")
                if problem is not None:
                    raise PredictionError(f"{path}:{number}: {problem}")
                rows.append(row)
    except OSError as exc:
        raise PredictionError(f"{path}: cannot read the predictions file ({exc.strerror})") from None
    return rows


def score_predictions(category: str, predictions: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-task verdicts on `predictions` (at most one per task of `category`) and their summary.

    Returns (rows, summary): rows are one {"id", "valid", "reason"} per prediction in order, then
    one {"id", "valid": False, "reason": "no prediction"} per task left out; summary is
    {"category", "tasks", "predicted", "missing_tasks", "valid", "accuracy": valid / tasks,
    "accuracy_predicted": valid / predicted, "scoring": how accuracy was counted}.
    Raises PredictionError ("prediction <n>: <problem>") as read_predictions does for its lines.
    """
    category = canonical_category(category)
    all_ids = task_ids(category)
    known = set(all_ids)
    first_seen: dict[str, str] = {}
    predictions = list(predictions)
    for n, row in enumerate(predictions, start=1):
        problem = _row_problem(row, category, known, first_seen, f"prediction {n}")
        if problem is not None:
            raise PredictionError(f"prediction {n}: {problem}")
    rows = list(verify_predictions(category, predictions))
    rows += [{"id": pid, "valid": False, "reason": "no prediction"} for pid in all_ids if pid not in first_seen]
    valid = sum(r["valid"] for r in rows)
    missing = len(all_ids) - len(first_seen)
    summary = {
        "category": category,
        "tasks": len(all_ids),
        "predicted": len(first_seen),
        "missing_tasks": missing,
        "valid": valid,
        "accuracy": valid / len(all_ids) if all_ids else 0.0,
        "accuracy_predicted": valid / len(first_seen) if first_seen else 0.0,
        "scoring": f"per task: accuracy = valid / {len(all_ids)} tasks; the {missing} tasks with no prediction count as failures",
    }
    return rows, summary
