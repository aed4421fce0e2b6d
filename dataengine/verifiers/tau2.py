"""tau2-bench's reward, computed by us: DB check, communicate_info, action checks, nl_assertions.

As tau2's evaluator (tau2.evaluator, "all" mode) defines it, for the tasks that
dataengine.external.tau2.load_tasks makes:

- premature end: a truncated episode (step or user-turn cap) gets reward 0, as tau2 gives 0 to
  any simulation that did not end by an agent or user stop.
- DB: the database after the episode equals the database after replaying the gold actions on a
  fresh copy (refused gold actions skipped). A task whose gold lists no actions passes.
- COMMUNICATE: every communicate_info string, lower-cased, is a substring of some agent message
  to the user, lower-cased with its commas removed (tau2's rule, quirks included: an info string
  with a comma can never match). Agent messages: the task's assistant messages, the text of
  final turns and the prose before the tool calls of tool turns; unparsable turns never reach
  the user and do not count.
- ACTION: every gold action is matched by some call of the episode with the same name whose
  arguments agree on compare_args (tau2's Action.compare_with_tool_call: with compare_args
  unset, on the keys the call itself passes).
- NL_ASSERTION: judged by an LLM judge (one LLMJudge per assertion) only when a judge policy is
  given; off by default.

The reward is the product of the components named by the task's reward_basis (tau2's default
and that of every retail and airline task: DB and COMMUNICATE); the others are still computed
and reported in the verdict's details. Parity with tau2's own evaluator is checked by
dataengine.external.tau2.parity (`dataengine verify tau2`).
"""

from __future__ import annotations

from typing import Any

from dataengine.types import Episode, Task, ToolCall, Verdict
from dataengine.verifiers.base import not_applicable
from dataengine.verifiers.end_state import EndStateVerifier, end_state_hash

NAME = "tau2"
VERSION = "1"
DEFAULT_REWARD_BASIS = ("DB", "COMMUNICATE")
KNOWN_BASIS = ("DB", "COMMUNICATE", "ACTION", "NL_ASSERTION")

NL_RUBRIC = (
    "You grade a conversation between a customer-service agent and a customer. The task is solved "
    "when the agent satisfies this expected outcome: {assertion}"
)


def is_tau2_task(task: Task) -> bool:
    """A task made by dataengine.external.tau2.load_tasks."""
    return task.suite.startswith("tau2:") and "tau2_id" in task.metadata


def gold_actions(task: Task) -> list[dict[str, Any]] | None:
    """tau2's gold actions of `task` (action_id, name, arguments, compare_args); None when the
    task lists none. Tasks stored before the actions were kept fall back to gold.calls."""
    if "tau2_actions" in task.metadata:
        actions = task.metadata["tau2_actions"]
        return None if actions is None else list(actions)
    return [{"action_id": str(i), "name": c.name, "arguments": c.arguments, "compare_args": None}
            for i, c in enumerate(task.gold.calls)]


def agent_messages(episode: Episode) -> list[str]:
    """The texts the agent sent the user, in order (see the module docstring)."""
    texts = [m.content for m in episode.task.messages if m.role == "assistant" and m.content]
    for step in episode.steps:
        action = step.action
        if action.parse_error is not None:
            continue
        text = action.thought if action.tool_calls else action.text
        if text and text.strip():
            texts.append(text)
    return texts


def communicate_checks(texts: list[str], infos: list[str]) -> list[dict[str, Any]]:
    """One {info, met} per communicate_info string, by tau2's substring rule."""
    cleaned = [t.lower().replace(",", "") for t in texts]
    return [{"info": info, "met": any(info.lower() in t for t in cleaned)} for info in infos]


def action_matches(action: dict[str, Any], call: ToolCall) -> bool:
    """tau2's Action.compare_with_tool_call."""
    if action["name"] != call.name:
        return False
    keys = action.get("compare_args")
    keys = list(call.arguments) if keys is None else keys
    if not keys:
        return True
    return {k: v for k, v in call.arguments.items() if k in keys} == {
        k: v for k, v in action["arguments"].items() if k in keys
    }


def action_checks(calls: list[ToolCall], actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One {action_id, name, met} per gold action: some call of the episode matches it."""
    return [
        {"action_id": a["action_id"], "name": a["name"], "met": any(action_matches(a, c) for c in calls)}
        for a in actions
    ]


class Tau2Verifier:
    """tau2's reward of an episode of a tau2 task (module docstring gives the rules).

    end_state: the EndStateVerifier whose reference hash (gold replay) the DB check uses; share
        the composite's so the replay runs once per task.
    judge: a Policy; when given, nl_assertions are judged (LLMJudge, one per assertion) and
        reported; they join the reward when the task's reward_basis names NL_ASSERTION or
        nl_counts is set.
    Verdict details: reward_basis, components {DB, COMMUNICATE, ACTION, NL_ASSERTION: bool or
    None when not computed}, db {expected, got}, communicate [{info, met}], actions
    [{action_id, name, met}], nl_assertions [{assertion, met, score}], premature (bool).
    """

    name = NAME

    def __init__(self, end_state: EndStateVerifier | None = None, judge: Any = None, nl_counts: bool = False) -> None:
        self.end_state = end_state or EndStateVerifier()
        self.judge = judge
        self.nl_counts = nl_counts
        self.version = VERSION if judge is None else f"{VERSION}+judge:{judge.model_id}"

    def _db(self, episode: Episode, actions: list[dict[str, Any]] | None) -> tuple[bool, dict[str, Any]]:
        if actions is None:
            return True, {"note": "the task lists no gold actions"}
        expected = self.end_state.expected(episode.task)
        state = episode.final_state
        if not isinstance(state, dict) or not isinstance(state.get("db"), dict):
            return False, {"expected": expected, "got": None, "note": "the final state holds no database"}
        got = end_state_hash(episode.task, state)
        return got == expected, {"expected": expected, "got": got}

    def _nl(self, episode: Episode) -> tuple[bool | None, list[dict[str, Any]], float]:
        from dataengine.verifiers.model_based import LLMJudge

        assertions = list(episode.task.metadata.get("nl_assertions") or [])
        if self.judge is None:
            return None, [], 1.0
        checks, confidence = [], 1.0
        for assertion in assertions:
            v = LLMJudge(self.judge, rubric=NL_RUBRIC.format(assertion=assertion), name="tau2_nl").verify(episode)
            checks.append({"assertion": assertion, "met": v.passed, "score": v.score})
            confidence = min(confidence, v.confidence)
        return all(c["met"] is True for c in checks), checks, confidence

    def verify(self, episode: Episode) -> Verdict:
        task = episode.task
        if not is_tau2_task(task):
            return not_applicable(self.name, self.version, "not a tau2 task")
        basis = list(task.metadata.get("reward_basis") or DEFAULT_REWARD_BASIS)
        unknown = [b for b in basis if b not in KNOWN_BASIS]
        if unknown:
            return not_applicable(self.name, self.version, f"reward_basis {unknown} is not supported (known: {list(KNOWN_BASIS)})")
        if "NL_ASSERTION" in basis and self.judge is None:
            # tau2 refuses this too ("NL assertions are part of the reward basis, but they are not being evaluated")
            return not_applicable(self.name, self.version, "the task's reward_basis names NL_ASSERTION but no judge is configured")
        actions = gold_actions(task)
        db_ok, db = self._db(episode, actions)
        communicate = communicate_checks(agent_messages(episode), list(task.metadata.get("communicate_info") or []))
        acts = action_checks(episode.calls, actions or [])
        nl_ok, nl, confidence = self._nl(episode)
        components = {
            "DB": db_ok,
            "COMMUNICATE": all(c["met"] for c in communicate),
            "ACTION": all(c["met"] for c in acts),
            "NL_ASSERTION": nl_ok,
        }
        counted = list(basis)
        if self.nl_counts and self.judge is not None and "NL_ASSERTION" not in counted:
            counted.append("NL_ASSERTION")
        premature = episode.truncated
        passed = not premature and all(components[b] for b in counted)
        uses_judge = "NL_ASSERTION" in counted
        return Verdict(
            name=self.name,
            version=self.version,
            score=1.0 if passed else 0.0,
            passed=passed,
            confidence=confidence if uses_judge else 1.0,
            details={
                "reward_basis": basis,
                "counted": counted,
                "components": components,
                "db": db,
                "communicate": communicate,
                "actions": acts,
                "nl_assertions": nl,
                "premature": premature,
            },
        )
