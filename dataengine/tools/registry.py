"""Tools are plain Python callables; their JSON schema is derived from type hints and docstring.

A Toolbox groups the tools of one suite (and, for stateful suites, how to build the initial
tool state). Toolboxes are found by name so that sandbox worker processes can rebuild them:
either registered at import time of their module, or resolved through `TOOLBOX_MODULES` /
`TOOLBOX_FACTORIES` below, which import lazily.

Stateful tools take a first parameter named `state` (a JSON-able dict). It is injected by the
environment, left out of the schema, and may be mutated in place: the mutated dict is the new
tool state.

A user's own tools come in through `load_tools(entries)` (config `tools.modules`, CLI `--tools`):
each entry is a `.py` file or an importable module, imported in this process and in every
sandbox worker. Its toolboxes are those it registers with `register_toolbox` while it is
imported (or `Toolbox` objects it holds that are registered); a module that registers none
becomes one toolbox of its plain functions (`module_toolbox`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import threading
import typing
from collections.abc import Callable, Sequence
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
    "fncall": "dataengine.suites.fncall_tools",
    "testing": "dataengine.tools.testing",
}
# prefix -> "module:function" building the toolbox for "prefix:rest" names (external suites).
TOOLBOX_FACTORIES: dict[str, str] = {
    "bfcl": "dataengine.external.bfcl:toolbox_for",
    "tau2": "dataengine.external.tau2:toolbox_for",
}

_REGISTRY: dict[str, Toolbox] = {}
_SCHEMA_LOCK = threading.Lock()
# tools entry (absolute .py path or module name) -> the toolbox names it defined, in load order.
_LOADED: dict[str, list[str]] = {}
_LOAD_LOCK = threading.RLock()
# Module attributes a plain-functions module uses to describe its toolbox (never tools).
MODULE_SETTINGS = ("TOOLBOX", "INITIAL_STATE", "READ_ONLY", "EXAMPLES", "initial_state")


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
    examples: worked example episodes the chat template shows before a conversation that offers
        these tools (each a list of role/content dicts: user, then assistant `<tool_call>` and
        tool output turns, then the assistant's answer; `dataengine.suites.fewshot`). Built-in
        suites keep theirs in fewshot.EXAMPLE_PLAN; a tools file gives them as `EXAMPLES`.
    """

    name: str
    tools: dict[str, Tool] = field(default_factory=dict)
    make_initial_state: Callable[[Any], dict[str, Any] | None] | None = None
    client: Any = None
    examples: list[list[dict[str, str]]] = field(default_factory=list)

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


class ToolsError(ValueError):
    """A tools entry that cannot become a toolbox: names the entry and what is wrong."""


def tools_entry(entry: str) -> str:
    """The canonical form of a tools entry: a `.py` file (or any existing file) as its absolute
    path, anything else as a module name. ToolsError for a missing .py file or an empty entry."""
    entry = str(entry).strip()
    if not entry:
        raise ToolsError("a tools entry is empty; give a .py file or an importable module name")
    if entry.endswith(".py") or os.sep in entry or os.path.isfile(entry):
        path = os.path.abspath(os.path.expanduser(entry))
        if not os.path.isfile(path):
            raise ToolsError(f"tools file {entry} does not exist")
        if not path.endswith(".py"):
            raise ToolsError(f"tools file {entry} is not a .py file")
        return path
    return entry


def is_tools_file(entry: str) -> bool:
    """Whether a canonical tools entry is a file path (else a module name)."""
    return os.path.isabs(entry)


def _file_module_name(path: str) -> str:
    # The same name in the parent and every worker (both derive it from the absolute path), and
    # never one that shadows a real module: "bank_tools.py" does not become `import bank_tools`.
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    return f"dataengine_tools_{stem}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def _import_entry(entry: str) -> Any:
    if not is_tools_file(entry):
        try:
            return importlib.import_module(entry)
        except ModuleNotFoundError as exc:
            if exc.name and entry.startswith(exc.name):
                raise ToolsError(f"tools module {entry!r} is not importable (no module {exc.name!r}); "
                                 "give a .py file path or install the module") from None
            raise ToolsError(f"tools module {entry!r} failed to import: {exc}") from None
        except Exception as exc:
            raise ToolsError(f"tools module {entry!r} failed to import: {type(exc).__name__}: {exc}") from None
    name = _file_module_name(entry)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, entry)
    if spec is None or spec.loader is None:
        raise ToolsError(f"tools file {entry} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: type hints and dataclasses look the module up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ToolsError(f"tools file {entry} failed to import: {type(exc).__name__}: {exc}") from None
    return module


def module_toolbox(module: Any, default_name: str) -> Toolbox:
    """One toolbox of a module's plain functions.

    name: the module's `TOOLBOX` string, else `default_name` (the file stem or the last part of
        the module name).
    tools: the names in `__all__` when the module sets it, else every public function defined in
        the module itself (not imported into it), less the MODULE_SETTINGS names. Each needs type
        hints and a Google-style docstring with an `Args:` line per parameter (`state` aside).
    state: `initial_state(task) -> dict` or an `INITIAL_STATE` dict (copied per task) gives the
        state at reset when the task has no `initial_state` of its own; `READ_ONLY` names
        stateful tools that never change the state.
    examples: `EXAMPLES`, a list of worked examples the model is shown before each task of the
        toolbox, each {"user": request, "calls": [{"name", "arguments"}], "answer": final reply
        (default "Done."), "initial_state": optional}; replayed through the tools here to get
        their outputs (`fewshot.user_episode`).
    """
    label = getattr(module, "__file__", None) or module.__name__
    name = getattr(module, "TOOLBOX", default_name)
    if not isinstance(name, str) or not name:
        raise ToolsError(f"tools {label}: TOOLBOX must be a non-empty string, got {name!r}")
    if "__all__" in vars(module):
        names = list(module.__all__)
        missing = [n for n in names if not callable(getattr(module, n, None))]
        if missing:
            raise ToolsError(f"tools {label}: __all__ names {missing[0]!r}, which is not a function of the module")
    else:
        names = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
                 and v.__module__ == module.__name__ and n not in MODULE_SETTINGS]
    if not names:
        raise ToolsError(f"tools {label} defines no tools: no public type-hinted functions and no registered Toolbox")
    read_only = set(getattr(module, "READ_ONLY", ()))
    unknown = sorted(read_only - set(names))
    if unknown:
        raise ToolsError(f"tools {label}: READ_ONLY names {unknown[0]!r}, which is not one of its tools")
    tools: dict[str, Tool] = {}
    for n in names:
        try:
            tools[n] = tool_from_callable(getattr(module, n), name=n, writes_state=n not in read_only)
        except Exception as exc:  # transformers' docstring and type-hint errors
            raise ToolsError(f"tools {label}: function {n!r}: {exc}") from None
    initial = getattr(module, "initial_state", None)
    if initial is None and getattr(module, "INITIAL_STATE", None) is not None:
        state = module.INITIAL_STATE
        if not isinstance(state, dict):
            raise ToolsError(f"tools {label}: INITIAL_STATE must be a dict, got {type(state).__name__}")
        frozen = json.dumps(state)  # also checks it is JSON
        initial = lambda task: json.loads(frozen)  # noqa: E731 - a fresh copy per task
    box = Toolbox(name=name, tools=tools, make_initial_state=initial)
    examples = getattr(module, "EXAMPLES", None)
    if examples is not None:
        from dataengine.suites.fewshot import user_episode

        if not isinstance(examples, (list, tuple)):
            raise ToolsError(f"tools {label}: EXAMPLES must be a list of examples, got {type(examples).__name__}")
        for i, example in enumerate(examples):
            try:
                box.examples.append(user_episode(box, example))
            except Exception as exc:
                raise ToolsError(f"tools {label}: EXAMPLES[{i}]: {type(exc).__name__}: {exc}") from None
    return box


def load_tools(entries: Sequence[str]) -> list[str]:
    """Import each tools entry (a .py file or a module name) once per process; returns the
    names of the toolboxes they define, in order. ToolsError names the entry and the problem,
    including a toolbox name that another toolbox already has."""
    names: list[str] = []
    for raw in entries:
        entry = tools_entry(raw)
        with _LOAD_LOCK:
            if entry not in _LOADED:
                _LOADED[entry] = _load_entry(entry)
        names += _LOADED[entry]
    return names


def _load_entry(entry: str) -> list[str]:
    before = dict(_REGISTRY)
    module = _import_entry(entry)
    registered = [n for n, box in _REGISTRY.items() if before.get(n) is not box]
    registered += [v.name for v in vars(module).values()
                   if isinstance(v, Toolbox) and _REGISTRY.get(v.name) is v and v.name not in registered]
    if registered:
        return registered
    default = os.path.splitext(os.path.basename(entry))[0] if is_tools_file(entry) else entry.rsplit(".", 1)[-1]
    box = module_toolbox(module, default)
    taken = box.name in _REGISTRY or box.name in TOOLBOX_MODULES or box.name.split(":", 1)[0] in TOOLBOX_FACTORIES
    if taken:
        raise ToolsError(f"tools {entry}: toolbox name {box.name!r} is taken by another toolbox; "
                         "set TOOLBOX = \"<another name>\" in the module")
    register_toolbox(box)
    return [box.name]


def loaded_tools() -> list[str]:
    """The tools entries this process has loaded (canonical form): sandboxes import them too."""
    with _LOAD_LOCK:
        return list(_LOADED)


def tools_fingerprint(entries: Sequence[str]) -> list[str]:
    """sha256 (16 hex digits) of each entry's source: the file, or the module's file (its name
    when it has none), so a changed tool changes a run id."""
    out = []
    for raw in entries:
        entry = tools_entry(raw)
        path = entry if is_tools_file(entry) else getattr(_import_entry(entry), "__file__", None)
        out.append(hashlib.sha256(open(path, "rb").read()).hexdigest()[:16] if path else entry)
    return out


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
        raise KeyError(f"unknown toolbox {name!r}; known toolboxes: {', '.join(known)} "
                       "(your own: --tools FILE.py or config tools.modules)")
    return _REGISTRY[name]
