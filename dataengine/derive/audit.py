"""Pair audit: does the chosen side of each step pair take the task's gold action?

Reads the gold only to report; nothing here feeds pair selection, so selection stays usable on
tasks without a gold. The gold action at a pair's node is the next reference call when the
calls in the prompt so far match the task's reference calls one by one (BFCL's call check,
`verifiers.arguments.check_call`), or the gold final answer once every reference call is made
(`verifiers.answer.match_answer` under the task's answer rule). Off the gold path, or without a
gold, the node has no gold action.

Each step pair gets one verdict (`VERDICTS`):
- `prefers_gold`: the chosen action is the gold action and the rejected one is not;
- `inverted`: the rejected action is the gold action and the chosen one is not;
- `wrong_over_wrong`: neither is;
- `both_gold`: both are (two spellings of a correct action);
- `no_gold`: the node has no gold action.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

VERDICTS = ("prefers_gold", "inverted", "wrong_over_wrong", "both_gold", "no_gold")


def _prefix_calls(prompt_json: str | None) -> list[Any]:
    """The tool calls of the assistant turns of a prompt, in order (parsed from the raw text)."""
    from dataengine.parsing import parse_action

    calls = []
    for m in json.loads(prompt_json or "[]"):
        if m.get("role") == "assistant":
            calls.extend(parse_action(m.get("content") or "").tool_calls)
    return calls


def _gold_step(task: Any, prefix: list[Any]) -> tuple[str, Any] | None:
    """("calls", [(name, acceptable), ...] still to come) or ("answer", gold answer) at a node
    whose prefix made `prefix`; None off the gold path or without a gold."""
    from dataengine.verifiers.arguments import check_call, gold_acceptable

    gold = gold_acceptable(task)
    if len(prefix) > len(gold):
        return None
    schemas = {t.name: t.parameters for t in task.tools}
    for call, (name, acceptable) in zip(prefix, gold):
        if not check_call(schemas.get(name, {"properties": {}, "required": []}), call, name, acceptable).valid:
            return None
    if len(prefix) < len(gold):
        return ("calls", gold[len(prefix):])
    return None if task.gold.answer is None else ("answer", task.gold.answer)


def _is_gold(task: Any, step: tuple[str, Any], text: str | None) -> bool:
    """Whether the action `text` takes the gold step: its calls are the next reference calls, or
    its final answer matches the gold answer."""
    from dataengine.parsing import parse_action
    from dataengine.verifiers.answer import answer_rule, match_answer
    from dataengine.verifiers.arguments import check_call

    action = parse_action(text or "")
    if action.parse_error is not None:
        return False
    kind, gold = step
    if kind == "answer":
        if action.tool_calls or action.final_answer is None:
            return False
        return match_answer(action.final_answer, gold, rule=answer_rule(task)) in ("exact", "numeric", "contained")
    if not action.tool_calls or len(action.tool_calls) > len(gold):
        return False
    schemas = {t.name: t.parameters for t in task.tools}
    return all(check_call(schemas.get(name, {"properties": {}, "required": []}), call, name, acceptable).valid
               for call, (name, acceptable) in zip(action.tool_calls, gold))


def _side_text(side_json: str | None) -> str | None:
    messages = json.loads(side_json or "[]")
    return messages[0].get("content") if messages else None


def pair_verdict(task: Any, prompt_json: str | None, chosen_json: str | None, rejected_json: str | None) -> str:
    """One step pair's verdict (module docstring) against `task` (a Task, or None: no gold)."""
    if task is None:
        return "no_gold"
    step = _gold_step(task, _prefix_calls(prompt_json))
    if step is None:
        return "no_gold"
    chosen = _is_gold(task, step, _side_text(chosen_json))
    rejected = _is_gold(task, step, _side_text(rejected_json))
    if chosen and rejected:
        return "both_gold"
    if chosen:
        return "prefers_gold"
    return "inverted" if rejected else "wrong_over_wrong"


def audit_pairs(pairs: pl.DataFrame, tasks: pl.DataFrame | None) -> pl.DataFrame:
    """The verdict of every step pair: `pairs` with a `verdict` column (trajectory pairs are
    left out: both sides are whole verified episodes, a success over a failure).

    pairs: rows with the `pairs` columns task_id, suite, kind, prompt_json, chosen_json,
        rejected_json (and run_id when `tasks` holds several runs).
    tasks: the `tasks` table (run_id, task_id, task_json); None: every verdict is no_gold.
    """
    from dataengine.types import Task

    known: dict[str, Any] = {}
    if tasks is not None:
        for t in tasks.select("task_id", "task_json").unique("task_id", keep="last").iter_rows(named=True):
            known[t["task_id"]] = Task.model_validate_json(t["task_json"])
    steps = pairs.filter(pl.col("kind") == "step")
    verdicts = [pair_verdict(known.get(r["task_id"]), r["prompt_json"], r["chosen_json"], r["rejected_json"])
                for r in steps.select("task_id", "prompt_json", "chosen_json", "rejected_json").iter_rows(named=True)]
    return steps.with_columns(verdict=pl.Series(verdicts, dtype=pl.String))


def audit_table(audited: pl.DataFrame, trees: dict[str, int] | None = None,
                by: tuple[str, ...] = ("suite",)) -> pl.DataFrame:
    """Per suite (or per `by` columns): step pairs, one column per verdict, `gold_share` =
    prefers_gold over the pairs whose node has a gold action (null when none has), and with
    `trees` (suite -> searched trees) `trees` and `pairs_per_tree`. Sorted by `by`."""
    counts = (
        audited.group_by(*by)
        .agg(pairs=pl.len(), **{v: (pl.col("verdict") == v).sum() for v in VERDICTS})
        .with_columns(gold_share=pl.when(pl.col("pairs") > pl.col("no_gold"))
                      .then(pl.col("prefers_gold") / (pl.col("pairs") - pl.col("no_gold"))))
        .sort(*by)
    )
    if trees is not None:
        suites = pl.DataFrame({"suite": list(trees), "trees": list(trees.values())},
                              schema={"suite": pl.String, "trees": pl.Int64})
        counts = (suites.join(counts, on="suite", how="left")
                  .with_columns(pl.col(c).fill_null(0) for c in ("pairs", *VERDICTS))
                  .with_columns(pairs_per_tree=pl.col("pairs") / pl.col("trees")).sort("suite"))
    return counts


def audit_lines(table: pl.DataFrame) -> list[str]:
    """One plain-text line per suite of an `audit_table`."""
    lines = []
    for r in table.iter_rows(named=True):
        share = "-" if r["gold_share"] is None else f"{r['gold_share']:.0%}"
        per_tree = f", {r['pairs_per_tree']:.2f} per tree ({r['trees']} trees)" if "trees" in r else ""
        lines.append(f"{r['suite']}: {r['pairs']} step pairs{per_tree}: {r['prefers_gold']} prefer the gold action "
                     f"({share} of those with a gold), {r['inverted']} inverted, {r['wrong_over_wrong']} wrong over "
                     f"wrong, {r['both_gold']} both gold, {r['no_gold']} without a gold")
    return lines


def report_audit(pairs: pl.LazyFrame, tasks: pl.LazyFrame) -> pl.DataFrame:
    """The run report's audit: `audit_table` per (run_id, suite) of the step pairs in `pairs`,
    against the tasks of the same ids in `tasks` (any run)."""
    steps = (pairs.filter(pl.col("kind") == "step")
             .select("run_id", "task_id", "suite", "kind", "prompt_json", "chosen_json", "rejected_json").collect())
    known = (tasks.filter(pl.col("task_id").is_in(steps["task_id"].unique().to_list()))
             .select("task_id", "task_json").collect())
    return audit_table(audit_pairs(steps, known), by=("run_id", "suite"))


def stored_audit(store: Any, out_runs: list[str], source_runs: list[str] | None) -> pl.DataFrame:
    """`audit_table` of the step pairs derived into `out_runs` (shard derive/step-pairs), against
    the tasks of `source_runs` (None: every run), with pairs per searched tree."""
    pairs = (store.scan("pairs").filter(pl.col("run_id").is_in(out_runs)
                                        & (pl.col("shard_id") == "derive/step-pairs"))
             .select("task_id", "suite", "kind", "prompt_json", "chosen_json", "rejected_json").collect())
    tasks = None
    trees: dict[str, int] = {}
    if store.has_table("tasks"):
        scan = store.scan("tasks")
        if source_runs:
            scan = scan.filter(pl.col("run_id").is_in(source_runs))
        tasks = scan.select("task_id", "suite", "task_json").collect()
        per_suite = tasks.group_by("suite").agg(pl.col("task_id").n_unique()).sort("suite")
        trees = dict(zip(per_suite["suite"].to_list(), per_suite["task_id"].to_list()))
    return audit_table(audit_pairs(pairs, tasks), trees or None)
