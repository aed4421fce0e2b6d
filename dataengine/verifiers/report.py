"""Calibration report: every rule verifier on a labelled set of gold and perturbed episodes.

Labelled set: for tasks of the built-in suites (and, when installed, BFCL and tau2-bench), the
gold episode and variants that break one thing on purpose. Each variant carries the verdicts
it must get (labels) for the verifiers it targets, e.g. a dropped required argument must fail
"format" and "arguments"; a wrong final answer must fail "final_answer" and "success".

Episodes are executed in this process with the tasks' own toolboxes (no sandbox): verifiers
are pure functions of the episode, so where the calls ran does not change a verdict.

Per verifier: n (labelled and applicable), agreement (verdict == label), precision and recall
of its "pass" (precision: share of passes that are right; a low one means the verifier lets
bad episodes through, which is what reward hacking exploits), and n_missing (labelled but the
verifier said "not applicable").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataengine.types import Action, Episode, Step, Task, ToolCall, ToolResult
from dataengine.verifiers.base import is_stateful
from dataengine.verifiers.composite import CompositeReward
from dataengine.verifiers.end_state import end_state_hash, replay_in_process
from dataengine.verifiers.multi_turn import TURN_REPLY
from dataengine.verifiers.perturb import perturb_calls
from dataengine.verifiers.schema import schema_errors

# What each call perturbation must do to the verdicts (beyond what is checked per task).
CALL_LABELS: dict[str, dict[str, bool]] = {
    "wrong_name": {"which": False, "arguments": False},
    "extra_parameter": {"arguments": False},
    "drop_required": {"format": False, "arguments": False},
    "wrong_type": {"format": False, "arguments": False},
    "changed_value": {"arguments": False},
    "extra_call": {"arguments": False},
    "reordered": {"arguments": True},
}


@dataclass
class Labelled:
    """One labelled episode: where it came from, what was changed, and the verdicts it must get."""

    source: str
    kind: str
    episode: Episode
    labels: dict[str, bool] = field(default_factory=dict)


def _copy(state: Any) -> Any:
    return None if state is None else json.loads(json.dumps(state))


def execute(task: Task, actions: list[Action]) -> Episode:
    """Run `actions` in order against the task's toolbox in this process; the resulting Episode.

    Each call gets a ToolResult like the sandbox gives: unknown_tool, bad_arguments (schema),
    exception (the state is left as before the call), or ok. As in ToolEnv, a final answer
    starts the task's next user turn while its schedule has one.
    """
    from dataengine.tools.registry import get_toolbox

    toolbox = get_toolbox(task.toolbox)
    state = _copy(toolbox.initial_state(task))
    steps = []
    turn, turn_states, episode_task = 0, [], task
    for action in actions:
        results = []
        for call in action.tool_calls if action.parse_error is None else []:
            tool = toolbox.tools.get(call.name)
            if tool is None:
                results.append(ToolResult(call=call, status="unknown_tool", error=f"unknown tool {call.name!r}"))
                continue
            problems = schema_errors(tool.spec.parameters, call)
            if problems:
                results.append(ToolResult(call=call, status="bad_arguments", error="; ".join(problems)))
                continue
            trial = _copy(state) if tool.stateful else None
            try:
                output = tool.fn(trial, **call.arguments) if tool.stateful else tool.fn(**call.arguments)
            except Exception as exc:  # noqa: BLE001 - a failing tool is an observation, as in the sandbox
                results.append(ToolResult(call=call, status="exception", error=f"{type(exc).__name__}: {exc}"))
                continue
            if tool.stateful:
                state = trial
            results.append(ToolResult(call=call, status="ok", output=json.loads(json.dumps(output, default=str))))
        observations = []
        if action.is_final and turn < len(task.user_turns):
            nxt = task.user_turns[turn]
            observations = list(nxt.messages)
            if nxt.tools:
                episode_task = episode_task.offering(nxt.tools, turn)
            turn_states.append(state)
        steps.append(Step(action=action, results=results, observations=observations, turn=turn))
        turn += bool(observations)
    done = bool(actions) and actions[-1].is_final and turn == len(task.user_turns)
    return Episode(task=episode_task, steps=steps, final_state=state, done=done, turn_states=turn_states)


def _final_text(task: Task) -> str:
    return str(task.gold.answer if task.gold.answer is not None else task.metadata.get("gold_reply", "Done."))


def _call_actions(calls: list[ToolCall], parallel: bool = False) -> list[Action]:
    """One action per call, or (parallel) one action with all of them, as BFCL AST tasks expect."""
    if parallel and calls:
        return [Action(text=json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls]), tool_calls=list(calls))]
    return [Action(text=json.dumps({"name": c.name, "arguments": c.arguments}), tool_calls=[c]) for c in calls]


def _answer(text: str) -> Action:
    return Action(text=text, final_answer=text)


def _by_turn(calls_by_turn: list[list[ToolCall]], final: Action, parallel: bool = False) -> list[Action]:
    """Each user turn's calls, closed by "Done." (which starts the next turn), the last by `final`."""
    out: list[Action] = []
    for t, calls in enumerate(calls_by_turn):
        out += _call_actions(calls, parallel)
        out.append(final if t == len(calls_by_turn) - 1 else _answer(TURN_REPLY))
    return out


def _actions(task: Task, calls: list[ToolCall], final: Action, parallel: bool = False) -> list[Action]:
    """`calls` in the first user turn, then `final`; the later turns of a multi-turn task are closed at once."""
    return _by_turn([calls] + [[] for _ in task.user_turns], final, parallel)




def _wrong_answer(gold: str) -> str:
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*", gold)
    if m:
        # far outside any suite's tolerance (units accepts 0.1% relative error)
        value = float(m.group(1))
        return str(int(value) * 2 + 7) if value.is_integer() else str(round(value * 1.5 + 7.25, 4))
    return "I am not sure, maybe qwzx."


def _drop_effective_write(task: Task) -> list[list[ToolCall]] | None:
    """The gold calls of each user turn minus the last call whose removal changes the end state
    (None if none does)."""
    turns = [list(t) for t in task.gold.turn_calls] or [list(task.gold.calls)]
    where = [(t, i) for t, turn in enumerate(turns) for i in range(len(turn))]
    reference = end_state_hash(task, replay_in_process(task, list(task.gold.calls)))
    for t, i in reversed(where):
        rest = [turn[:i] + turn[i + 1 :] if u == t else turn for u, turn in enumerate(turns)]
        if end_state_hash(task, replay_in_process(task, [c for turn in rest for c in turn])) != reference:
            return rest
    return None


def labelled_episodes(task: Task, source: str) -> list[Labelled]:
    """The gold episode of `task` and its perturbed variants, with labels."""
    gold = task.gold
    calls = list(gold.calls)
    final = _answer(_final_text(task))
    out: list[Labelled] = []
    arguments_decide = gold.answer is None and not is_stateful(task)
    parallel = arguments_decide  # single-turn call tasks (BFCL AST) get all calls in one turn
    if gold.needs_tool and not calls:
        return out  # any call would do (BFCL relevance): no single gold episode to perturb
    gold_labels = {"format": True, "when": True, "success": True, "length": True, "efficiency": True}
    if calls:
        gold_labels.update(which=True, execution=True)
        if not is_stateful(task):
            gold_labels["arguments"] = True
    if gold.answer is not None:
        gold_labels["final_answer"] = True
    if is_stateful(task):
        gold_labels["end_state"] = True
    if task.gold.turn_calls:
        gold_labels.pop("end_state", None)  # judged turn by turn instead
        gold_labels["multi_turn"] = True
    gold_actions = _by_turn(gold.turn_calls or [calls], final, parallel)
    out.append(Labelled(source, "gold", execute(task, gold_actions), gold_labels))

    for p in perturb_calls(calls, task.tools, gold.acceptable or None):
        labels = dict(CALL_LABELS[p.kind])
        if is_stateful(task):
            # judged by end state: the call list is one path among many, so only a call to a
            # tool that does not exist is a wrong "which"
            labels.pop("arguments", None)
            if p.kind == "wrong_name" and p.calls[0].name in {t.name for t in task.tools}:
                labels.pop("which", None)
        if arguments_decide:
            labels["success"] = labels["arguments"]
        out.append(Labelled(source, p.kind, execute(task, _actions(task, p.calls, final, parallel)), labels))
    if gold.answer is not None:
        wrong = _answer(_wrong_answer(gold.answer))
        out.append(Labelled(source, "wrong_answer", execute(task, _by_turn(gold.turn_calls or [calls], wrong)), {"final_answer": False, "success": False}))
    if gold.needs_tool:
        out.append(Labelled(source, "no_call", execute(task, _actions(task, [], final)), {"when": False, "success": False}))
    elif task.tools:
        spec = task.tools[0]
        needless = ToolCall(name=spec.name, arguments={})
        out.append(Labelled(source, "needless_call", execute(task, _actions(task, [needless], final)), {"when": False, "success": False}))
    if is_stateful(task) and calls:
        rest = _drop_effective_write(task)
        if rest is not None:
            labels = {"multi_turn": False, "success": False} if gold.turn_calls else {"end_state": False, "success": False}
            out.append(Labelled(source, "drop_write", execute(task, _by_turn(rest, final)), labels))
    broken = Action(text='<tool_call>{"name": ', parse_error="unterminated JSON in <tool_call>")
    out.append(Labelled(source, "parse_error", execute(task, [broken, *_by_turn(gold.turn_calls or [calls], final)]), {"format": False, "success": True}))
    padded = _answer(_final_text(task) + " " + "and so on " * 300)
    out.append(Labelled(source, "overlong", execute(task, _by_turn(gold.turn_calls or [calls], padded)), {"length": False}))
    if calls:
        loop = [*_call_actions(calls[:1]) * 3, *_actions(task, calls[1:], final)]
        out.append(Labelled(source, "loop", execute(task, loop), {"efficiency": False}))
    return out


def builtin_tasks(per_suite: int, seed: int = 0) -> list[Task]:
    """`per_suite` held-out tasks of every built-in suite."""
    from dataengine.suites import generate_suite, list_suites

    return [t for name in list_suites() for t in generate_suite(name, 0, per_suite, seed=seed)]


def external_tasks(per_category: int, tau2_tasks: int = 1) -> list[Task]:
    """BFCL tasks (AST, irrelevance, multi-turn) and tau2 tasks, for whichever package is installed."""
    from dataengine.external import MissingPackageError

    tasks: list[Task] = []
    try:
        from dataengine.external import bfcl

        for category in ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "irrelevance", "multi_turn_base"):
            picked = [t for t in bfcl.load_tasks(category) if "bfcl_gold_unsatisfiable" not in t.metadata]
            tasks.extend(picked[:per_category])
    except MissingPackageError:
        pass
    if tau2_tasks > 0:
        try:
            from dataengine.external import tau2

            for domain in tau2.DOMAINS:
                tasks.extend(tau2.load_tasks(domain, limit=tau2_tasks))
        except MissingPackageError:
            pass
    return tasks


@dataclass
class VerifierStats:
    """Counts of one verifier against the labels."""

    name: str
    n: int = 0
    agree: int = 0
    true_pass: int = 0
    false_pass: int = 0
    false_fail: int = 0
    missing: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=dict)

    def add(self, kind: str, predicted: bool | None, label: bool) -> None:
        if predicted is None:
            self.missing += 1
            return
        self.n += 1
        ok = predicted == label
        self.agree += ok
        self.true_pass += predicted and label
        self.false_pass += predicted and not label
        self.false_fail += (not predicted) and label
        cell = self.by_kind.setdefault(kind, [0, 0])
        cell[0] += ok
        cell[1] += 1

    def row(self) -> dict[str, Any]:
        passes = self.true_pass + self.false_pass
        goods = self.true_pass + self.false_fail
        return {
            "verifier": self.name,
            "n": self.n,
            "agreement": self.agree / self.n if self.n else None,
            "precision": self.true_pass / passes if passes else None,
            "recall": self.true_pass / goods if goods else None,
            "n_missing": self.missing,
            "disagreements": {k: v[1] - v[0] for k, v in sorted(self.by_kind.items()) if v[0] != v[1]},
        }


def calibrate(
    examples: Iterable[Labelled],
    reward: CompositeReward | None = None,
    judges: Sequence[Any] = (),
    judge_limit: int = 40,
) -> list[dict[str, Any]]:
    """Run every verifier (and the composite success) on labelled episodes; one row per verifier.

    judges: extra verifiers (an LLM judge, a reward model) whose verdict is compared with the
        "success" label; they run on at most `judge_limit` examples, evenly spaced over the
        labelled ones, because each costs a model forward pass.
    """
    examples = list(examples)
    reward = reward or CompositeReward()
    stats: dict[str, VerifierStats] = {}
    for ex in examples:
        result = reward.score(ex.episode)
        verdicts = {v.name: v.passed for v in result.verdicts}
        verdicts["success"] = result.success
        for name, label in ex.labels.items():
            stats.setdefault(name, VerifierStats(name)).add(f"{ex.source}:{ex.kind}", verdicts.get(name), label)
    graded = [ex for ex in examples if "success" in ex.labels]
    if judges and graded:
        step = max(1, len(graded) // max(1, judge_limit))
        for ex in graded[::step][:judge_limit]:
            for judge in judges:
                v = judge.verify(ex.episode)
                stats.setdefault(judge.name, VerifierStats(judge.name)).add(f"{ex.source}:{ex.kind}", v.passed, ex.labels["success"])
    return [stats[k].row() for k in sorted(stats)]


def calibration_set(per_suite: int = 10, external: bool = True, tau2_tasks: int = 1, seed: int = 0) -> list[Labelled]:
    """The labelled set: built-in suites, plus BFCL and tau2 when `external` and installed."""
    tasks = builtin_tasks(per_suite, seed)
    if external:
        tasks += external_tasks(per_suite, tau2_tasks)
    return [ex for task in tasks for ex in labelled_episodes(task, task.suite)]
