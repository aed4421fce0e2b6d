"""Efficiency and length: extra steps, repeated identical calls, overlong replies."""

from __future__ import annotations

from dataengine.types import Episode, Step, Task, Verdict
from dataengine.verifiers.base import not_applicable, verdict


def reference_steps(task: Task) -> int:
    """Steps a good episode needs: metadata["reference_steps"], else one per gold call plus the answer."""
    ref = task.metadata.get("reference_steps")
    if ref is not None:
        return int(ref)
    return len(task.gold.calls) + 1


def repeated_calls(episode: Episode) -> int:
    """Calls identical (name and arguments) to one in the step just before: the looping failure.

    Repeats further apart are not counted: re-reading after a write, or going back and forth
    between folders, is legitimate in stateful suites.
    """
    repeats = 0
    previous: set[str] = set()
    for step in episode.steps:
        keys = [c.key() for c in step.action.tool_calls]
        repeats += sum(1 for k in keys if k in previous)
        previous = set(keys)
    return repeats


def wasted_steps(episode: Episode, slack: int = 0) -> tuple[int, int]:
    """(extra, repeats): steps beyond the reference plus `slack`, and calls repeated from the
    step just before. Their sum is what EfficiencyVerifier and the search's objective
    "efficient_success" count as waste."""
    extra = max(0, len(episode.steps) - reference_steps(episode.task) - slack)
    return extra, repeated_calls(episode)


def efficiency_score(episode: Episode, slack: int = 0) -> float:
    """1 / (1 + extra + repeats) (`wasted_steps`): 1 for an episode no longer than it needs."""
    return 1.0 / (1.0 + sum(wasted_steps(episode, slack)))


class EfficiencyVerifier:
    """Penalise steps beyond the reference and calls repeated from the step just before.

    slack: extra steps allowed before the verdict fails. Score = 1 / (1 + extra + repeats),
    where extra = max(0, steps - reference - slack).
    details: steps, reference, extra, repeats.
    """

    name = "efficiency"
    version = "1"

    def __init__(self, slack: int = 1) -> None:
        self.slack = slack

    def verify(self, episode: Episode) -> Verdict:
        if not episode.steps:
            return not_applicable(self.name, self.version, "episode has no steps")
        ref = reference_steps(episode.task)
        extra, repeats = wasted_steps(episode, self.slack)
        bad = extra + repeats
        return verdict(
            self.name, self.version, bad == 0, 1.0 / (1.0 + bad), steps=len(episode.steps), reference=ref, extra=extra, repeats=repeats
        )


class LengthVerifier:
    """Every assistant reply is at most `max_chars` characters long.

    Score: fraction of replies within the limit. details: overlong (step indices), longest.
    """

    name = "length"
    version = "1"

    def __init__(self, max_chars: int = 2000) -> None:
        self.max_chars = max_chars

    def verify_step(self, task: Task, step: Step) -> Verdict:
        n = len(step.action.text)
        return verdict(self.name, self.version, n <= self.max_chars, longest=n)

    def verify(self, episode: Episode) -> Verdict:
        if not episode.steps:
            return not_applicable(self.name, self.version, "episode has no steps")
        lengths = [len(s.action.text) for s in episode.steps]
        overlong = [i for i, n in enumerate(lengths) if n > self.max_chars]
        score = 1.0 - len(overlong) / len(lengths)
        return verdict(self.name, self.version, not overlong, score, overlong=overlong, longest=max(lengths))
