"""Evaluation on held-out tasks: greedy success, pass@k, search at inference and per-axis
(when / which / how / final) rates, with 95% intervals, written to the store's evals table."""

from dataengine.evaluation.evaluate import (
    AXES,
    EvalConfig,
    EvalReport,
    Metric,
    evaluate,
    trajectory_rows,
    write_report,
)
from dataengine.evaluation.rollout import Rollout, rollouts
from dataengine.evaluation.stats import (
    bootstrap_interval,
    pass_at_k,
    pass_at_k_task,
    wilson_interval,
)

__all__ = [
    "AXES",
    "EvalConfig",
    "EvalReport",
    "Metric",
    "Rollout",
    "bootstrap_interval",
    "evaluate",
    "pass_at_k",
    "pass_at_k_task",
    "rollouts",
    "trajectory_rows",
    "wilson_interval",
    "write_report",
]
