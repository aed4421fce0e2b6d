"""The `bfcl:<category>` toolboxes, resolved by registry.get_toolbox: stateful BFCL class methods
(runtime.py) for the multi-turn categories, call-acknowledging tools for the single-turn ones,
with the schemas of the package's data (tasks.py)."""

from __future__ import annotations

import functools
from typing import Any

from dataengine.external.bfcl.runtime import call_method
from dataengine.external.bfcl.tasks import (
    FUNC_DOC_FILES,
    MULTI_TURN_CATEGORIES,
    _entries,
    _func_docs,
    canonical_category,
    tool_spec,
)
from dataengine.tools.registry import Tool, Toolbox


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
