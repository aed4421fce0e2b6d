"""BFCL's Java and JavaScript categories (simple_java, simple_javascript): what the model sees
and how its arguments are read, as BFCL does both.

The model is shown every parameter as a string, its real type named in the description
(bfcl_eval.utils._func_doc_language_specific_pre_processing), and answers with source-code
strings ("50L", "new ArrayList<>(Arrays.asList(\"a\"))", "[1, 2]"). Checking converts each
string with BFCL's own type converters (bfcl_eval.eval_checker.ast_eval.type_convertor) into
the value the possible answers hold, then judges it with the AST rules against the original
types (a value that is not a string is a type error, as in BFCL). The gold calls are the
answers rendered back into such strings, so that converting them gives the first acceptable
value again.
"""

from __future__ import annotations

import copy
import json
from typing import Any

LANGUAGES = {"simple_java": "java", "simple_javascript": "javascript"}
# What BFCL appends to every function's description before the model sees it
# (bfcl_eval.utils._get_language_specific_hint).
HINTS = {
    "python": " Note that the provided function is in Python 3 syntax.",
    "java": " Note that the provided function is in Java 8 SDK syntax.",
    "javascript": " Note that the provided function is in JavaScript syntax.",
}
_NAMES = {"java": "Java", "javascript": "JavaScript"}
_LISTS = {"java": ("ArrayList", "Array"), "javascript": ("array",)}

# The original type -> the JSON Schema type of the converted value (BFCL's JAVA_TYPE_CONVERSION
# and JS_TYPE_CONVERSION, bfcl_eval.constants.type_mappings, as JSON Schema names).
_JSON_TYPES = {
    "java": {"byte": "integer", "short": "integer", "integer": "integer", "long": "integer", "float": "number",
             "double": "number", "boolean": "boolean", "char": "string", "String": "string", "any": "string",
             "Array": "array", "ArrayList": "array", "Set": "array", "Queue": "array", "Stack": "array",
             "HashMap": "object", "Hashtable": "object"},
    "javascript": {"String": "string", "integer": "integer", "Bigint": "integer", "float": "number",
                   "Boolean": "boolean", "dict": "object", "array": "array", "any": "string"},
}


def shown_function(function: dict[str, Any], language: str) -> dict[str, Any]:
    """The BFCL function document as the model sees it in a `language` category ("python": the
    hint alone)."""
    out = copy.deepcopy(function)
    out["description"] = out.get("description", "") + HINTS[language]
    if language == "python":
        return out
    name = _NAMES[language]
    for prop in (out.get("parameters") or {}).get("properties", {}).values():
        kind = prop["type"]
        if kind == "any":
            prop["description"] += f" This parameter can be of any type of {name} object in string representation."
        else:
            prop["description"] += f" This is {name} {kind} type parameter in string representation."
        if kind in _LISTS[language]:
            prop["description"] += f" The list elements are of type {prop['items']['type']}; they are not in string representation."
            del prop["items"]
        if language == "javascript" and kind == "dict" and "properties" in prop:
            prop["description"] += (" The dictionary entries have the following schema; they are not in string "
                                    f"representation. {json.dumps(prop['properties'])}")
            del prop["properties"]
        prop["type"] = "string"
    return out


def typed_schema(parameters: dict[str, Any], language: str) -> dict[str, Any]:
    """The JSON Schema the converted arguments are checked against (original types, mapped)."""
    types = _JSON_TYPES[language]

    def convert(prop: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in prop.items() if k not in ("type", "items", "properties")}
        if prop.get("type") in types:
            out["type"] = types[prop["type"]]
        if isinstance(prop.get("items"), dict):
            out["items"] = convert(prop["items"])
        return out

    return {"type": "object", "properties": {k: convert(v) for k, v in (parameters.get("properties") or {}).items()},
            "required": list(parameters.get("required") or [])}


def convert_arguments(arguments: dict[str, Any], parameters: dict[str, Any], language: str) -> tuple[dict[str, Any], str | None]:
    """(converted arguments, None), or (arguments, the type error) where a value is not a string,
    as BFCL's checker converts them. Parameters the schema does not name stay as given (the
    AST check then calls them unexpected)."""
    if language == "java":
        from bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter import java_type_converter as converter
    else:
        from bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter import js_type_converter as converter
    props = parameters.get("properties") or {}
    out = {}
    for param, value in arguments.items():
        prop = props.get(param)
        if prop is None or prop.get("type") not in _JSON_TYPES[language]:
            out[param] = value
            continue
        if not isinstance(value, str):
            return arguments, (f"incorrect type for parameter {param!r}: expected String ({_NAMES[language]} source), "
                               f"got {type(value).__name__}")
        if prop["type"] in _LISTS[language]:
            out[param] = converter(value, prop["type"], prop["items"]["type"])
        else:
            out[param] = converter(value, prop["type"])
    return out, None


def _render(value: Any, kind: str, nested: str | None, language: str) -> str:
    """`value` as the source string BFCL's converter reads back as `value` (best effort: the
    tests check every gold call against BFCL's own checker)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if language == "java":
        if kind == "long":
            return f"{value}L"
        if kind == "float":
            return f"{float(value)}f"
        if kind == "double":
            return repr(float(value))
        if kind in ("ArrayList", "Array") and isinstance(value, list):
            item = nested or "String"
            if kind == "ArrayList":
                # ArrayList strips the quotes of String and char items; Array keeps them (its
                # items go through the converter as they are)
                items = ", ".join(f'"{x}"' if item == "String" else f"'{x}'" if item == "char" else _render(x, item, None, language)
                                  for x in value)
                return f"new ArrayList<>(Arrays.asList({items}))" if value else "new ArrayList<>()"
            items = ", ".join(_render(x, item, None, language) for x in value)
            return f"new {item}[]{{{items}}}"
        if kind == "HashMap" and isinstance(value, dict):
            puts = " ".join(f'put("{k}", {_literal(v)});' for k, v in value.items())
            return f"new HashMap<String, String>() {{{{ {puts} }}}}"
        return str(value)
    if kind == "Bigint":
        return f"{value}n"
    if kind == "array" and isinstance(value, list):
        return _literal(value)
    if kind == "dict" and isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_literal(v)}" for k, v in value.items()) + "}"
    if kind == "String" and isinstance(value, str):
        return f'"{value}"'
    return str(value)


def _literal(value: Any) -> str:
    """A value as a Java / JavaScript literal the converters' untyped parsers read back
    (parse_java_value, parse_js_value): strings quoted, booleans lower case, lists bracketed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_literal(x) for x in value) + "]"
    return str(value)


def render_arguments(arguments: dict[str, Any], parameters: dict[str, Any], language: str) -> dict[str, Any]:
    """Typed gold arguments as the strings a model answers with in a `language` category."""
    props = parameters.get("properties") or {}
    out = {}
    for param, value in arguments.items():
        prop = props.get(param) or {}
        nested = (prop.get("items") or {}).get("type")
        out[param] = _render(value, prop.get("type", "any"), nested, language)
    return out


def typed_calls(task: Any, calls: list[Any], language: str) -> tuple[list[Any], dict[str, dict[str, Any]], str | None]:
    """(converted calls, typed schemas by tool name, None) for a Java or JavaScript task, or
    (calls, schemas, the first type error): the input of the AST check BFCL runs."""
    from dataengine.types import ToolCall

    originals = task.metadata["bfcl_parameters"]
    schemas = {name: typed_schema(params, language) for name, params in originals.items()}
    out = []
    for call in calls:
        params = originals.get(call.name)
        if params is None:
            out.append(call)
            continue
        arguments, error = convert_arguments(dict(call.arguments), params, language)
        if error is not None:
            return calls, schemas, error
        out.append(ToolCall(name=call.name, arguments=arguments))
    return out, schemas, None


def unsatisfiable(ground_truth: list[dict[str, Any]], functions: list[dict[str, Any]], language: str) -> str | None:
    """Why BFCL's checker passes no answer to this Java / JavaScript task, or None."""
    schemas = {f["name"]: (f.get("parameters") or {}).get("properties") or {} for f in functions}
    for item in ground_truth:
        ((name, params),) = item.items()
        for param, values in params.items():
            prop = schemas.get(name, {}).get(param) or {}
            for value in values:
                if (language == "java" and (prop.get("items") or {}).get("type") == "any" and isinstance(value, list)
                        and any(not isinstance(x, str) for x in value)):
                    return f"{name}: {param!r} lists items of type any, which BFCL reads as strings, but its answer holds {value!r}"
                if isinstance(value, dict) and any(not isinstance(v, list) for v in value.values()):
                    return f"{name}: {param!r} answer {value!r} gives a key's value outside a list, which BFCL's dict check cannot match"
    return None
