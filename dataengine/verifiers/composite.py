"""Composite reward, the verifier cascade, default verifier choice and per-axis evaluation.

Reward of an episode (CompositeReward.score):

    reward = success_weight * success
           + min(shaping_cap, sum_i shaping[i] * score_i)          (shaping, >= 0, capped)
           + max(syntax_penalty_cap, syntax_penalty * malformed_steps)   (<= 0)

success: the outcome verdicts passed (multi_turn, end_state, final_answer and tau2's reward,
those that apply; else arguments) and the "when" verdict passed. The defaults make success dominate:
success is worth 1.0, all shaping together at most 0.15, the syntax penalty at most -0.1, so a
failed episode never out-scores a successful one (checked in RewardWeights.__post_init__).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from dataengine.types import Episode, Step, Task, Verdict
from dataengine.verifiers.answer import FinalAnswerVerifier
from dataengine.verifiers.arguments import ArgumentsVerifier, NumericArgumentsVerifier
from dataengine.verifiers.base import Verifier, is_stateful, verify_step
from dataengine.verifiers.calls import ExecutionVerifier, WhenVerifier, WhichVerifier
from dataengine.verifiers.efficiency import EfficiencyVerifier, LengthVerifier
from dataengine.verifiers.end_state import EndStateVerifier, Replay
from dataengine.verifiers.multi_turn import MultiTurnVerifier
from dataengine.verifiers.schema import FormatVerifier
from dataengine.verifiers.tau2 import Tau2Verifier, is_tau2_task

OUTCOME_ORDER = ("multi_turn", "end_state", "final_answer", "tau2", "arguments")


def _default_shaping() -> dict[str, float]:
    return {"format": 0.04, "which": 0.03, "execution": 0.03, "arguments": 0.04, "efficiency": 0.03, "length": 0.03}


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the composite reward.

    success: reward for a successful episode (the outcome that dominates).
    shaping: verifier name -> weight on its score in [0, 1]; names without a weight add 0.
    shaping_cap: the most all shaping together may add (must stay below `success`).
    syntax_penalty: added per step whose action failed to parse (negative).
    syntax_penalty_cap: the most negative the syntax penalty may get.
    step_cap: cap of the process reward of one step (step_reward), below `success`.
    outcome_order: verdict names that decide success: all but the last together where they
        apply, else the last (see outcome_verdicts).
    """

    success: float = 1.0
    shaping: dict[str, float] = field(default_factory=_default_shaping)
    shaping_cap: float = 0.15
    syntax_penalty: float = -0.05
    syntax_penalty_cap: float = -0.1
    step_cap: float = 0.1
    outcome_order: tuple[str, ...] = OUTCOME_ORDER

    def __post_init__(self) -> None:
        if self.success <= 0:
            raise ValueError(f"RewardWeights.success must be positive, got {self.success}")
        if any(w < 0 for w in self.shaping.values()):
            raise ValueError(f"RewardWeights.shaping weights must be >= 0, got {self.shaping}")
        if self.syntax_penalty > 0 or self.syntax_penalty_cap > 0:
            raise ValueError("RewardWeights.syntax_penalty and syntax_penalty_cap must be <= 0")
        if self.shaping_cap - self.syntax_penalty_cap >= self.success:
            raise ValueError(
                f"shaping_cap ({self.shaping_cap}) minus syntax_penalty_cap ({self.syntax_penalty_cap}) must stay "
                f"below success ({self.success}) so that shaping can never outweigh success"
            )
        if not 0 <= self.step_cap < self.success:
            raise ValueError(f"RewardWeights.step_cap must be in [0, success), got {self.step_cap}")


class RewardResult(BaseModel):
    """reward: the composite scalar; success: the outcome passed; verdicts: every verdict used."""

    reward: float
    success: bool
    verdicts: list[Verdict] = Field(default_factory=list)


class Cascade:
    """Escalate from cheap to expensive verifiers only when the cheaper one is unsure.

    tiers: verifiers tried in order (rules first, then a reward model, then a judge); all
        implement the Verifier protocol.
    min_confidence: a verdict with passed set and confidence >= this is final.
    The returned verdict carries the first tier's name (so weights still apply) and
    details {"decided_by": tier name, "tiers": [{"name", "passed", "confidence"}, ...]}.
    """

    def __init__(self, tiers: Sequence[Any], min_confidence: float = 0.8) -> None:
        if not tiers:
            raise ValueError("Cascade needs at least one verifier tier")
        self.tiers = list(tiers)
        self.min_confidence = min_confidence
        self.name = self.tiers[0].name
        self.version = "+".join(f"{t.name}@{t.version}" for t in self.tiers)

    def _run(self, call) -> Verdict | None:
        trail: list[dict[str, Any]] = []
        last: Verdict | None = None
        for tier in self.tiers:
            v = call(tier)
            if v is None:
                continue
            last = v
            trail.append({"name": v.name, "passed": v.passed, "confidence": v.confidence})
            if v.passed is None and tier is self.tiers[0]:
                break  # the rules say the check does not apply: nothing to escalate
            if v.passed is not None and v.confidence >= self.min_confidence:
                break
        if last is None:
            return None
        details = dict(last.details)
        details.update(decided_by=last.name, tiers=trail)
        return last.model_copy(update={"name": self.name, "version": self.version, "details": details})

    def verify(self, episode: Episode) -> Verdict:
        out = self._run(lambda tier: tier.verify(episode))
        assert out is not None  # verify always returns a verdict
        return out

    def verify_step(self, task: Task, step: Step) -> Verdict | None:
        return self._run(lambda tier: verify_step(tier, task, step))


def _applies(v: Any, task: Task) -> bool:
    """Whether verifier `v` has something to check on `task` (cheap, from the gold alone)."""
    gold = task.gold
    name = v.name
    if name in ("arguments", "arguments_numeric"):
        # stateful tasks are judged by end state: their gold calls are one path among many
        return bool(gold.calls or gold.acceptable) and not is_stateful(task)
    if name == "final_answer":
        return gold.answer is not None
    if name == "which":
        return bool(task.tools)
    if name == "end_state":
        # a task with per-turn gold is judged turn by turn (multi_turn), as BFCL does
        return is_stateful(task) and not gold.turn_calls
    if name == "multi_turn":
        return bool(gold.turn_calls)
    if name == "tau2":
        return is_tau2_task(task)
    return True


def rule_verifiers(replay: Replay | None = None) -> list[Any]:
    """One instance of every rule-based verifier (the pool CompositeReward picks from)."""
    end_state = EndStateVerifier(replay)  # shared: tau2's DB check uses its replayed reference
    return [
        FormatVerifier(),
        WhichVerifier(),
        WhenVerifier(),
        ExecutionVerifier(),
        ArgumentsVerifier(),
        NumericArgumentsVerifier(),
        FinalAnswerVerifier(),
        end_state,
        Tau2Verifier(end_state),
        MultiTurnVerifier(),
        EfficiencyVerifier(),
        LengthVerifier(),
    ]


def default_verifiers(task: Task, replay: Replay | None = None, pool: Iterable[Any] | None = None) -> list[Any]:
    """The verifiers that apply to `task`, from `pool` (default: a fresh rule_verifiers(replay))."""
    return [v for v in (pool if pool is not None else rule_verifiers(replay)) if _applies(v, task)]


def _by_name(verdicts: Iterable[Verdict]) -> dict[str, Verdict]:
    return {v.name: v for v in verdicts}


def outcome_verdicts(verdicts: Iterable[Verdict], order: Sequence[str] = OUTCOME_ORDER) -> list[Verdict]:
    """The verdicts that decide success: every applicable one of all but the last of `order`
    (per-turn checks, end state, final answer and tau2's reward, all that apply), else the last
    (arguments: the outcome only when none of the others applies)."""
    named = _by_name(verdicts)
    applicable = [named[n] for n in order if n in named and named[n].passed is not None]
    primary = [v for v in applicable if v.name in order[:-1]]
    return primary or applicable[:1]


def outcome_verdict(verdicts: Iterable[Verdict], order: Sequence[str] = OUTCOME_ORDER) -> Verdict | None:
    """The first verdict that decides success (see outcome_verdicts), or None."""
    out = outcome_verdicts(verdicts, order)
    return out[0] if out else None


def is_success(verdicts: Sequence[Verdict], order: Sequence[str] = OUTCOME_ORDER) -> bool:
    """Every outcome verdict passed (with none, the episode still had to get "when" right) and "when" passed."""
    named = _by_name(verdicts)
    when = named.get("when")
    if when is not None and when.passed is False:
        return False
    outcome = outcome_verdicts(verdicts, order)
    if not outcome:
        return bool(when is not None and when.passed)
    return all(v.passed for v in outcome)


def axes(verdicts: Sequence[Verdict]) -> dict[str, bool | None]:
    """Per-axis evaluation: when (called iff needed), which (right tools), how (right arguments,
    else well-formed and executed), final (the outcome verdict). None where an axis does not apply."""
    named = _by_name(verdicts)

    def passed(name: str) -> bool | None:
        v = named.get(name)
        return None if v is None else v.passed

    how = passed("arguments")
    if how is None:
        parts = [p for p in (passed("format"), passed("execution")) if p is not None]
        how = all(parts) if parts else None
    outcome = outcome_verdict(verdicts)
    return {
        "when": passed("when"),
        "which": passed("which"),
        "how": how,
        "final": is_success(verdicts) if outcome is not None or "when" in named else None,
    }


class CompositeReward:
    """Weighted, capped sum of verdicts (module docstring gives the formula).

    weights: RewardWeights (defaults documented there).
    verifiers: a fixed list to run on every episode; default: the rule verifiers that apply
        to each task (default_verifiers). Model-based verifiers or a Cascade go here too.
    replay: (task, calls) -> state, for end-state checks of tasks that store no hash.
    """

    def __init__(
        self,
        weights: RewardWeights | None = None,
        verifiers: Sequence[Any] | None = None,
        replay: Replay | None = None,
    ) -> None:
        self.weights = weights or RewardWeights()
        self.fixed = list(verifiers) if verifiers is not None else None
        self.pool = rule_verifiers(replay)
        for v in self.fixed or []:
            if not isinstance(v, Verifier):
                raise TypeError(f"{v!r} does not implement the Verifier protocol (name, version, verify)")

    def verifiers_for(self, task: Task) -> list[Any]:
        return self.fixed if self.fixed is not None else default_verifiers(task, pool=self.pool)

    def versions(self) -> dict[str, str]:
        """Verifier name -> version, for run lineage."""
        return {v.name: v.version for v in (self.fixed or self.pool)}

    def combine(self, verdicts: list[Verdict], malformed_steps: int) -> RewardResult:
        """The reward from verdicts already computed (used by score and by rescoring)."""
        w = self.weights
        success = is_success(verdicts, w.outcome_order)
        shaping = sum(w.shaping.get(v.name, 0.0) * v.score for v in verdicts if v.passed is not None)
        shaping = min(w.shaping_cap, max(0.0, shaping))
        penalty = max(w.syntax_penalty_cap, w.syntax_penalty * malformed_steps)
        reward = w.success * float(success) + shaping + penalty
        return RewardResult(reward=reward, success=success, verdicts=verdicts)

    def score(self, episode: Episode) -> RewardResult:
        verdicts = [v.verify(episode) for v in self.verifiers_for(episode.task)]
        malformed = sum(1 for s in episode.steps if s.action.parse_error is not None)
        return self.combine(verdicts, malformed)

    def step_reward(self, task: Task, step: Step) -> tuple[float, list[Verdict]]:
        """Process reward of one step: capped shaping from step verdicts plus the syntax penalty.

        Always below the outcome reward: at most weights.step_cap. A malformed step earns no
        shaping, only the syntax penalty.
        """
        w = self.weights
        verdicts = [v for v in (verify_step(x, task, step) for x in self.verifiers_for(task)) if v is not None]
        if step.action.parse_error is not None:
            return w.syntax_penalty, verdicts
        shaping = sum(w.shaping.get(v.name, 0.0) * v.score for v in verdicts if v.passed is not None)
        return min(w.step_cap, max(0.0, shaping)), verdicts
