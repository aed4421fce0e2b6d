"""Arguments checked against gold calls with the semantics of BFCL's AST checker.

Berkeley Function Calling Leaderboard rules (bfcl_eval/eval_checker/ast_eval/ast_checker.py),
re-implemented here so the check needs no optional package:
- every required parameter (of the tool's schema) is present;
- a parameter absent from the schema or from the gold answer is unexpected;
- each gold parameter lists its acceptable values; "" among them means it may be omitted;
- strict types: a bool is not an integer; an int is accepted for a float; when the gold
  values have another type than the schema says (a variable name), that type is accepted;
- strings are compared after removing spaces and `,./-_*^`, lower-casing, and ' -> ";
- lists in order (string items normalised); dicts one level deep, keys optional via "";
- several calls are matched to the gold calls without regard to order (first match wins).
BFCL's Java and JavaScript tasks (metadata "bfcl_language") first read the source strings
their arguments are given as, with BFCL's converters (dataengine.external.bfcl.languages).
One deliberate difference: items of a typed array are always type-checked (an int is allowed
for a float item; an item of the gold items' own type is allowed, as BFCL allows variables);
BFCL skips that check when "" is among the acceptable values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dataengine.types import Episode, Task, ToolCall, Verdict
from dataengine.verifiers.base import not_applicable, verdict

# JSON Schema and BFCL's own type names -> the Python type a value must have.
PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "number": float,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "object": dict,
    "dict": dict,
    "any": str,
}
_STRIP = re.compile(r"[ ,./\-_*^]")


def standardize_string(text: str) -> str:
    """BFCL's string normal form: drop spaces and `,./-_*^`, lower-case, ' -> "."""
    return _STRIP.sub("", text).lower().replace("'", '"')


@dataclass(frozen=True)
class CallCheck:
    """Result of checking one call: valid, a readable error, and BFCL's error_type label."""

    valid: bool
    error: str = ""
    error_type: str = ""


OK = CallCheck(True)


def _gold_type(acceptable: list[Any]) -> type | None:
    for value in acceptable:
        if value != "":
            return type(value)
    return None


def _std(value: Any) -> Any:
    return standardize_string(value) if isinstance(value, str) else value


def _dict_ok(value: dict, options: list[Any]) -> bool:
    for option in options:
        if option == "" or not isinstance(option, dict):
            continue
        if any(k not in option or _std(v) not in [_std(a) for a in option[k]] for k, v in value.items()):
            continue
        if any(k not in value and "" not in allowed for k, allowed in option.items()):
            continue
        return True
    return False


def _list_of_dicts_ok(value: list, options: list[Any]) -> bool:
    for option in options:
        if isinstance(option, list) and len(option) == len(value):
            if all(isinstance(v, dict) and _dict_ok(v, [o]) for v, o in zip(value, option)):
                return True
    return False


def _type_name(prop: dict[str, Any]) -> str | None:
    t = prop.get("type")
    if isinstance(t, list):  # ["string", "null"]: the first non-null names it
        t = next((x for x in t if x != "null"), None)
    return t


def check_value(param: str, value: Any, prop: dict[str, Any], acceptable: list[Any]) -> CallCheck:
    """Check one argument value against its schema entry and the gold's acceptable values."""
    type_name = _type_name(prop)
    expected = PYTHON_TYPES.get(type_name) if type_name else None
    if expected is float and type(value) is int:
        value = float(value)
    gold_type = _gold_type(acceptable)
    is_variable = False
    if expected is not None and type(value) is not expected:
        if gold_type is not None and gold_type is not expected and type(value) is gold_type:
            is_variable = True
        else:
            return CallCheck(
                False,
                f"incorrect type for parameter {param!r}: expected {type_name}, got {type(value).__name__}",
                "type_error:simple",
            )
    if expected is list and not is_variable:
        item_name = _type_name(prop.get("items") or {})
        item_type = PYTHON_TYPES.get(item_name) if item_name else None
        if item_type is not None:
            # as BFCL: items may instead have the type the gold's own items have (variables)
            gold_item_types = {type(x) for a in acceptable if isinstance(a, list) for x in a}
            for item in value:
                if type(item) is not item_type and not (item_type is float and type(item) is int) and type(item) not in gold_item_types:
                    return CallCheck(
                        False,
                        f"nested type check failed for parameter {param!r}: items must be {item_name}",
                        "type_error:nested",
                    )
            if item_type is dict:
                if _list_of_dicts_ok(value, acceptable):
                    return OK
                return CallCheck(False, f"invalid value for parameter {param!r}: {value!r}", "value_error:list_dict")
    if not is_variable:
        if isinstance(value, dict):
            if _dict_ok(value, acceptable):
                return OK
            return CallCheck(False, f"invalid value for parameter {param!r}: {value!r}", "value_error:dict_value")
        if isinstance(value, str):
            if standardize_string(value) in [standardize_string(a) for a in acceptable if isinstance(a, str)]:
                return OK
            return CallCheck(
                False, f"invalid value for parameter {param!r}: {value!r}; expected one of {acceptable}", "value_error:string"
            )
        if isinstance(value, list):
            std = [_std(v) for v in value]
            if any(isinstance(a, list) and std == [_std(x) for x in a] for a in acceptable):
                return OK
            return CallCheck(
                False, f"invalid value for parameter {param!r}: {value!r}; expected one of {acceptable}", "value_error:list/tuple"
            )
    if value not in acceptable or (isinstance(value, bool) and not any(a is value for a in acceptable)):
        return CallCheck(
            False, f"invalid value for parameter {param!r}: {value!r}; expected one of {acceptable}", "value_error:others"
        )
    return OK


def check_call(parameters: dict[str, Any], call: ToolCall, name: str, acceptable: dict[str, list[Any]]) -> CallCheck:
    """BFCL's simple_function_checker: one predicted call against one gold call.

    parameters: the tool's JSON schema ({"properties": ..., "required": [...]}).
    name: the gold function name. acceptable: parameter -> list of acceptable values.
    """
    if call.name != name:
        return CallCheck(False, f"function name {name!r} not found (got {call.name!r})", "simple_function_checker:wrong_func_name")
    props = parameters.get("properties", {}) or {}
    for param in parameters.get("required", []) or []:
        if param not in call.arguments:
            return CallCheck(False, f"missing required parameter {param!r}", "simple_function_checker:missing_required")
    for param, value in call.arguments.items():
        if param not in props or param not in acceptable:
            return CallCheck(False, f"unexpected parameter {param!r}", "simple_function_checker:unexpected_param")
        result = check_value(param, value, props[param], acceptable[param])
        if not result.valid:
            return result
    for param, allowed in acceptable.items():
        if param not in call.arguments and "" not in allowed:
            return CallCheck(
                False, f"parameter {param!r} not provided and not marked optional", "simple_function_checker:missing_optional"
            )
    return OK


def gold_acceptable(task: Task) -> list[tuple[str, dict[str, list[Any]]]]:
    """Per gold call: (name, parameter -> acceptable values), from gold.acceptable or gold.calls."""
    gold = task.gold
    if gold.acceptable:
        if len(gold.acceptable) != len(gold.calls):
            raise ValueError(
                f"task {task.id}: gold.acceptable has {len(gold.acceptable)} entries but gold.calls has "
                f"{len(gold.calls)}; they must align one to one"
            )
        return [(c.name, dict(a)) for c, a in zip(gold.calls, gold.acceptable)]
    return [(c.name, {k: [v] for k, v in c.arguments.items()}) for c in gold.calls]


def check_calls(
    schemas: dict[str, dict[str, Any]],
    calls: list[ToolCall],
    gold: list[tuple[str, dict[str, list[Any]]]],
) -> tuple[CallCheck, int]:
    """BFCL's parallel checker (no order): (overall result, number of gold calls matched).

    schemas: tool name -> parameter schema. Each gold call, in turn, takes the first unused
    predicted call that passes check_call.
    """
    used: set[int] = set()
    matched = 0
    first_error: CallCheck | None = None
    for name, acceptable in gold:
        params = schemas.get(name, {"properties": {}, "required": []})
        last: CallCheck | None = None
        for i, call in enumerate(calls):
            if i in used:
                continue
            last = check_call(params, call, name, acceptable)
            if last.valid:
                used.add(i)
                matched += 1
                break
        else:
            if first_error is None:
                first_error = CallCheck(
                    False,
                    f"no predicted call matches gold call {name!r}" + (f": {last.error}" if last else ""),
                    last.error_type if last else "parallel_function_checker_no_order:cannot_find_match",
                )
    if len(calls) != len(gold):
        return CallCheck(False, f"wrong number of calls: {len(calls)} instead of {len(gold)}", "wrong_count"), matched
    return (first_error or OK), matched


class ArgumentsVerifier:
    """The episode's calls against the gold calls (BFCL AST semantics, unordered matching).

    Score: matched gold calls / max(#gold, #predicted). Not applicable without gold calls.
    details: error, error_type, matched.
    """

    name = "arguments"
    version = "1"

    def verify(self, episode: Episode) -> Verdict:
        task = episode.task
        gold = gold_acceptable(task)
        if not gold:
            return not_applicable(self.name, self.version, "task has no gold calls")
        calls = episode.calls
        schemas = {t.name: t.parameters for t in task.tools}
        language = task.metadata.get("bfcl_language")
        if language:
            # BFCL's Java / JavaScript tasks: the arguments are source strings, read with BFCL's
            # own converters (needs bfcl-eval, which those tasks come from)
            from dataengine.external.bfcl.languages import typed_calls

            calls, schemas, error = typed_calls(task, calls, language)
            if error is not None:
                kind = "java" if language == "java" else "js"
                return verdict(self.name, self.version, False, 0.0, error=error, error_type=f"type_error:{kind}", matched=0)
        result, matched = check_calls(schemas, calls, gold)
        score = matched / max(len(gold), len(calls))
        return verdict(
            self.name, self.version, result.valid, score, error=result.error, error_type=result.error_type, matched=matched
        )


def _numbers(values: list[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def closeness(pred: float, gold: float) -> float:
    """1 / (1 + |pred - gold| / max(1, |gold|)): 1 at the gold value, in (0, 1], halved at an
    error as large as the gold value (or as 1, for golds below 1 in size)."""
    return 1.0 / (1.0 + abs(pred - gold) / max(1.0, abs(gold)))


class NumericArgumentsVerifier:
    """Graded score for numeric arguments, in [0, 1].

    Each gold numeric parameter scores `closeness(pred, gold)` (its best acceptable value), 0
    when the prediction omits it or gives a non-number; score = the mean over every numeric
    parameter of every gold call. Each gold call is paired with the unused same-named predicted
    call that scores best; a gold call with none scores 0 on all its parameters. passed iff
    every numeric argument is exact (score 1). Not applicable when no gold call has a numeric
    argument.
    details: distance (the raw, unbounded sum of |pred - gold|, a missing argument counting
    |gold| and a missing call the sum of its |gold| values plus 1), per_call (raw distance of
    each gold call with numeric arguments), per_call_score (its mean closeness).
    """

    name = "arguments_numeric"
    version = "2"

    def verify(self, episode: Episode) -> Verdict:
        gold = gold_acceptable(episode.task)
        numeric = [(n, {p: _numbers(v) for p, v in a.items() if _numbers(v)}) for n, a in gold]
        numeric = [(n, params) for n, params in numeric if params]
        if not numeric:
            return not_applicable(self.name, self.version, "no numeric gold argument")
        calls = episode.calls
        used: set[int] = set()
        per_call: list[float] = []
        per_call_score: list[float] = []
        total, count = 0.0, 0
        for name, params in numeric:
            best: tuple[float, float] | None = None  # (summed closeness, raw distance)
            best_i = None
            for i, call in enumerate(calls):
                if i in used or call.name != name:
                    continue
                close, dist = 0.0, 0.0
                for p, options in params.items():
                    v = call.arguments.get(p)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        close += max(closeness(float(v), o) for o in options)
                        dist += min(abs(float(v) - o) for o in options)
                    else:
                        dist += min(abs(o) for o in options)
                if best is None or close > best[0]:
                    best, best_i = (close, dist), i
            if best is None:
                best = (0.0, sum(min(abs(o) for o in options) for options in params.values()) + 1.0)
            else:
                used.add(best_i)
            total += best[0]
            count += len(params)
            per_call.append(float(best[1]))
            per_call_score.append(best[0] / len(params))
        distance = sum(per_call)
        return verdict(self.name, self.version, distance == 0.0, total / count,
                       distance=distance, per_call=per_call, per_call_score=per_call_score)
