"""Perturbations of gold tool calls with known verdicts, for tests and the calibration report.

Each perturbation changes one thing about a correct list of calls and says whether BFCL's
argument check must still accept it: wrong name, extra parameter, dropped required
parameter, wrong type, changed value, extra call -> rejected; reordered calls -> accepted.
Deterministic: the first eligible call and parameter (by name) is changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dataengine.types import ToolCall, ToolSpec
from dataengine.verifiers.arguments import PYTHON_TYPES, _type_name

KINDS = ("wrong_name", "extra_parameter", "drop_required", "wrong_type", "changed_value", "extra_call", "reordered")


@dataclass(frozen=True)
class CallPerturbation:
    """kind: one of KINDS; calls: the perturbed calls; valid: what the argument check must say."""

    kind: str
    calls: list[ToolCall]
    valid: bool


def _replace(calls: list[ToolCall], i: int, call: ToolCall) -> list[ToolCall]:
    return [call if j == i else c for j, c in enumerate(calls)]


def _wrong_type_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(value)
    if isinstance(value, str):
        return 12345
    if isinstance(value, (list, dict)):
        return "x"
    return None


def _changed_value(value: Any, acceptable: list[Any]) -> Any:
    if isinstance(value, bool):
        new: Any = not value
    elif isinstance(value, int):
        new = value + 1
    elif isinstance(value, float):
        new = value + 1.5
    elif isinstance(value, str):
        new = value + " zzq"
    else:
        return None
    return None if new in acceptable else new


def perturb_calls(
    calls: list[ToolCall],
    tools: list[ToolSpec],
    acceptable: list[dict[str, list[Any]]] | None = None,
) -> list[CallPerturbation]:
    """Every applicable perturbation of `calls` (gold calls; `acceptable` aligned with them)."""
    if not calls:
        return []
    specs = {t.name: t.parameters for t in tools}
    acc = acceptable or [{k: [v] for k, v in c.arguments.items()} for c in calls]
    out: list[CallPerturbation] = []
    first = calls[0]
    # a tool the task offers but the gold does not use; else a tool that does not exist
    other = sorted(set(specs) - {c.name for c in calls})
    out.append(CallPerturbation("wrong_name", _replace(calls, 0, first.model_copy(update={"name": other[0] if other else first.name + "_x"})), False))
    out.append(
        CallPerturbation(
            "extra_parameter", _replace(calls, 0, ToolCall(name=first.name, arguments={**first.arguments, "zz_unexpected": 1})), False
        )
    )
    for i, call in enumerate(calls):
        required = [p for p in sorted(specs.get(call.name, {}).get("required", []) or []) if p in call.arguments]
        if required:
            args = {k: v for k, v in call.arguments.items() if k != required[0]}
            out.append(CallPerturbation("drop_required", _replace(calls, i, ToolCall(name=call.name, arguments=args)), False))
            break
    done_type = done_value = False
    for i, call in enumerate(calls):
        props = specs.get(call.name, {}).get("properties", {}) or {}
        for param in sorted(call.arguments):
            value = call.arguments[param]
            options = acc[i].get(param, [value])
            schema_type = PYTHON_TYPES.get(_type_name(props.get(param, {})) or "")
            gold_types = {type(a) for a in options if a != ""}
            if not done_type and schema_type is not None and gold_types <= {schema_type, int if schema_type is float else schema_type}:
                bad = _wrong_type_value(value)
                if bad is not None and type(bad) not in gold_types:
                    args = {**call.arguments, param: bad}
                    out.append(CallPerturbation("wrong_type", _replace(calls, i, ToolCall(name=call.name, arguments=args)), False))
                    done_type = True
            if not done_value:
                new = _changed_value(value, options)
                if new is not None and not (isinstance(new, str) and any(isinstance(a, str) and _same(a, new) for a in options)):
                    args = {**call.arguments, param: new}
                    out.append(CallPerturbation("changed_value", _replace(calls, i, ToolCall(name=call.name, arguments=args)), False))
                    done_value = True
        if done_type and done_value:
            break
    out.append(CallPerturbation("extra_call", [*calls, calls[0]], False))
    if len(calls) > 1 and calls[::-1] != calls:
        out.append(CallPerturbation("reordered", calls[::-1], True))
    return out


def _same(a: str, b: str) -> bool:
    from dataengine.verifiers.arguments import standardize_string

    return standardize_string(a) == standardize_string(b)
