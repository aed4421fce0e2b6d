"""Scores of the external benchmarks, counted as their own projects count them.

BFCL (`bfcl:<category>` suites): the greedy episode's calls are the prediction. Single-turn
categories take the calls of the first assistant turn (BFCL scores the first response; a turn
that is not a call is no call, which irrelevance counts as right); multi-turn categories take
the calls of each user turn. A prediction line is {"id": BFCL id, "calls": [{name: {arguments}},
...]} (multi-turn: "turns": [[{name: {arguments}}, ...], ...]), the decoded form BFCL's checkers
read. Accuracy = valid / tasks evaluated, judged by `external.bfcl.check_prediction` /
`check_turns`, whose verdicts equal BFCL's own checkers (tests/test_bfcl.py).

Summaries over several categories, as the leaderboard averages them
(bfcl_eval/eval_checker/eval_runner_helper.py): non-live AST = unweighted mean of simple (itself
the mean of simple_python, simple_java, simple_javascript), multiple, parallel and
parallel_multiple, a category not evaluated counting 0; live AST = mean over the live AST tasks
(weighted by count); multi-turn = unweighted mean of the four multi-turn categories.

tau2 (`tau2:<domain>` suites): pass^1 = share of tasks whose one greedy episode gets tau2's
reward 1 (the `tau2` verdict, dataengine.verifiers.tau2).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dataengine.types import Episode, ToolCall

NON_LIVE_SIMPLE = ("simple_python", "simple_java", "simple_javascript")
NON_LIVE_AST = ("simple", "multiple", "parallel", "parallel_multiple")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")


def _bfcl_calls(calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    return [{c.name: dict(c.arguments)} for c in calls]


def bfcl_prediction(episode: Episode) -> dict[str, Any]:
    """The BFCL prediction line of a played episode of a BFCL task (module docstring)."""
    from dataengine.external.bfcl.tasks import MULTI_TURN_CATEGORIES
    from dataengine.verifiers.multi_turn import turns_of

    task = episode.task
    pid = task.metadata["bfcl_id"]
    if task.metadata["bfcl_category"] in MULTI_TURN_CATEGORIES:
        turns = [[c for s in steps for c in s.action.tool_calls] for steps in turns_of(episode)]
        if not episode.done and len(turns) >= task.num_turns:
            turns = turns[:-1]  # cut off in its last turn: BFCL fails a run that did not finish
        return {"id": pid, "turns": [_bfcl_calls(turn) for turn in turns]}
    first = episode.steps[0].action.tool_calls if episode.steps else []
    return {"id": pid, "calls": _bfcl_calls(first)}


def bfcl_verdicts(predictions: Sequence[dict[str, Any]], tasks: Sequence[Any]) -> list[dict[str, Any]]:
    """{"id", "valid", "reason"} of each prediction, judged as BFCL judges it."""
    from dataengine.external.bfcl.checks import _calls_from, _turns_from, check_prediction, check_turns

    out = []
    for prediction, task in zip(predictions, tasks, strict=True):
        if "turns" in prediction:
            valid, reason = check_turns(task, _turns_from(prediction))
        else:
            valid, reason = check_prediction(task, _calls_from(prediction))
        out.append({"id": prediction["id"], "valid": valid, "reason": reason})
    return out


def bfcl_score(category: str, episodes: Sequence[Episode]) -> dict[str, Any]:
    """{"category", "tasks", "valid", "accuracy", "predictions", "verdicts"} of the greedy
    episodes of one BFCL category (accuracy = valid / tasks)."""
    predictions = [bfcl_prediction(e) for e in episodes]
    verdicts = bfcl_verdicts(predictions, [e.task for e in episodes])
    valid = sum(v["valid"] for v in verdicts)
    return {"category": category, "tasks": len(episodes), "valid": valid,
            "accuracy": valid / len(episodes) if episodes else 0.0, "predictions": predictions, "verdicts": verdicts}


def bfcl_summary(accuracy: dict[str, float], counts: dict[str, int] | None = None) -> dict[str, Any]:
    """The leaderboard's averages of per-category accuracies (module docstring):
    {"non_live_ast", "live_ast", "multi_turn"} (None where no category of the group was
    evaluated) and "missing": {group: [categories counted as 0 or left out]}."""
    counts = counts or {}
    out: dict[str, Any] = {"missing": {}}

    def unweighted(names: Sequence[str], values: dict[str, float]) -> float | None:
        if not any(n in values for n in names):
            return None
        missing = [n for n in names if n not in values]
        if missing:
            out["missing"].setdefault(group, []).extend(missing)
        return sum(values.get(n, 0.0) for n in names) / len(names)

    group = "non_live_ast"
    simple = unweighted(NON_LIVE_SIMPLE, accuracy)
    values = {k: v for k, v in accuracy.items() if k in NON_LIVE_AST}
    if simple is not None:
        values["simple"] = simple
    out["non_live_ast"] = unweighted(NON_LIVE_AST, values)
    group = "live_ast"
    live = [n for n in LIVE_AST if n in accuracy]
    total = sum(counts.get(n, 1) for n in live)
    out["live_ast"] = sum(accuracy[n] * counts.get(n, 1) for n in live) / total if live else None
    if live and len(live) < len(LIVE_AST):
        out["missing"]["live_ast"] = [n for n in LIVE_AST if n not in accuracy]
    group = "multi_turn"
    out["multi_turn"] = unweighted(MULTI_TURN, accuracy)
    return out


def write_predictions(path: Path, predictions: Iterable[dict[str, Any]]) -> int:
    """Write prediction lines as JSON Lines (replacing the file); returns the number written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for row in predictions:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def tau2_pass1(verdict_lists: Sequence[Sequence[Any]]) -> tuple[int, int]:
    """(tasks whose episode got tau2's reward 1, tasks) over one episode per task."""
    passed = sum(any(v.name == "tau2" and v.passed for v in verdicts) for verdicts in verdict_lists)
    return passed, len(verdict_lists)
