"""BFCL's multi-turn Python tool classes behind a JSON-able state (the toolboxes: toolboxes.py).

Tool state of a multi-turn task (a JSON-able dict, as the sandbox needs):
    {"classes": [class names], "config": initial_config, "config_hash": str, "long_context": bool,
     "log": [[method, arguments], ...],   # every call executed so far
     "world": {class: public attributes}} # what end-state comparison looks at
The class instances are rebuilt from config + log (memoised per process), because BFCL's
objects (a file tree with parent links, seeded random generators) are not JSON.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import json
import pickle
from collections import OrderedDict
from typing import Any

from dataengine.external import package_dir
from dataengine.types import Task, ToolCall, stable_hash

INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
CLASS_MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS_CLASSES = {"MathAPI"}


@functools.cache
def tool_class(name: str) -> type:
    """One of BFCL's multi-turn tool classes, imported from bfcl-eval."""
    import importlib

    package_dir("bfcl_eval", "bfcl-eval", INSTALL)
    if name not in CLASS_MODULES:
        raise ValueError(f"unknown BFCL tool class {name!r}; known: {', '.join(CLASS_MODULES)}")
    module = importlib.import_module(f"bfcl_eval.eval_checker.multi_turn_eval.func_source_code.{CLASS_MODULES[name]}")
    return getattr(module, name)


def jsonable(value: Any, _path: tuple[int, ...] = ()) -> Any:
    """Public state of BFCL objects as JSON: objects -> {"__class__", public attributes};
    back-references to an enclosing object (a directory's parent) are dropped, as BFCL's own
    __eq__ ignores them; sets sorted; an object with no public attribute but a repr of its own
    (mpmath's mpf) -> its repr; other leaves through str()."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if id(value) in _path:
        return None
    path = _path + (id(value),)
    if isinstance(value, dict):
        return {str(k): jsonable(v, path) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, path) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v, path) for v in value), key=json.dumps)
    if hasattr(value, "__dict__") and not inspect.isroutine(value):
        public = {k: a for k, a in vars(value).items() if not k.startswith("_") and id(a) not in _path}
        if not public and type(value).__repr__ is not object.__repr__:
            # a value type that keeps its data out of sight (mpmath's mpf): its repr, which is what
            # BFCL's str() of a result shows and compares
            return repr(value)
        out = {"__class__": type(value).__name__}
        out.update((key, jsonable(attr, path)) for key, attr in public.items())
        return out
    return str(value)


def world(instances: dict[str, Any]) -> dict[str, Any]:
    """What BFCL's state checker compares: every instance's public attributes."""
    return {name: jsonable({k: v for k, v in vars(obj).items() if not k.startswith("_")}) for name, obj in instances.items()}


_INSTANCES: OrderedDict[str, dict[str, Any]] = OrderedDict()
_MAX_CACHED = 64


def _state_key(state: dict[str, Any]) -> str:
    return stable_hash([state["config_hash"], state["long_context"], state["log"]])


def _fresh_instances(state: dict[str, Any]) -> dict[str, Any]:
    instances = {}
    for name in state["classes"]:
        obj = tool_class(name)()
        if name not in STATELESS_CLASSES:
            obj._load_scenario(copy.deepcopy(state["config"].get(name, {})), long_context=state["long_context"])
        instances[name] = obj
    return instances


def _execute(instances: dict[str, Any], method: str, arguments: dict[str, Any]) -> Any:
    for obj in instances.values():
        fn = getattr(obj, method, None)
        if fn is not None and not method.startswith("_") and inspect.ismethod(fn):
            try:
                return fn(**arguments)
            except Exception as exc:  # noqa: BLE001 - BFCL turns any exception into an error result
                return {"error": f"Error during execution: {exc}"}
    raise ValueError(f"tool {method!r} belongs to none of this task's classes ({', '.join(instances)})")


def _clone(instances: dict[str, Any]) -> dict[str, Any]:
    # a pickle round trip copies BFCL's object graphs (shared references kept) 2-5x faster than deepcopy
    try:
        return pickle.loads(pickle.dumps(instances, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - an attribute pickle cannot take: deepcopy copes
        return copy.deepcopy(instances)


def instances_for(state: dict[str, Any]) -> dict[str, Any]:
    """The class instances that `state` describes (rebuilt from config + log, memoised); a
    private copy the caller may change."""
    key = _state_key(state)
    hit = _INSTANCES.get(key)
    if hit is not None:
        _INSTANCES.move_to_end(key)
        return _clone(hit)
    log = state["log"]
    prefix = {**state, "log": log[:-1]}
    if log and _state_key(prefix) in _INSTANCES:
        instances = _clone(_INSTANCES[_state_key(prefix)])
        _execute(instances, log[-1][0], log[-1][1])
    else:
        instances = _fresh_instances(state)
        for method, arguments in log:
            _execute(instances, method, arguments)
    _remember(key, instances)
    return _clone(instances)


def _remember(key: str, instances: dict[str, Any]) -> None:
    """Keep `instances` (handed over: the caller no longer changes them) as the state `key`."""
    _INSTANCES[key] = instances
    while len(_INSTANCES) > _MAX_CACHED:
        _INSTANCES.popitem(last=False)


def call_method(method: str, state: dict[str, Any], /, **arguments: Any) -> Any:
    """Run one BFCL method on the state's instances; mutate `state` (log and world) in place.

    `state` is positional-only so that a tool argument may also be called "state".
    """
    instances = instances_for(state)
    output = jsonable(_execute(instances, method, arguments))
    state["log"] = [*state["log"], [method, arguments]]
    state["world"] = world(instances)
    _remember(_state_key(state), instances)
    return output


def initial_state(entry: dict[str, Any], category: str) -> dict[str, Any]:
    """The JSON-able tool state at reset of a multi-turn entry (module docstring gives the layout)."""
    classes = list(entry["involved_classes"])
    config = {k: v for k, v in (entry.get("initial_config") or {}).items() if k in classes}
    state = {
        "classes": classes,
        "config": config,
        "config_hash": stable_hash(config),
        "long_context": "long_context" in category,
        "log": [],
    }
    state["world"] = world(instances_for(state))
    return state


def run_calls(task: Task, calls: list[ToolCall]) -> dict[str, Any] | None:
    """Execute `calls` in this process on a copy of the task's initial state; the final state."""
    state = copy.deepcopy(task.initial_state)
    if state is None:
        return None
    for call in calls:
        try:
            call_method(call.name, state, **call.arguments)
        except ValueError:
            continue  # a tool of no involved class: an error observation, the state is unchanged
    return state


def parse_call(text: str, classes: list[str]) -> ToolCall:
    """A BFCL ground-truth call string, e.g. "cd(folder='document')" or "sort('a.pdf')", as a ToolCall.

    Positional arguments are named from the method's signature.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"BFCL call {text!r} is not a Python call: {exc}") from exc
    if not isinstance(node, ast.Call):
        raise ValueError(f"BFCL call {text!r} is not a function call")
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name is None:
        raise ValueError(f"BFCL call {text!r}: cannot read the function name")
    method = next((getattr(tool_class(c), name) for c in classes if hasattr(tool_class(c), name)), None)
    if method is None:
        raise ValueError(f"BFCL call {text!r}: no class among {classes} has a method {name!r}")
    params = [p for p in inspect.signature(method).parameters if p != "self"]
    arguments: dict[str, Any] = {}
    for i, arg in enumerate(node.args):
        arguments[params[i]] = _json_value(ast.literal_eval(arg))
    for kw in node.keywords:
        arguments[kw.arg] = _json_value(ast.literal_eval(kw.value))
    return ToolCall(name=name, arguments=arguments)


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value
