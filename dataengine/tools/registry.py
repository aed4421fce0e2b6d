"""Tools are plain Python callables; their JSON schema is derived from type hints and docstring.

A Toolbox groups the tools of one suite (and, for stateful suites, how to build the initial
tool state). Toolboxes are found by name so that sandbox worker processes can rebuild them:
either registered at import time of their module, or resolved through `TOOLBOX_MODULES` /
`TOOLBOX_FACTORIES` below, which import lazily.

Stateful tools take a first parameter named `state` (a JSON-able dict). It is injected by the
environment, left out of the schema, and may be mutated in place: the mutated dict is the new
tool state.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dataengine.types import ToolSpec

STATE_PARAM = "state"

# name -> module that registers it on import (so workers can find built-in toolboxes).
TOOLBOX_MODULES: dict[str, str] = {
    "arithmetic": "dataengine.suites.arithmetic",
    "units": "dataengine.suites.units",
    "shop": "dataengine.suites.shop",
    "chains": "dataengine.suites.chains",
    "notool": "dataengine.suites.notool",
    "testing": "dataengine.tools.testing",
}
# prefix -> "module:function" building the toolbox for "prefix:rest" names (external suites).
TOOLBOX_FACTORIES: dict[str, str] = {
    "bfcl": "dataengine.external.bfcl:toolbox_for",
    "tau2": "dataengine.external.tau2:toolbox_for",
}

_REGISTRY: dict[str, Toolbox] = {}
_SCHEMA_LOCK = threading.Lock()


@dataclass(frozen=True)
class Tool:
    """An executable tool: the callable and the schema the model sees.

    stateful: the callable takes the tool state as its first argument `state`.
    writes_state: a stateful tool that may change the state. False marks a read-only tool:
        the sandbox then skips sending the (possibly large) state back, and any change the
        tool makes to its copy is discarded.
    """

    fn: Callable[..., Any]
    spec: ToolSpec
    stateful: bool = False
    writes_state: bool = True

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class Toolbox:
    """The tools of one suite, by name. `initial_state(task)` gives the state at reset.

    client: for tools served outside the package (an MCP server), what runs their calls in
        the engine's process instead of in a sandbox worker: an object with
        `call_many([(call, state), ...]) -> [(ToolResult, state), ...]`.
    """

    name: str
    tools: dict[str, Tool] = field(default_factory=dict)
    make_initial_state: Callable[[Any], dict[str, Any] | None] | None = None
    client: Any = None

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self.tools.values()]

    def initial_state(self, task: Any) -> dict[str, Any] | None:
        if task is not None and getattr(task, "initial_state", None) is not None:
            return task.initial_state
        return self.make_initial_state(task) if self.make_initial_state else None


def tool_from_callable(fn: Callable[..., Any], name: str | None = None, writes_state: bool = True) -> Tool:
    """Build a Tool from a type-hinted, Google-style-documented callable.

    The schema comes from transformers.utils.get_json_schema; a first `state` parameter marks
    the tool stateful and is removed from the schema. `writes_state=False` declares a stateful
    tool read-only (see Tool).
    """
    params = list(inspect.signature(fn).parameters)
    stateful = bool(params) and params[0] == STATE_PARAM
    # get_json_schema wants every parameter documented and typed; hide `state` from it.
    schema = _json_schema(_without_state(fn) if stateful else fn)
    f = schema["function"]
    spec = ToolSpec(
        name=name or f["name"],
        description=f.get("description", ""),
        parameters=f.get("parameters", {"type": "object", "properties": {}}),
    )
    return Tool(fn=fn, spec=spec, stateful=stateful, writes_state=writes_state)


def _json_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """transformers.utils.get_json_schema, without importing torch in a process that lacks it."""
    from transformers.utils import chat_template_utils, get_json_schema

    if "torch" in sys.modules:
        return get_json_schema(fn)
    # transformers imports torch (about 1 s) only to map torch.Tensor hints to "audio";
    # tools never take tensors, and sandbox workers must stay small.
    with _SCHEMA_LOCK:
        saved = chat_template_utils.is_torch_available
        chat_template_utils.is_torch_available = lambda: False
        try:
            return get_json_schema(fn)
        finally:
            chat_template_utils.is_torch_available = saved


def _without_state(fn: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(fn)
    params = [p for n, p in sig.parameters.items() if n != STATE_PARAM]

    def proxy(*args: Any, **kwargs: Any) -> Any:  # never called: only inspected
        raise RuntimeError("schema proxy")

    proxy.__name__ = fn.__name__
    proxy.__doc__ = "\n".join(
        line for line in (fn.__doc__ or "").splitlines() if not line.strip().startswith(f"{STATE_PARAM}:")
    )
    proxy.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    # Resolve string annotations (PEP 563) in the tool's own module, not in this one.
    hints = dict(typing.get_type_hints(fn))
    hints.pop(STATE_PARAM, None)
    proxy.__annotations__ = hints
    return proxy


def register_toolbox(toolbox: Toolbox) -> Toolbox:
    _REGISTRY[toolbox.name] = toolbox
    return toolbox


def get_toolbox(name: str) -> Toolbox:
    """Find a toolbox by name, importing the module that defines it if needed."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in TOOLBOX_MODULES:
        importlib.import_module(TOOLBOX_MODULES[name])
    elif ":" in name and name.split(":", 1)[0] in TOOLBOX_FACTORIES:
        prefix, rest = name.split(":", 1)
        module, func = TOOLBOX_FACTORIES[prefix].split(":")
        register_toolbox(getattr(importlib.import_module(module), func)(rest))
    if name not in _REGISTRY:
        known = sorted(set(_REGISTRY) | set(TOOLBOX_MODULES))
        raise KeyError(f"unknown toolbox {name!r}; known toolboxes: {', '.join(known)}")
    return _REGISTRY[name]
