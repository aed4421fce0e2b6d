"""Verdicts per second of the rule-based verifier cascade on 10,000 episodes.

Episodes: the gold and perturbed episodes of the calibration set (built-in suites; BFCL too
with --external), cycled to --episodes. Both runs score the same episodes with the same
verifiers through CompositeReward; the baseline differs in one thing only: the format check
validates each call with `jsonschema.validate` (schema checked and validator built on every
call), the engine's FormatVerifier uses validators compiled once per schema.

    .venv/bin/python benchmarks/bench_verifiers.py            # 10,000 episodes
    .venv/bin/python benchmarks/bench_verifiers.py --quick    # 500 episodes
"""

from __future__ import annotations

import argparse
import itertools
import time

import jsonschema

from dataengine.types import Step, Task, Verdict
from dataengine.verifiers import (
    Cascade,
    CompositeReward,
    FinalAnswerVerifier,
    FormatVerifier,
    rule_verifiers,
)
from dataengine.verifiers.report import calibration_set


class UncompiledFormatVerifier(FormatVerifier):
    """FormatVerifier with `jsonschema.validate` per call: the naive way, as the baseline."""

    def _step_errors(self, task: Task, step: Step) -> list[str]:
        action = step.action
        if action.parse_error is not None:
            return [f"parse error: {action.parse_error}"]
        specs = {t.name: t.parameters for t in task.tools}
        errors = []
        for call in action.tool_calls:
            params = specs.get(call.name)
            if params is None:
                continue
            try:
                jsonschema.validate(call.arguments, params)
            except jsonschema.ValidationError as exc:
                errors.append(f"{call.name}: {exc.message}")
        return errors


class StrictAnswer:
    """Second tier of the answer cascade: exact match only (a rule stand-in for a judge)."""

    name, version = "final_answer_exact", "1"

    def verify(self, episode) -> Verdict:
        inner = FinalAnswerVerifier().verify(episode)
        passed = inner.passed if inner.passed is None else inner.details.get("match") in ("exact", "numeric")
        return inner.model_copy(update={"name": self.name, "passed": passed, "confidence": 1.0})


def pipeline(format_verifier: FormatVerifier) -> CompositeReward:
    pool = [format_verifier if v.name == "format" else v for v in rule_verifiers()]
    pool = [Cascade([v, StrictAnswer()], min_confidence=0.8) if v.name == "final_answer" else v for v in pool]
    reward = CompositeReward()
    reward.pool = pool  # the same selection per task (default_verifiers) over this pool
    return reward


def run(reward: CompositeReward, episodes: list) -> tuple[float, int, list[float]]:
    start = time.perf_counter()
    verdicts = 0
    rewards = []
    for ep in episodes:
        result = reward.score(ep)
        verdicts += len(result.verdicts)
        rewards.append(result.reward)
    return time.perf_counter() - start, verdicts, rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="500 episodes")
    parser.add_argument("--external", action="store_true", help="include BFCL episodes (needs bfcl-eval)")
    args = parser.parse_args()
    n = 500 if args.quick else args.episodes
    base = [ex.episode for ex in calibration_set(per_suite=10, external=args.external, tau2_tasks=0)]
    episodes = list(itertools.islice(itertools.cycle(base), n))
    engine = pipeline(FormatVerifier())
    naive = pipeline(UncompiledFormatVerifier())
    run(engine, episodes[:50])  # warm the compiled-validator cache and imports alike for both
    run(naive, episodes[:50])
    t_naive, v_naive, r_naive = run(naive, episodes)
    t_engine, v_engine, r_engine = run(engine, episodes)
    assert r_naive == r_engine, "baseline and engine disagree on rewards"
    print(f"episodes: {n} ({len(base)} distinct gold/perturbed episodes cycled)")
    print(f"baseline (jsonschema.validate per call): {v_naive / t_naive:10.0f} verdicts/s  {n / t_naive:8.0f} episodes/s")
    print(f"engine   (compiled validators)         : {v_engine / t_engine:10.0f} verdicts/s  {n / t_engine:8.0f} episodes/s")
    print(f"speed-up: {t_naive / t_engine:.2f}x")


if __name__ == "__main__":
    main()
