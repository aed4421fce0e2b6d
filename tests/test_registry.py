"""Tool schemas are derived from the callables; toolboxes are found by name."""

from __future__ import annotations

import subprocess
import sys
from typing import Literal

import pytest

from dataengine.tools.registry import TOOLBOX_MODULES, Toolbox, get_toolbox, register_toolbox, tool_from_callable


def convert(value: float, unit: Literal["km", "mi"], precision: int = 2, note: str | None = None) -> float:
    """Convert a distance.

    Args:
        value: The distance to convert.
        unit: The unit to convert to.
        precision: Digits after the decimal point.
        note: A free-text note.
    """
    return round(value, precision)


def add_item(state: dict, sku: str, quantity: int = 1) -> dict:
    """Add an item to the cart.

    Args:
        state: The shop database.
        sku: The stock-keeping unit.
        quantity: How many to add.
    """
    state.setdefault("cart", {})[sku] = quantity
    return state["cart"]


def test_schema_types_required_and_descriptions():
    tool = tool_from_callable(convert)
    assert not tool.stateful and tool.name == "convert"
    assert tool.spec.description == "Convert a distance."
    params = tool.spec.parameters
    assert params["required"] == ["value", "unit"]
    props = params["properties"]
    assert props["value"] == {"type": "number", "description": "The distance to convert."}
    assert props["unit"]["enum"] == ["km", "mi"] and props["unit"]["type"] == "string"
    assert props["precision"]["type"] == "integer"
    assert props["note"]["type"] == "string" and props["note"]["nullable"] is True  # OpenAPI style


def test_stateful_tool_hides_state_from_the_schema():
    tool = tool_from_callable(add_item)
    assert tool.stateful
    assert set(tool.spec.parameters["properties"]) == {"sku", "quantity"}
    assert tool.spec.parameters["required"] == ["sku"]
    assert "state" not in tool.spec.description and "database" not in str(tool.spec.parameters)


def test_read_only_flag():
    assert tool_from_callable(add_item).writes_state
    assert not tool_from_callable(add_item, writes_state=False).writes_state


def test_name_override_and_openai_form():
    tool = tool_from_callable(convert, name="distance")
    assert tool.name == "distance"
    assert tool.spec.to_openai()["function"]["name"] == "distance"


def test_undocumented_parameter_is_refused():
    def bad(x: int) -> int:
        """No args section."""
        return x

    with pytest.raises(Exception, match="x"):
        tool_from_callable(bad)


def test_register_and_get():
    box = register_toolbox(Toolbox(name="registry-test", tools={"convert": tool_from_callable(convert)}))
    assert get_toolbox("registry-test") is box
    assert box.specs()[0].name == "convert"
    assert box.initial_state(None) is None


def test_initial_state_prefers_the_task():
    box = Toolbox(name="x", make_initial_state=lambda task: {"n": 0})

    class T:
        initial_state = {"n": 5}

    assert box.initial_state(T()) == {"n": 5}
    assert box.initial_state(None) == {"n": 0}


def test_lazy_module_toolbox():
    assert TOOLBOX_MODULES["testing"] == "dataengine.tools.testing"
    box = get_toolbox("testing")
    assert box.tools["push"].stateful and not box.tools["add"].stateful


def test_unknown_toolbox_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown toolbox 'nope'.*testing"):
        get_toolbox("nope")


def test_schema_derivation_does_not_import_torch():
    code = "import sys, dataengine.tools.testing; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
