"""Verifiers: rule-based checks returning Verdicts, the composite reward and the cascade.

Import from here: `from dataengine.verifiers import CompositeReward, default_verifiers, axes`.
Model-based verifiers (reward model, LLM judge) live in dataengine.verifiers.model_based and
implement the same Verifier protocol.
"""

from dataengine.verifiers.answer import (
    FinalAnswerVerifier,
    match_answer,
    normalize_answer,
)
from dataengine.verifiers.arguments import (
    ArgumentsVerifier,
    CallCheck,
    NumericArgumentsVerifier,
    check_call,
    check_calls,
    gold_acceptable,
    standardize_string,
)
from dataengine.verifiers.base import Verifier, not_applicable, verdict
from dataengine.verifiers.calls import ExecutionVerifier, WhenVerifier, WhichVerifier
from dataengine.verifiers.composite import (
    Cascade,
    CompositeReward,
    RewardResult,
    RewardWeights,
    axes,
    default_verifiers,
    is_success,
    outcome_verdict,
    outcome_verdicts,
    rule_verifiers,
)
from dataengine.verifiers.efficiency import EfficiencyVerifier, LengthVerifier
from dataengine.verifiers.end_state import (
    EndStateVerifier,
    end_state_hash,
    replay_in_process,
    state_view,
)
from dataengine.verifiers.multi_turn import MultiTurnVerifier, run_turns
from dataengine.verifiers.schema import FormatVerifier, schema_errors

__all__ = [
    "ArgumentsVerifier",
    "CallCheck",
    "Cascade",
    "CompositeReward",
    "EfficiencyVerifier",
    "EndStateVerifier",
    "ExecutionVerifier",
    "FinalAnswerVerifier",
    "FormatVerifier",
    "LengthVerifier",
    "MultiTurnVerifier",
    "NumericArgumentsVerifier",
    "RewardResult",
    "RewardWeights",
    "Verifier",
    "WhenVerifier",
    "WhichVerifier",
    "axes",
    "check_call",
    "check_calls",
    "default_verifiers",
    "end_state_hash",
    "gold_acceptable",
    "is_success",
    "match_answer",
    "normalize_answer",
    "not_applicable",
    "outcome_verdict",
    "outcome_verdicts",
    "replay_in_process",
    "rule_verifiers",
    "run_turns",
    "schema_errors",
    "standardize_string",
    "state_view",
    "verdict",
]
