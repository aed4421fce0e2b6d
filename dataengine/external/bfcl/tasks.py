"""BFCL (Berkeley Function Calling Leaderboard) as Tasks, from the data shipped in bfcl-eval.

Categories (file bfcl_eval/data/BFCL_v4_<category>.json, JSON Lines despite the name; gold
under possible_answer/):
- AST, single turn: simple_python (alias "simple"), simple_java, simple_javascript (arguments
  as source strings, languages.py), multiple, parallel, parallel_multiple and
  live_simple, live_multiple, live_parallel, live_parallel_multiple. Gold: calls and, per
  parameter, the acceptable values ("" = may be omitted); checked by ArgumentsVerifier.
- relevance: irrelevance, live_irrelevance (no call is right), live_relevance (any call is).
- multi turn: multi_turn_base, multi_turn_miss_func, multi_turn_miss_param,
  multi_turn_long_context. Stateful ToolEnv tasks over BFCL's own Python tool classes
  (bfcl_eval/eval_checker/multi_turn_eval/func_source_code/). The later user turns are the
  task's `user_turns`; a turn that BFCL leaves empty because it hands over held-back functions
  (miss_func) says BFCL's own prompt for it and adds those functions to the offered tools.
  Gold: the ground-truth calls of each turn (`gold.turn_calls`), judged turn by turn as BFCL's
  multi-turn checker does (dataengine.verifiers.multi_turn).

The multi-turn tool state and the toolboxes `bfcl:<category>` are in runtime.py.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dataengine.external import package_dir
from dataengine.external.bfcl.languages import LANGUAGES, render_arguments, shown_function
from dataengine.external.bfcl.languages import unsatisfiable as language_unsatisfiable
from dataengine.external.bfcl.runtime import INSTALL, initial_state, parse_call
from dataengine.types import Gold, Message, Task, ToolCall, ToolSpec, UserTurn

AST_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
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


def tool_spec(function: dict[str, Any], language: str | None = None) -> ToolSpec:
    """A BFCL function document as a ToolSpec (parameters converted to JSON Schema), its
    description ending with BFCL's language hint, as BFCL's prompt shows it (`language`
    "java" / "javascript": every parameter shown as a string, languages.shown_function)."""
    function = shown_function(function, language or "python")
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


def _ast_gold(ground_truth: list[dict[str, Any]], functions: list[dict[str, Any]], language: str | None = None) -> Gold:
    """Gold calls (the first acceptable values; in a Java / JavaScript category rendered as the
    source strings the model answers with) and, per call, every acceptable value."""
    schemas = {f["name"]: f.get("parameters") or {} for f in functions}
    calls, acceptable = [], []
    for item in ground_truth:
        ((name, params),) = item.items()
        arguments = _collapse(params, schemas.get(name))
        if language is not None:
            arguments = render_arguments(arguments, schemas.get(name) or {}, language)
        calls.append(ToolCall(name=name, arguments=arguments))
        acceptable.append(params)
    return Gold(calls=calls, acceptable=acceptable, needs_tool=True)


def load_tasks(category: str, limit: int | None = None, ids: Iterable[str] | None = None) -> list[Task]:
    """BFCL entries of `category` as Tasks (split "heldout", metadata["eval_only"]: evaluation sets).

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
    metadata: dict[str, Any] = {"bfcl_id": entry["id"], "bfcl_category": category, "reference_steps": 2, "eval_only": True}
    language = LANGUAGES.get(category)
    if language is not None:
        # the checker converts the model's strings against the original types (languages.py)
        metadata["bfcl_language"] = language
        metadata["bfcl_parameters"] = {f["name"]: f.get("parameters") or {} for f in entry["function"]}
    if category in RELEVANCE_CATEGORIES:
        gold = Gold(needs_tool=RELEVANCE_CATEGORIES[category])
    else:
        answers = _answers(category)
        if entry["id"] not in answers:
            raise ValueError(f"BFCL {category}: no possible answer for {entry['id']!r} in possible_answer/")
        gold = _ast_gold(answers[entry["id"]], entry["function"], language)
        reason = unsatisfiable(answers[entry["id"]], entry["function"])
        if reason is None and language is not None:
            reason = language_unsatisfiable(answers[entry["id"]], entry["function"], language)
        if reason is not None:
            metadata["bfcl_gold_unsatisfiable"] = reason
    return Task(
        id=f"bfcl/{entry['id']}",
        suite=f"bfcl:{category}",
        messages=_messages(entry["question"][0]),
        tools=[tool_spec(f, language) for f in entry["function"]],
        toolbox=f"bfcl:{category}",
        gold=gold,
        split="heldout",
        metadata=metadata,
    )


# ---- multi turn: BFCL's own tool classes, run through runtime.py ----


@functools.cache
def _func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    return tuple(read_jsonl(data_dir() / "multi_turn_func_doc" / FUNC_DOC_FILES[class_name]))


# What BFCL's runner says as the user in a turn that hands over held-back functions
# (bfcl_eval.constants.default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC).
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"


def _multi_turn_task(category: str, entry: dict[str, Any]) -> Task:
    classes = list(entry["involved_classes"])
    excluded = set(entry.get("excluded_function") or [])
    missed = {int(k): list(v) for k, v in (entry.get("missed_function") or {}).items()}
    held_back = {name for names in missed.values() for name in names}
    docs = {doc["name"]: doc for c in classes for doc in _func_docs(c)}
    tools = [tool_spec(doc) for name, doc in docs.items() if name not in excluded and name not in held_back]
    turns = _answers(category).get(entry["id"])
    if turns is None:
        raise ValueError(f"BFCL {category}: no ground truth for {entry['id']!r} in possible_answer/")
    if len(turns) != len(entry["question"]):
        raise ValueError(f"BFCL {category} {entry['id']!r}: {len(turns)} turns of ground truth for {len(entry['question'])} user turns")
    user_turns = []
    for t, question in enumerate(entry["question"][1:], start=1):
        messages = _messages(question)
        if not messages and t in missed:
            messages = [Message(role="user", content=ADDED_FUNCTIONS_PROMPT)]
        user_turns.append(UserTurn(messages=messages, tools=[tool_spec(docs[name]) for name in missed.get(t, [])]))
    turn_calls = [[parse_call(text, classes) for text in turn] for turn in turns]
    calls = [c for turn in turn_calls for c in turn]
    return Task(
        id=f"bfcl/{entry['id']}",
        suite=f"bfcl:{category}",
        messages=_messages(entry["question"][0]),
        tools=tools,
        toolbox=f"bfcl:{category}",
        gold=Gold(turn_calls=turn_calls, needs_tool=bool(calls)),
        split="heldout",
        initial_state=initial_state(entry, category),
        user_turns=user_turns,
        metadata={
            "bfcl_id": entry["id"],
            "bfcl_category": category,
            "eval_only": True,
            "state_view_key": "world",
            "stateful": True,
            "missed_function": {str(k): v for k, v in missed.items()},
            "reference_steps": len(calls) + len(turns),
        },
    )
