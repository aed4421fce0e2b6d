"""BFCL (Berkeley Function Calling Leaderboard) from the data and tool classes shipped in bfcl-eval.

- tasks.py: categories, the package's data as Tasks (`load_tasks`), BFCL schemas as JSON Schema.
- runtime.py: BFCL's multi-turn tool classes behind a JSON-able state.
- toolboxes.py: the `bfcl:<category>` toolboxes (registry.get_toolbox).
- checks.py: verdicts on predictions, BFCL's way (`verify_predictions`), and per-task scoring
  of prediction files (`read_predictions`, `score_predictions`).
"""

from __future__ import annotations

from dataengine.external.bfcl.checks import (
    PredictionError,
    check_prediction,
    check_turns,
    gold_prediction,
    read_predictions,
    score_predictions,
    task_ids,
    verify_predictions,
)
from dataengine.external.bfcl.runtime import (
    CLASS_MODULES,
    INSTALL,
    STATELESS_CLASSES,
    call_method,
    initial_state,
    instances_for,
    jsonable,
    parse_call,
    run_calls,
    tool_class,
    world,
)
from dataengine.external.bfcl.tasks import (
    ADDED_FUNCTIONS_PROMPT,
    ALIASES,
    AST_CATEGORIES,
    CATEGORIES,
    FUNC_DOC_FILES,
    MULTI_TURN_CATEGORIES,
    RELEVANCE_CATEGORIES,
    canonical_category,
    data_dir,
    load_tasks,
    read_jsonl,
    to_json_schema,
    tool_spec,
    unsatisfiable,
)
from dataengine.external.bfcl.tasks import (
    _answers as _answers,  # raw data rows, re-exported for comparisons with BFCL's own checker
)
from dataengine.external.bfcl.tasks import (
    _entries as _entries,
)
from dataengine.external.bfcl.toolboxes import toolbox_for

__all__ = [
    "ADDED_FUNCTIONS_PROMPT",
    "ALIASES",
    "AST_CATEGORIES",
    "CATEGORIES",
    "CLASS_MODULES",
    "FUNC_DOC_FILES",
    "INSTALL",
    "MULTI_TURN_CATEGORIES",
    "RELEVANCE_CATEGORIES",
    "STATELESS_CLASSES",
    "PredictionError",
    "call_method",
    "canonical_category",
    "check_prediction",
    "check_turns",
    "data_dir",
    "gold_prediction",
    "initial_state",
    "instances_for",
    "jsonable",
    "load_tasks",
    "parse_call",
    "read_jsonl",
    "read_predictions",
    "run_calls",
    "score_predictions",
    "task_ids",
    "to_json_schema",
    "tool_class",
    "tool_spec",
    "toolbox_for",
    "unsatisfiable",
    "verify_predictions",
    "world",
]
