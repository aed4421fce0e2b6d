"""The Verifier protocol and the small pieces every verifier shares.

A verifier reads an Episode (or one Step of it) and returns a Verdict. Rule-based verifiers
here are pure functions of their input: no I/O, no randomness, so the same episode always
gets the same verdict.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from dataengine.types import Episode, Step, Task, Verdict


@runtime_checkable
class Verifier(Protocol):
    """What the composite reward and the cascade call.

    name: the key a verdict is filed under (and weighted by in CompositeReward).
    version: bumped whenever the verdict for the same input may change.
    verify(episode): the verdict for the whole trajectory.
    verify_step(task, step): optional process verdict for one step, or None when the
        verifier has nothing to say about single steps.
    """

    name: str
    version: str

    def verify(self, episode: Episode) -> Verdict: ...


def verdict(
    name: str,
    version: str,
    passed: bool | None,
    score: float | None = None,
    confidence: float = 1.0,
    **details: Any,
) -> Verdict:
    """A Verdict whose score defaults to 1.0/0.0 from `passed` (0.0 when not applicable)."""
    if score is None:
        score = 1.0 if passed else 0.0
    return Verdict(
        name=name, version=version, score=float(score), passed=passed, confidence=confidence, details=details
    )


def not_applicable(name: str, version: str, reason: str) -> Verdict:
    """The verdict of a verifier that has nothing to check on this input (passed=None)."""
    return Verdict(name=name, version=version, score=0.0, passed=None, confidence=1.0, details={"reason": reason})


def verify_step(verifier: Any, task: Task, step: Step) -> Verdict | None:
    """Call `verifier.verify_step` when it has one; None otherwise."""
    fn = getattr(verifier, "verify_step", None)
    return fn(task, step) if fn is not None else None


def tool_names(task: Task) -> set[str]:
    """Names of the tools the task shows to the model."""
    return {t.name for t in task.tools}


def is_stateful(task: Task) -> bool:
    """The task is judged by its tool state (many call sequences can be right)."""
    return bool(
        task.gold.end_state_hash is not None
        or task.initial_state is not None
        or task.metadata.get("stateful")
        or task.metadata.get("state_view_key")
    )
