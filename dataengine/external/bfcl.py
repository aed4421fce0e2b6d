"""BFCL (Berkeley Function Calling Leaderboard) as Tasks, from the data shipped in bfcl-eval.

Categories (file bfcl_eval/data/BFCL_v4_<category>.json, JSON Lines despite the name; gold
under possible_answer/):
- AST, single turn: simple_python (alias "simple"), multiple, parallel, parallel_multiple and
  live_simple, live_multiple, live_parallel, live_parallel_multiple. Gold: calls and, per
  parameter, the acceptable values ("" = may be omitted); checked by ArgumentsVerifier.
- relevance: irrelevance, live_irrelevance (no call is right), live_relevance (any call is).
- multi turn: multi_turn_base, multi_turn_miss_func, multi_turn_miss_param,
  multi_turn_long_context. Stateful ToolEnv tasks over BFCL's own Python tool classes
  (bfcl_eval/eval_checker/multi_turn_eval/func_source_code/). Gold: the end state after
  replaying the ground-truth calls (BFCL's state check: public attributes of every instance).

Tool state of a multi-turn task (a JSON-able dict, as the sandbox needs):
    {"classes": [class names], "config": initial_config, "long_context": bool,
     "log": [[method, arguments], ...],   # every call executed so far
     "world": {class: public attributes}} # what end-state comparison looks at
The class instances are rebuilt from config + log (memoised per process), because BFCL's
objects (a file tree with parent links, seeded random generators) are not JSON.

Differences from BFCL's own runner: one Task holds the first user turn; later turns are in
metadata["user_turns"] and functions held back until a turn in metadata["missed_function"]
(the shared Task type has no per-turn schedule); the multi-turn check compares the end state
of the whole episode, not each turn's state and responses.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from dataengine.external import package_dir
from dataengine.tools.registry import Tool, Toolbox
from dataengine.types import Gold, Message, Task, ToolCall, ToolSpec, stable_hash

INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
AST_CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
RELEVANCE_CATEGORIES = {"irrelevance": False, "live_irrelevance": False, "live_relevance": True}
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
CATEGORIES = AST_CATEGORIES + tuple(RELEVANCE_CATEGORIES) + MULTI_TURN_CATEGORIES
ALIASES = {"simple": "simple_python"}

FUNC_DOC_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}
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
# BFCL type names that are not JSON Schema -> their JSON Schema name (None: any type).
_TYPE_TO_JSON_SCHEMA = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def canonical_category(category: str) -> str:
    """The BFCL file name of `category` (aliases resolved); ValueError naming the choices if unknown."""
    name = ALIASES.get(category, category)
    if name not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose one of: {', '.join(CATEGORIES)} (or 'simple')")
    return name


def data_dir() -> Path:
    """bfcl_eval/data of the installed bfcl-eval (MissingPackageError if absent)."""
    return package_dir("bfcl_eval", "bfcl-eval", INSTALL) / "data"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@functools.lru_cache(maxsize=32)
def _entries(category: str) -> tuple[dict[str, Any], ...]:
    return tuple(read_jsonl(data_dir() / f"BFCL_v4_{category}.json"))


@functools.lru_cache(maxsize=32)
def _answers(category: str) -> dict[str, Any]:
    path = data_dir() / "possible_answer" / f"BFCL_v4_{category}.json"
    return {row["id"]: row["ground_truth"] for row in read_jsonl(path)} if path.exists() else {}


def to_json_schema(schema: Any) -> Any:
    """BFCL's parameter schema ("dict", "float", "tuple", "any") as standard JSON Schema."""
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str) and value in _TYPE_TO_JSON_SCHEMA:
            if _TYPE_TO_JSON_SCHEMA[value] is not None:
                out[key] = _TYPE_TO_JSON_SCHEMA[value]
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: to_json_schema(prop) for name, prop in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
            out[key] = to_json_schema(value)
        else:
            out[key] = value
    return out


def tool_spec(function: dict[str, Any]) -> ToolSpec:
    """A BFCL function document as a ToolSpec (parameters converted to JSON Schema)."""
    params = to_json_schema(function.get("parameters") or {"type": "object", "properties": {}})
    params.setdefault("properties", {})
    params.setdefault("required", [])
    return ToolSpec(name=function["name"], description=function.get("description", ""), parameters=params)


def _messages(turn: list[dict[str, Any]]) -> list[Message]:
    return [Message(role=m["role"], content=m.get("content") or "") for m in turn]


_OMIT = object()


def _first_value(values: list[Any], required: bool = False) -> Any:
    """The first listed acceptable value as a concrete argument ("" -> leave the parameter out,
    unless the schema requires it: then the first real value; a few BFCL answers list "" first
    for required parameters). Dict options map each key to its own list, so they collapse key by key.
    """
    real = [v for v in values if v != ""]
    if not real or (values[0] == "" and not required):
        return _OMIT
    first = real[0]
    if isinstance(first, dict):
        return _collapse(first)
    if isinstance(first, list) and first and all(isinstance(x, dict) for x in first):
        return [_collapse(x) for x in first]
    return first


def _collapse(option: dict[str, list[Any]], schema: dict[str, Any] | None = None) -> dict[str, Any]:
    required = set((schema or {}).get("required") or [])
    props = (schema or {}).get("properties")
    out = {}
    for key, values in option.items():
        value = _first_value(values if isinstance(values, list) else [values], key in required)
        if value is _OMIT or (props is not None and key not in props and "" in values):
            continue  # a few BFCL answers list optional keys the schema does not have
        out[key] = value
    return out


def _ast_gold(ground_truth: list[dict[str, Any]], functions: list[dict[str, Any]]) -> Gold:
    schemas = {f["name"]: f.get("parameters") or {} for f in functions}
    calls, acceptable = [], []
    for item in ground_truth:
        ((name, params),) = item.items()
        calls.append(ToolCall(name=name, arguments=_collapse(params, schemas.get(name))))
        acceptable.append(params)
    return Gold(calls=calls, acceptable=acceptable, needs_tool=True)


def load_tasks(category: str, limit: int | None = None, ids: Iterable[str] | None = None) -> list[Task]:
    """BFCL entries of `category` as Tasks (split "heldout": these are evaluation sets).

    Task ids are "bfcl/<BFCL id>"; metadata["bfcl_id"] keeps the BFCL id.
    """
    category = canonical_category(category)
    wanted = set(ids) if ids is not None else None
    tasks = []
    for entry in _entries(category):
        if wanted is not None and entry["id"] not in wanted:
            continue
        tasks.append(_multi_turn_task(category, entry) if category in MULTI_TURN_CATEGORIES else _single_turn_task(category, entry))
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


def unsatisfiable(ground_truth: list[dict[str, Any]], functions: list[dict[str, Any]]) -> str | None:
    """Why no call can pass this BFCL answer (a few shipped answers contradict their schema), or None."""
    schemas = {f["name"]: f.get("parameters") or {} for f in functions}
    for item in ground_truth:
        ((name, params),) = item.items()
        schema = schemas.get(name, {})
        props = schema.get("properties") or {}
        for param in schema.get("required") or []:
            if param not in params or not [v for v in params[param] if v != ""]:
                return f"{name}: required parameter {param!r} has no acceptable value"
        for param, values in params.items():
            if param not in props and "" not in values:
                return f"{name}: answer needs parameter {param!r}, which the schema does not define"
    return None


def _single_turn_task(category: str, entry: dict[str, Any]) -> Task:
    metadata: dict[str, Any] = {"bfcl_id": entry["id"], "bfcl_category": category, "reference_steps": 2}
    if category in RELEVANCE_CATEGORIES:
        gold = Gold(needs_tool=RELEVANCE_CATEGORIES[category])
    else:
        answers = _answers(category)
        if entry["id"] not in answers:
            raise ValueError(f"BFCL {category}: no possible answer for {entry['id']!r} in possible_answer/")
        gold = _ast_gold(answers[entry["id"]], entry["function"])
        reason = unsatisfiable(answers[entry["id"]], entry["function"])
        if reason is not None:
            metadata["bfcl_gold_unsatisfiable"] = reason
    return Task(
        id=f"bfcl/{entry['id']}",
        suite=f"bfcl:{category}",
        messages=_messages(entry["question"][0]),
        tools=[tool_spec(f) for f in entry["function"]],
        toolbox=f"bfcl:{category}",
        gold=gold,
        split="heldout",
        metadata=metadata,
    )


# ---- multi turn: BFCL's Python tool classes behind a JSON-able state ----


@functools.cache
def tool_class(name: str) -> type:
    """One of BFCL's multi-turn tool classes, imported from bfcl-eval."""
    import importlib

    package_dir("bfcl_eval", "bfcl-eval", INSTALL)
    if name not in CLASS_MODULES:
        raise ValueError(f"unknown BFCL tool class {name!r}; known: {', '.join(CLASS_MODULES)}")
    module = importlib.import_module(f"bfcl_eval.eval_checker.multi_turn_eval.func_source_code.{CLASS_MODULES[name]}")
    return getattr(module, name)


@functools.cache
def _func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    return tuple(read_jsonl(data_dir() / "multi_turn_func_doc" / FUNC_DOC_FILES[class_name]))


def jsonable(value: Any, _path: tuple[int, ...] = ()) -> Any:
    """Public state of BFCL objects as JSON: objects -> {"__class__", public attributes};
    back-references to an enclosing object (a directory's parent) are dropped, as BFCL's own
    __eq__ ignores them; sets sorted; other leaves through str()."""
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
        out = {"__class__": type(value).__name__}
        for key, attr in vars(value).items():
            if key.startswith("_") or id(attr) in _path:
                continue
            out[key] = jsonable(attr, path)
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


def instances_for(state: dict[str, Any]) -> dict[str, Any]:
    """The class instances that `state` describes (rebuilt from config + log, memoised)."""
    key = _state_key(state)
    hit = _INSTANCES.get(key)
    if hit is not None:
        _INSTANCES.move_to_end(key)
        return copy.deepcopy(hit)
    log = state["log"]
    prefix = {**state, "log": log[:-1]}
    if log and _state_key(prefix) in _INSTANCES:
        instances = copy.deepcopy(_INSTANCES[_state_key(prefix)])
        _execute(instances, log[-1][0], log[-1][1])
    else:
        instances = _fresh_instances(state)
        for method, arguments in log:
            _execute(instances, method, arguments)
    _remember(key, instances)
    return copy.deepcopy(instances)


def _remember(key: str, instances: dict[str, Any]) -> None:
    _INSTANCES[key] = copy.deepcopy(instances)
    while len(_INSTANCES) > _MAX_CACHED:
        _INSTANCES.popitem(last=False)


def call_method(method: str, state: dict[str, Any], /, **arguments: Any) -> Any:
    """Run one BFCL method on the state's instances; mutate `state` (log and world) in place.

    `state` is positional-only so that a tool argument may also be called "state".
    """
    instances = instances_for(state)
    output = _execute(instances, method, arguments)
    state["log"] = [*state["log"], [method, arguments]]
    state["world"] = world(instances)
    _remember(_state_key(state), instances)
    return jsonable(output)


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


def _multi_turn_task(category: str, entry: dict[str, Any]) -> Task:
    classes = list(entry["involved_classes"])
    excluded = set(entry.get("excluded_function") or [])
    missed = entry.get("missed_function") or {}
    held_back = {name for names in missed.values() for name in names}
    tools = [
        tool_spec(doc)
        for c in classes
        for doc in _func_docs(c)
        if doc["name"] not in excluded and doc["name"] not in held_back
    ]
    turns = _answers(category).get(entry["id"])
    if turns is None:
        raise ValueError(f"BFCL {category}: no ground truth for {entry['id']!r} in possible_answer/")
    calls = [parse_call(text, classes) for turn in turns for text in turn]
    return Task(
        id=f"bfcl/{entry['id']}",
        suite=f"bfcl:{category}",
        messages=_messages(entry["question"][0]),
        tools=tools,
        toolbox=f"bfcl:{category}",
        gold=Gold(calls=calls, needs_tool=bool(calls)),
        split="heldout",
        initial_state=initial_state(entry, category),
        metadata={
            "bfcl_id": entry["id"],
            "bfcl_category": category,
            "state_view_key": "world",
            "stateful": True,
            "user_turns": [[m.to_chat() for m in _messages(t)] for t in entry["question"][1:]],
            "turn_gold_counts": [len(t) for t in turns],
            "missed_function": missed,
            "reference_steps": len(calls) + len(turns),
        },
    )


# ---- toolboxes: resolved by registry.get_toolbox("bfcl:<category>") ----


def _echo(name: str):
    def echo(**arguments: Any) -> dict[str, Any]:
        # AST categories define no implementations: BFCL checks the call, never runs it
        return {"name": name, "arguments": arguments, "executed": False}

    echo.__name__ = name
    return echo


def toolbox_for(rest: str) -> Toolbox:
    """The toolbox "bfcl:<category>": stateful BFCL class methods for multi-turn categories,
    and for the single-turn ones tools that acknowledge the call without running it."""
    category = canonical_category(rest)
    tools: dict[str, Tool] = {}
    if category in MULTI_TURN_CATEGORIES:
        for class_name in FUNC_DOC_FILES:
            for doc in _func_docs(class_name):
                spec = tool_spec(doc)
                tools.setdefault(spec.name, Tool(fn=functools.partial(call_method, spec.name), spec=spec, stateful=True))
    else:
        for entry in _entries(category):
            for function in entry["function"]:
                spec = tool_spec(function)
                tools.setdefault(spec.name, Tool(fn=_echo(spec.name), spec=spec, stateful=False))
    return Toolbox(name=f"bfcl:{rest}", tools=tools)


# ---- checking prediction files (dataengine verify bfcl) ----


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


def _calls_from(prediction: dict[str, Any]) -> list[ToolCall]:
    raw = prediction.get("calls")
    if raw is None and "turns" in prediction:
        raw = [c for turn in prediction["turns"] for c in turn]
    if raw is None:
        raise ValueError("prediction has neither 'calls' nor 'turns'")
    if not isinstance(raw, list):
        raise ValueError("'calls' must be a list of {'name': ..., 'arguments': {...}}")
    calls = []
    for item in raw:
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"each call must be an object with 'name' and 'arguments'; got {item!r}")
        args = item.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args)
        calls.append(ToolCall(name=item["name"], arguments=args))
    return calls


@functools.lru_cache(maxsize=1)
def _end_state_verifier(cls: type) -> Any:
    # one instance, so each task's gold end state is replayed once per process
    return cls()


def check_prediction(task: Task, calls: list[ToolCall]) -> tuple[bool, str]:
    """(valid, reason) of one prediction, BFCL's way for the task's category."""
    from dataengine.types import Action, Episode, Step
    from dataengine.verifiers import ArgumentsVerifier, EndStateVerifier

    category = task.metadata["bfcl_category"]
    if category in RELEVANCE_CATEGORIES:
        want = RELEVANCE_CATEGORIES[category]
        ok = bool(calls) == want
        return ok, "" if ok else ("expected no call" if not want else "expected at least one call")
    if category in MULTI_TURN_CATEGORIES:
        episode = Episode(task=task, final_state=run_calls(task, calls))
        v = _end_state_verifier(EndStateVerifier).verify(episode)
        return bool(v.passed), "" if v.passed else "end state differs from the state after the gold calls"
    episode = Episode(task=task, steps=[Step(action=Action(text="", tool_calls=calls))])
    v = ArgumentsVerifier().verify(episode)
    return bool(v.passed), "" if v.passed else f"{v.details['error_type']}: {v.details['error']}"


def verify_predictions(category: str, predictions: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """One {"id", "valid", "reason"} per prediction {"id", "calls": [{"name", "arguments"}]}."""
    tasks = {t.metadata["bfcl_id"]: t for t in load_tasks(category)}
    for prediction in predictions:
        pid = prediction.get("id")
        task = tasks.get(pid)
        if task is None:
            yield {"id": pid, "valid": False, "reason": f"unknown id for BFCL category {category!r}"}
            continue
        try:
            calls = _calls_from(prediction)
        except (ValueError, json.JSONDecodeError) as exc:
            yield {"id": pid, "valid": False, "reason": f"malformed prediction: {exc}"}
            continue
        valid, reason = check_prediction(task, calls)
        yield {"id": pid, "valid": valid, "reason": reason}


def gold_prediction(task: Task) -> dict[str, Any]:
    """The prediction line that reproduces the gold calls of a task (for tests and examples)."""
    return {"id": task.metadata["bfcl_id"], "calls": [{"name": c.name, "arguments": c.arguments} for c in task.gold.calls]}
