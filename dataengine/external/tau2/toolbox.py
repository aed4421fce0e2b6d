"""The `tau2:<domain>` toolboxes: tau2's own tool methods run on the database in the tool state.

A tool call validates the state's database dict into tau2's DB model (or takes it from a
per-process cache keyed by the state's write token), runs tau2's tool method on it and, for
write tools, dumps the database back into the state.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any

from dataengine.external.tau2.db import check_domain, domain_classes, initial_db_json, initial_state, validate_db
from dataengine.tools.registry import Tool, Toolbox
from dataengine.types import Task, ToolSpec, stable_hash


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


@functools.cache
def tool_types(domain: str) -> dict[str, str]:
    """Tool name -> tau2's tool type ("read", "write", "think", "generic") of a domain."""
    db_cls, tools_cls = domain_classes(domain)
    kit = tools_cls(db_cls.model_validate_json(initial_db_json(domain)))
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
    write = tool_types(domain).get(name) == "write"
    # a write mutates the object: take it out of the cache so no other branch sees the change
    db = _DBS.pop((domain, rev), None) if write else _DBS.get((domain, rev))
    if db is None:
        db = validate_db(domain, state["db"], "tool state")
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
    kit = tools_cls(db_cls.model_validate_json(initial_db_json(domain)))
    specs = []
    for name, tool in kit.get_tools().items():
        f = tool.openai_schema["function"]
        specs.append(ToolSpec(name=name, description=f.get("description", ""), parameters=f["parameters"]))
    return tuple(specs)


def toolbox_for(rest: str) -> Toolbox:
    """The toolbox "tau2:<domain>": tau2's tools, stateful over the database dict."""
    domain = check_domain(rest)
    tools = {
        spec.name: Tool(fn=functools.partial(call_tool, domain, spec.name), spec=spec, stateful=True)
        for spec in tool_specs(domain)
    }
    return Toolbox(name=f"tau2:{domain}", tools=tools, make_initial_state=lambda task: initial_state(domain))


def write_calls(task: Task) -> list[int]:
    """Indices of the gold calls that are writes and succeed when the gold is replayed in order
    (dropping one of them must change the end state; a few gold writes are refused by tau2)."""
    domain = task.toolbox.split(":", 1)[1]
    types = tool_types(domain)
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
