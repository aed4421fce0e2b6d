"""Parity of our tau2 reward (dataengine.verifiers.tau2) with the installed tau2 package's evaluator.

For every task: the gold trajectory (gold calls, one per turn, then a reply that tells every
communicate_info item) and deterministic perturbations of it:

- drop_write: the last gold write that succeeds is left out;
- wrong_arg: that write's last argument is changed (a string gets "X" appended, a number +1,
  a list loses its last element);
- missing_info: the final reply leaves out the first communicate_info item (tasks that have one);
- extra_write: one more successful write before the reply (retail: modify_user_address, airline:
  send_certificate, for the task's user);
- repeat_write: the last gold write that succeeds issued once more before the reply (tau2
  mostly refuses it, or it changes nothing: the reward can stay 1).

Each trajectory runs in this process on our tools (an Episode, scored by Tau2Verifier) and is
converted to tau2 messages (tool responses from tau2's own Environment) that tau2's
EnvironmentEvaluator, CommunicateEvaluator and ActionEvaluator score, combined over the task's
reward_basis as tau2's evaluate_simulation does. evaluate_simulation itself is not called: it
imports litellm (for its nl_assertions judge), which the `external` extra does not install; no
task's reward basis names NL_ASSERTION, so the non-LLM components are the whole reward.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

from dataengine.external import tau2 as ours
from dataengine.types import Action, Episode, Step, Task, ToolCall, ToolResult
from dataengine.verifiers.end_state import EndStateVerifier
from dataengine.verifiers.tau2 import Tau2Verifier

KINDS = ("gold", "drop_write", "wrong_arg", "missing_info", "extra_write", "repeat_write")
EXTRA_ADDRESS = {"address1": "1 Extra St", "address2": "", "city": "Springfield", "state": "IL", "country": "USA", "zip": "62701"}


# ------------------------------------------------------------------ trajectories


def _call_action(call: ToolCall) -> Action:
    return Action(text=json.dumps({"name": call.name, "arguments": call.arguments}), tool_calls=[call])


def _reply(text: str) -> Action:
    return Action(text=text, final_answer=text)


def _mutate(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "X"
    if isinstance(value, list):
        return value[:-1] if len(value) > 1 else [_mutate(v) for v in value]
    if isinstance(value, dict) and value:
        key = next(iter(value))
        return {**value, key: _mutate(value[key])}
    return "X"


def _task_user(task: Task, domain: str) -> str | None:
    """The user the task is about: a gold call's user_id, else the owner of a gold call's order
    or reservation."""
    db = None
    for call in task.gold.calls:
        if isinstance(call.arguments.get("user_id"), str):
            return call.arguments["user_id"]
    for call in task.gold.calls:
        for key, table in (("order_id", "orders"), ("reservation_id", "reservations")):
            ref = call.arguments.get(key)
            if isinstance(ref, str):
                db = db or ours.initial_db(domain)
                row = db.get(table, {}).get(ref)
                if row and isinstance(row.get("user_id"), str):
                    return row["user_id"]
    return None


def _extra_write(task: Task, domain: str) -> ToolCall | None:
    user = _task_user(task, domain)
    if user is None:
        return None
    if domain == "retail":
        return ToolCall(name="modify_user_address", arguments={"user_id": user, **EXTRA_ADDRESS})
    return ToolCall(name="send_certificate", arguments={"user_id": user, "amount": 100})


def gold_turns(task: Task) -> list[Action]:
    """The gold trajectory: one gold call per turn, then the reply that tells every communicate_info item."""
    infos = list(task.metadata.get("communicate_info") or [])
    return [*map(_call_action, task.gold.calls), _reply(ours.gold_reply(infos))]


def _successful_writes(gold: Episode) -> list[int]:
    """Indices of the gold calls that are writes and succeeded in the gold episode."""
    types = ours.tool_types(gold.task.metadata["domain"])
    return [
        i for i, step in enumerate(gold.steps)
        if step.results and step.results[0].ok and types.get(step.results[0].call.name) == "write"
    ]


def perturbations(task: Task, gold: Episode) -> list[tuple[str, list[Action]]]:
    """(kind, assistant turns) of the perturbations of the gold trajectory that apply to `task`;
    gold: the gold trajectory's episode (run(task, gold_turns(task)))."""
    domain = task.metadata["domain"]
    calls = list(task.gold.calls)
    infos = list(task.metadata.get("communicate_info") or [])
    reply = _reply(ours.gold_reply(infos))
    out = []
    writes = _successful_writes(gold)
    if writes:
        last = writes[-1]
        out.append(("drop_write", [*map(_call_action, calls[:last] + calls[last + 1 :]), reply]))
        call = calls[last]
        if call.arguments:
            key = list(call.arguments)[-1]
            wrong = ToolCall(name=call.name, arguments={**call.arguments, key: _mutate(call.arguments[key])})
            out.append(("wrong_arg", [*map(_call_action, calls[:last] + [wrong] + calls[last + 1 :]), reply]))
        out.append(("repeat_write", [*map(_call_action, [*calls, calls[last]]), reply]))
    if infos:
        out.append(("missing_info", [*map(_call_action, calls), _reply(ours.gold_reply(infos[1:]))]))
    extra = _extra_write(task, domain)
    if extra is not None:
        out.append(("extra_write", [*map(_call_action, [*calls, extra]), reply]))
    return out


def run(task: Task, actions: list[Action]) -> Episode:
    """Run `actions` on our tools in this process (tau2's tools leave the state as it was when
    they raise, so no copy per call); the Episode, done when the last action is a reply."""
    domain = task.metadata["domain"]
    state = ours.initial_state(domain)
    steps = []
    for action in actions:
        results = []
        for call in action.tool_calls:
            try:
                output = ours.call_tool(domain, call.name, state, **call.arguments)
                results.append(ToolResult(call=call, status="ok", output=output))
            except Exception as exc:  # noqa: BLE001 - a refused call is an observation
                results.append(ToolResult(call=call, status="exception", error=f"{type(exc).__name__}: {exc}"))
        steps.append(Step(action=action, results=results))
    return Episode(task=task, steps=steps, final_state=state, done=bool(actions) and actions[-1].is_final)


# ------------------------------------------------------------------ tau2's side


@functools.cache
def _tau2_tasks(domain: str) -> dict[str, Any]:
    ours.domain_classes(domain)  # checks the package and quiets its logger
    if domain == "retail":
        from tau2.domains.retail.environment import get_tasks
    else:
        from tau2.domains.airline.environment import get_tasks
    return {t.id: t for t in get_tasks(None)}


@functools.cache
def _environment(domain: str):
    """tau2's get_environment for the domain, handed a fresh copy of its database each call
    (db.json read and validated once by tau2's own DB.load, then copied from its JSON dump)."""
    if domain == "retail":
        from tau2.domains.retail.environment import get_environment
        from tau2.domains.retail.utils import RETAIL_DB_PATH as path
    else:
        from tau2.domains.airline.environment import get_environment
        from tau2.domains.airline.utils import AIRLINE_DB_PATH as path
    db_cls, _ = ours.domain_classes(domain)
    dump = db_cls.load(path).model_dump_json()

    def make(solo_mode: bool = False):
        return get_environment(db=db_cls.model_validate_json(dump), solo_mode=solo_mode)

    return make


def tau2_messages(episode: Episode) -> tuple[list[Any], int]:
    """The episode as tau2 messages, and how many of our tool results differ from tau2's.

    Assistant turns become AssistantMessages (content: the reply, or the prose before the tool
    calls), tool results ToolMessages holding what tau2's own Environment answers to the same
    calls; unparsable turns are left out (they never reach the user).
    """
    from tau2.data_model.message import AssistantMessage, UserMessage
    from tau2.data_model.message import ToolCall as Tau2Call

    domain = episode.task.metadata["domain"]
    env = _environment(domain)()
    messages: list[Any] = []
    for m in episode.task.messages:
        if m.role == "assistant" and m.content:
            messages.append(AssistantMessage(role="assistant", content=m.content))
        elif m.role == "user" and m.content:
            messages.append(UserMessage(role="user", content=m.content))
    mismatches = 0
    for i, step in enumerate(episode.steps):
        action = step.action
        if action.parse_error is not None:
            continue
        if not action.tool_calls:
            messages.append(AssistantMessage(role="assistant", content=action.text))
            continue
        calls = [Tau2Call(id=f"call_{i}_{k}", name=c.name, arguments=c.arguments) for k, c in enumerate(action.tool_calls)]
        messages.append(AssistantMessage(role="assistant", content=action.thought, tool_calls=calls))
        for call, result in zip(calls, step.results):
            response = env.get_response(call)
            messages.append(response)
            if response.error == result.ok or (result.ok and _as_tau2_sees(result.output) != _content(response.content)):
                mismatches += 1
        for m in step.observations:
            if m.role == "user" and m.content:
                messages.append(UserMessage(role="user", content=m.content))
    return messages, mismatches


def _as_tau2_sees(output: Any) -> Any:
    """Our tool output read back as tau2 reads a tool message (it sends a string output as is,
    so a numeric string such as calculate's "8276.23" reads back as a number)."""
    return _content(output) if isinstance(output, str) else json.loads(json.dumps(output))


def _content(text: str | None) -> Any:
    try:
        return json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return text


def tau2_reward(episode: Episode, messages: list[Any]) -> dict[str, Any]:
    """tau2's evaluators on `messages`: {reward, components {DB, COMMUNICATE, ACTION},
    communicate [met per info], actions [met per gold action]}. A truncated episode gets 0, as
    tau2 gives any simulation that did not end by an agent or user stop."""
    from tau2.evaluator.evaluator_action import ActionEvaluator
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    task = episode.task
    domain = task.metadata["domain"]
    t2 = _tau2_tasks(domain)[task.metadata["tau2_id"]]
    env = EnvironmentEvaluator.calculate_reward(environment_constructor=_environment(domain), task=t2, full_trajectory=messages)
    act = ActionEvaluator.calculate_reward(task=t2, full_trajectory=messages)
    com = CommunicateEvaluator.calculate_reward(task=t2, full_trajectory=messages)
    basis = {b.value for b in t2.evaluation_criteria.reward_basis}
    # evaluate_simulation's "all" combination: the product over the reward basis
    reward = 1.0
    if basis & {"DB", "ENV_ASSERTION"}:
        reward *= env.reward
    if "ACTION" in basis:
        reward *= act.reward
    if "COMMUNICATE" in basis:
        reward *= com.reward
    if episode.truncated:
        reward = 0.0
    return {
        "reward": reward,
        "components": {
            "DB": env.db_check.db_match if env.db_check is not None else True,
            "COMMUNICATE": com.reward == 1.0,
            "ACTION": act.reward == 1.0,
        },
        "communicate": [c.met for c in com.communicate_checks or []],
        "actions": [c.action_match for c in act.action_checks or []],
    }


# ------------------------------------------------------------------ comparison


def compare(episode: Episode, kind: str, verifier: Tau2Verifier) -> dict[str, Any]:
    """One row: our reward and tau2's on one trajectory, and whether every component agrees."""
    task = episode.task
    mine = verifier.verify(episode)
    messages, mismatches = tau2_messages(episode)
    theirs = tau2_reward(episode, messages)
    d = mine.details
    ours_row = {
        "reward": mine.score,
        "components": {k: d["components"][k] for k in ("DB", "COMMUNICATE", "ACTION")},
        "communicate": [c["met"] for c in d["communicate"]],
        "actions": [c["met"] for c in d["actions"]],
    }
    return {
        "id": task.id,
        "kind": kind,
        "ours": ours_row["reward"],
        "tau2": theirs["reward"],
        "agree": ours_row == theirs and mismatches == 0,
        "tool_mismatches": mismatches,
        "ours_detail": ours_row,
        "tau2_detail": theirs,
    }


def parity(
    domain: str, limit: int | None = None, ids: Iterable[str] | None = None, kinds: Iterable[str] = KINDS
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (compare's) for the trajectories of `kinds` of the domain's tasks (all, or the first
    `limit`, or those with tau2 ids `ids`), and the summary per kind: {kind: {n, agree,
    ours_pass, tau2_pass}}."""
    wanted = set(kinds)
    unknown = wanted - set(KINDS)
    if unknown:
        raise ValueError(f"unknown trajectory kind(s) {sorted(unknown)}; known: {', '.join(KINDS)}")
    verifier = Tau2Verifier(EndStateVerifier())
    rows = []
    for task in ours.load_tasks(domain, limit=limit, ids=ids):
        gold = run(task, gold_turns(task))
        if "gold" in wanted:
            rows.append(compare(gold, "gold", verifier))
        for kind, actions in perturbations(task, gold):
            if kind in wanted:
                rows.append(compare(run(task, actions), kind, verifier))
    summary: dict[str, Any] = {}
    for kind in KINDS:
        sub = [r for r in rows if r["kind"] == kind]
        if sub:
            summary[kind] = {
                "n": len(sub),
                "agree": sum(r["agree"] for r in sub),
                "ours_pass": sum(r["ours"] == 1.0 for r in sub),
                "tau2_pass": sum(r["tau2"] == 1.0 for r in sub),
            }
    return rows, summary
