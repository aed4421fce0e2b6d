"""Derived datasets from search trees and trajectories: step pairs (Agent Q), trajectory pairs
(ETO), rejection-sampling SFT, error-recovery splices (Agent-R) and GRPO replay prompts.

The functions in pairs/sft/replay are pure Polars over the store's LazyFrames (testable on
hand-built node rows); `derive` writes their results to the store with lineage.
"""

from dataengine.derive.pairs import (
    node_value,
    path_logprobs,
    step_pairs,
    trajectory_pairs,
)
from dataengine.derive.replay import grpo_replay
from dataengine.derive.sft import recovery_examples, rejection_sft
from dataengine.derive.store import (
    KINDS,
    DeriveOptions,
    DeriveResult,
    derive,
    derive_frame,
)

__all__ = [
    "KINDS",
    "DeriveOptions",
    "DeriveResult",
    "derive",
    "derive_frame",
    "grpo_replay",
    "node_value",
    "path_logprobs",
    "recovery_examples",
    "rejection_sft",
    "step_pairs",
    "trajectory_pairs",
]
