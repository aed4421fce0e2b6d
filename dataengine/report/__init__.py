"""Run reports: HTML/markdown pages, tables and PNG figures over any set of run ids.

- build.py: the report's tables (`report_tables`), training curves and the page (`build_report`).
- runs.py: which rows a set of run ids reaches (sub-runs, models trained on them, their evals).
- trees.py: the search-tree pictures (labels, layout, which trees are drawn).
- failures.py: why an episode failed, by its first tool turn.
"""

from dataengine.report.build import Report, build_report, report_tables, round_of, training_curves, with_round
from dataengine.report.failures import failure_kind, failure_kinds
from dataengine.report.runs import Selection, run_filter, select_runs
from dataengine.report.trees import action_label, draw_trees, labelled_tree, pick_trees, tree_figure, tree_layout

__all__ = [
    "Report",
    "Selection",
    "action_label",
    "build_report",
    "draw_trees",
    "failure_kind",
    "failure_kinds",
    "labelled_tree",
    "pick_trees",
    "report_tables",
    "round_of",
    "run_filter",
    "select_runs",
    "training_curves",
    "tree_figure",
    "tree_layout",
    "with_round",
]
