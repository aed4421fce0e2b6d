"""Checking BFCL predictions the way BFCL does (AST rules; end state for multi-turn), for `dataengine verify bfcl`.

A prediction is {"id": BFCL id, "calls": [{"name": ..., "arguments": {...}}]} (multi-turn: all
calls in order, or "turns": [[call, ...], ...]).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from typing import Any

from dataengine.external.bfcl.runtime import run_calls
from dataengine.external.bfcl.tasks import (
    MULTI_TURN_CATEGORIES,
    RELEVANCE_CATEGORIES,
    load_tasks,
)
from dataengine.types import Task, ToolCall


def _calls_from(prediction: dict[str, Any]) -> list[ToolCall]:
    raw = prediction.get("calls")
    if raw is None and "turns" in prediction:
        raw = [c for turn in prediction["turns"] for c in turn]
    if raw is None:
        raise ValueError("prediction has neither 'calls' nor 'turns'")
    if not isinstance(raw, list):
        raise ValueError("'calls' must be a list of {'name': ..., 'arguments': {...}}")
    calls = []
    for item in raw:
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"each call must be an object with 'name' and 'arguments'; got {item!r}")
        args = item.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args)
        calls.append(ToolCall(name=item["name"], arguments=args))
    return calls


@functools.lru_cache(maxsize=1)
def _end_state_verifier(cls: type) -> Any:
    # one instance, so each task's gold end state is replayed once per process
    return cls()


def check_prediction(task: Task, calls: list[ToolCall]) -> tuple[bool, str]:
    """(valid, reason) of one prediction, BFCL's way for the task's category."""
    from dataengine.types import Action, Episode, Step
    from dataengine.verifiers import ArgumentsVerifier, EndStateVerifier

    category = task.metadata["bfcl_category"]
    if category in RELEVANCE_CATEGORIES:
        want = RELEVANCE_CATEGORIES[category]
        ok = bool(calls) == want
        return ok, "" if ok else ("expected no call" if not want else "expected at least one call")
    if category in MULTI_TURN_CATEGORIES:
        episode = Episode(task=task, final_state=run_calls(task, calls))
        v = _end_state_verifier(EndStateVerifier).verify(episode)
        return bool(v.passed), "" if v.passed else "end state differs from the state after the gold calls"
    episode = Episode(task=task, steps=[Step(action=Action(text="", tool_calls=calls))])
    v = ArgumentsVerifier().verify(episode)
    return bool(v.passed), "" if v.passed else f"{v.details['error_type']}: {v.details['error']}"


def verify_predictions(category: str, predictions: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One {"id", "valid", "reason"} per prediction {"id", "calls": [{"name", "arguments"}]}."""
    tasks = {t.metadata["bfcl_id"]: t for t in load_tasks(category)}
    for prediction in predictions:
        pid = prediction.get("id")
        task = tasks.get(pid)
        if task is None:
            yield {"id": pid, "valid": False, "reason": f"unknown id for BFCL category {category!r}"}
            continue
        try:
            calls = _calls_from(prediction)
        except (ValueError, json.JSONDecodeError) as exc:
            yield {"id": pid, "valid": False, "reason": f"malformed prediction: {exc}"}
            continue
        valid, reason = check_prediction(task, calls)
        yield {"id": pid, "valid": valid, "reason": reason}


def gold_prediction(task: Task) -> dict[str, Any]:
    """The prediction line that reproduces the gold calls of a task (for tests and examples)."""
    return {"id": task.metadata["bfcl_id"], "calls": [{"name": c.name, "arguments": c.arguments} for c in task.gold.calls]}
