"""Parity of our multi-turn verdicts (`verify_predictions`, MultiTurnVerifier) with BFCL's own
multi-turn checker (bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker).

For every task of a multi-turn category: the gold trajectory (each turn's gold calls) and
deterministic perturbations of it:

- drop_first, drop_last: the first / the last gold call left out;
- wrong_arg: the first argument of a call changed (a string gets "_x" appended, a number +1, a
  bool negated, a list loses its last item), trying the calls from the last;
- extra_call: the first gold call made twice in a row;
- moved_later: the last call of the first turn with calls moved to the start of the next turn;
- moved_earlier: the first call of the last turn with calls moved to the end of the turn before;
- empty_turn: the last turn with gold calls left without calls.

Each prediction is judged by `verify_predictions` and by BFCL's checker, which runs BFCL's own
executor on the calls rendered as Python call strings (BFCL evals them: only gold calls and
these perturbations of them are ever passed to it). BFCL keeps its tool instances in module
globals named after the model and the task; each check uses a fresh name and removes them.

`python -m dataengine.external.bfcl.parity [--every N] [--baseline]` prints the agreement per
category, how many trajectories of each kind BFCL accepts, and with --baseline the agreement of
the check this replaced (the end state after all calls, turns flattened).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

from dataengine.external.bfcl.checks import verify_predictions
from dataengine.external.bfcl.tasks import MULTI_TURN_CATEGORIES, _answers, _entries, load_tasks
from dataengine.types import Task, ToolCall

KINDS = ("gold", "drop_first", "drop_last", "wrong_arg", "extra_call", "moved_later", "moved_earlier", "empty_turn")
Turns = list[list[ToolCall]]


def _mutate(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return value[:-1] if value else ["_x"]
    return "_x"


def _positions(turns: Turns) -> list[tuple[int, int]]:
    return [(t, i) for t, turn in enumerate(turns) for i in range(len(turn))]


def perturbations(task: Task) -> Iterator[tuple[str, Turns]]:
    """(kind, turns) for the gold and each perturbation that applies to `task` (KINDS order)."""
    gold = [list(turn) for turn in task.gold.turn_calls]
    yield "gold", gold
    where = _positions(gold)
    if not where:
        return
    for kind, (t, i) in (("drop_first", where[0]), ("drop_last", where[-1])):
        turns = [list(turn) for turn in gold]
        del turns[t][i]
        yield kind, turns
    for t, i in reversed(where):
        call = gold[t][i]
        if call.arguments:
            key = next(iter(call.arguments))
            turns = [list(turn) for turn in gold]
            turns[t][i] = ToolCall(name=call.name, arguments={**call.arguments, key: _mutate(call.arguments[key])})
            yield "wrong_arg", turns
            break
    t, i = where[0]
    turns = [list(turn) for turn in gold]
    turns[t].insert(i, gold[t][i])
    yield "extra_call", turns
    with_calls = [t for t, turn in enumerate(gold) if turn]
    if with_calls[0] + 1 < len(gold):
        turns = [list(turn) for turn in gold]
        turns[with_calls[0] + 1].insert(0, turns[with_calls[0]].pop())
        yield "moved_later", turns
    if with_calls[-1] > 0:
        turns = [list(turn) for turn in gold]
        turns[with_calls[-1] - 1].append(turns[with_calls[-1]].pop(0))
        yield "moved_earlier", turns
    turns = [list(turn) for turn in gold]
    turns[with_calls[-1]] = []
    yield "empty_turn", turns


def render(call: ToolCall) -> str:
    """A call as the Python call string BFCL executes, e.g. "cd(folder='document')"."""
    return f"{call.name}({', '.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


_counter = itertools.count()


def bfcl_valid(entry: dict[str, Any], ground_truth: list[list[str]], turns: Turns, category: str) -> bool:
    """BFCL's own verdict (multi_turn_checker, after its turn-count check) on `turns`."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    if len(turns) != len(ground_truth):  # BFCL's runner fails the entry as force-terminated
        return False
    model = f"dataengine_parity_{next(_counter)}"
    # one step per turn holding all its calls; an empty turn has no step, as BFCL's runner drops empty decodes
    decoded = [[[render(c) for c in turn]] if turn else [] for turn in turns]
    try:
        return bool(multi_turn_checker(decoded, ground_truth, entry, category, model)["valid"])
    finally:
        for name in [n for n in vars(multi_turn_utils) if n.startswith(model)]:
            delattr(multi_turn_utils, name)


def end_state_only(task: Task, turns: Turns) -> bool:
    """The check this module's verifier replaced: the end state after all calls, turns flattened."""
    from dataengine.external.bfcl.runtime import run_calls
    from dataengine.verifiers.end_state import end_state_hash

    flat = [c for turn in turns for c in turn]
    return end_state_hash(task, run_calls(task, flat)) == end_state_hash(task, run_calls(task, list(task.gold.calls)))


def agreement(category: str, every: int = 1, baseline: bool = False) -> dict[str, Any]:
    """Our verdict vs BFCL's on the gold and perturbed trajectories of every `every`-th task of
    `category`: {"category", "tasks", "checked", "agree", "by_kind": {kind: [agree, n, BFCL
    valid]}, "disagreements": [(task id, kind, ours, bfcl), ...] (at most 20), and with
    `baseline` "baseline_agree": how many end_state_only verdicts agree with BFCL}."""
    entries = {e["id"]: e for e in _entries(category)}
    answers = _answers(category)
    tasks = load_tasks(category)[::every]
    cases = [(task, kind, turns) for task in tasks for kind, turns in perturbations(task)]
    preds = [{"id": task.metadata["bfcl_id"], "turns": [[{"name": c.name, "arguments": c.arguments} for c in turn] for turn in turns]}
             for task, _, turns in cases]
    ours = [r["valid"] for r in verify_predictions(category, preds)]
    by_kind: dict[str, list[int]] = {}
    disagreements = []
    baseline_agree = 0
    for (task, kind, turns), mine in zip(cases, ours):
        bfcl_id = task.metadata["bfcl_id"]
        theirs = bfcl_valid(entries[bfcl_id], answers[bfcl_id], turns, category)
        cell = by_kind.setdefault(kind, [0, 0, 0])
        cell[0] += mine == theirs
        cell[1] += 1
        cell[2] += theirs
        if mine != theirs and len(disagreements) < 20:
            disagreements.append((task.id, kind, mine, theirs))
        if baseline:
            baseline_agree += end_state_only(task, turns) == theirs
    out = {
        "category": category,
        "tasks": len(tasks),
        "checked": sum(c[1] for c in by_kind.values()),
        "agree": sum(c[0] for c in by_kind.values()),
        "by_kind": by_kind,
        "disagreements": disagreements,
    }
    if baseline:
        out["baseline_agree"] = baseline_agree
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="check every N-th task of each category (default: all)")
    parser.add_argument("--category", action="append", choices=MULTI_TURN_CATEGORIES, help="repeatable; default: all four")
    parser.add_argument("--baseline", action="store_true", help="also score the end-state-only check against BFCL")
    args = parser.parse_args(argv)
    total: Counter[str] = Counter()
    for category in args.category or MULTI_TURN_CATEGORIES:
        r = agreement(category, args.every, args.baseline)
        total.update(checked=r["checked"], agree=r["agree"], baseline=r.get("baseline_agree", 0))
        kinds = ", ".join(f"{k} {a}/{n} (BFCL valid {v})" for k, (a, n, v) in r["by_kind"].items())
        line = f"{category}: {r['tasks']} tasks, {r['agree']}/{r['checked']} agree"
        if args.baseline:
            line += f"; end state only: {r['baseline_agree']}/{r['checked']}"
        print(f"{line}\n  {kinds}")
        for d in r["disagreements"]:
            print(f"  disagree: {d[0]} {d[1]}: ours {d[2]}, bfcl {d[3]}")
    n = max(1, total["checked"])
    print(f"all: {total['agree']}/{total['checked']} agree ({total['agree'] / n:.4f})"
          + (f"; end state only: {total['baseline']}/{total['checked']} ({total['baseline'] / n:.4f})" if args.baseline else ""))
    return 0 if total["agree"] == total["checked"] else 1


if __name__ == "__main__":
    sys.exit(main())
