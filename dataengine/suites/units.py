"""Units suite: one `convert(value, from_unit, to_unit)` tool over length, mass, temperature,
volume and time.

The tool rounds its result to 6 significant digits and the gold answer is that number as text.
Answers are judged with a relative tolerance of 1e-3 (metadata["answer_rel_tol"]): copying the
tool's value, or rounding it to 4 significant digits, passes; a mental estimate usually does not.
The answer is the number alone or followed by the target unit (metadata["answer_units"]).
Volumes use US customary units (gallon, quart, cup, fluid ounce).

Every task needs one call; the level (metadata["level"], also "difficulty") is the kind of
conversion: 1 within one system (metric to metric, US to US, or time), 2 between metric and US
customary units, 3 temperature (an offset as well as a factor).
Problem key: "<value> <from_unit> -> <to_unit>"; the question names exactly these.
"""

from __future__ import annotations

import random
from typing import Literal

from dataengine.suites.base import (
    Draft,
    Suite,
    format_number,
    make_toolbox,
    tidy_number,
)
from dataengine.tools.registry import register_toolbox
from dataengine.types import Gold, ToolCall

Unit = Literal[
    "millimeter", "centimeter", "meter", "kilometer", "inch", "foot", "yard", "mile",
    "milligram", "gram", "kilogram", "tonne", "ounce", "pound",
    "celsius", "fahrenheit", "kelvin",
    "milliliter", "liter", "us_fluid_ounce", "us_cup", "us_quart", "us_gallon",
    "second", "minute", "hour", "day", "week",
]  # fmt: skip

# Size of one unit in the dimension's base unit (meter, kilogram, liter, second); exact
# definitions (1 inch = 0.0254 m, 1 pound = 0.45359237 kg, 1 US gallon = 3.785411784 l).
FACTORS: dict[str, dict[str, float]] = {
    "length": {
        "millimeter": 0.001, "centimeter": 0.01, "meter": 1.0, "kilometer": 1000.0,
        "inch": 0.0254, "foot": 0.3048, "yard": 0.9144, "mile": 1609.344,
    },
    "mass": {
        "milligram": 1e-6, "gram": 0.001, "kilogram": 1.0, "tonne": 1000.0,
        "ounce": 0.028349523125, "pound": 0.45359237,
    },
    "volume": {
        "milliliter": 0.001, "liter": 1.0, "us_fluid_ounce": 0.0295735295625,
        "us_cup": 0.2365882365, "us_quart": 0.946352946, "us_gallon": 3.785411784,
    },
    "time": {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0, "week": 604800.0},
}  # fmt: skip
TEMPERATURES = ("celsius", "fahrenheit", "kelvin")
DIMENSION = {unit: dim for dim, units in FACTORS.items() for unit in units} | {u: "temperature" for u in TEMPERATURES}
METRIC = {"millimeter", "centimeter", "meter", "kilometer", "milligram", "gram", "kilogram", "tonne",
          "milliliter", "liter"}  # fmt: skip
# How units read in questions: (singular, plural).
NAMES = {
    "millimeter": ("millimeter", "millimeters"), "centimeter": ("centimeter", "centimeters"),
    "meter": ("meter", "meters"), "kilometer": ("kilometer", "kilometers"), "inch": ("inch", "inches"),
    "foot": ("foot", "feet"), "yard": ("yard", "yards"), "mile": ("mile", "miles"),
    "milligram": ("milligram", "milligrams"), "gram": ("gram", "grams"), "kilogram": ("kilogram", "kilograms"),
    "tonne": ("metric ton", "metric tons"), "ounce": ("ounce", "ounces"), "pound": ("pound", "pounds"),
    "celsius": ("degree Celsius", "degrees Celsius"), "fahrenheit": ("degree Fahrenheit", "degrees Fahrenheit"),
    "kelvin": ("kelvin", "kelvins"), "milliliter": ("milliliter", "milliliters"), "liter": ("liter", "liters"),
    "us_fluid_ounce": ("US fluid ounce", "US fluid ounces"), "us_cup": ("US cup", "US cups"),
    "us_quart": ("US quart", "US quarts"), "us_gallon": ("US gallon", "US gallons"),
    "second": ("second", "seconds"), "minute": ("minute", "minutes"), "hour": ("hour", "hours"),
    "day": ("day", "days"), "week": ("week", "weeks"),
}  # fmt: skip
# Short forms accepted after a numeric answer, besides the names above (metadata["answer_units"]).
SYMBOLS = {
    "millimeter": ["mm"], "centimeter": ["cm"], "meter": ["m"], "kilometer": ["km"], "inch": ["in"],
    "foot": ["ft"], "yard": ["yd"], "mile": ["mi"], "milligram": ["mg"], "gram": ["g"], "kilogram": ["kg"],
    "tonne": ["t", "tonnes"], "ounce": ["oz"], "pound": ["lb", "lbs"], "celsius": ["°C", "C"],
    "fahrenheit": ["°F", "F"], "kelvin": ["K"], "milliliter": ["ml"], "liter": ["l"],
    "us_fluid_ounce": ["fl oz", "fluid ounces"], "us_cup": ["cups"], "us_quart": ["qt", "quarts"],
    "us_gallon": ["gal", "gallons"], "second": ["s"], "minute": ["min"], "hour": ["h"], "day": ["d"], "week": ["wk"],
}  # fmt: skip
# Results outside this range make awkward questions ("how many miles in 3 mm"); redrawn.
RESULT_RANGE = (0.01, 1e7)


def _to_kelvin(value: float, unit: str) -> float:
    if unit == "celsius":
        return value + 273.15
    if unit == "fahrenheit":
        return (value - 32) * 5 / 9 + 273.15
    return value


def _from_kelvin(value: float, unit: str) -> float:
    if unit == "celsius":
        return value - 273.15
    if unit == "fahrenheit":
        return (value - 273.15) * 9 / 5 + 32
    return value


def convert(value: float, from_unit: Unit, to_unit: Unit) -> float:
    """Convert a quantity from one unit to another unit of the same kind (length, mass, temperature, volume or time).

    Args:
        value: The quantity to convert, expressed in from_unit.
        from_unit: The unit the value is given in.
        to_unit: The unit to convert to; must measure the same kind of quantity as from_unit.

    Returns:
        The converted value, rounded to 6 significant digits.
    """
    for label, unit in (("from_unit", from_unit), ("to_unit", to_unit)):
        if unit not in DIMENSION:
            raise ValueError(f"unknown unit {unit!r} for {label}; known units: {', '.join(DIMENSION)}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"value must be a number, got {value!r}")
    dim_from, dim_to = DIMENSION[from_unit], DIMENSION[to_unit]
    if dim_from != dim_to:
        raise ValueError(f"cannot convert {dim_from} ({from_unit}) to {dim_to} ({to_unit})")
    if dim_from == "temperature":
        kelvin = _to_kelvin(value, from_unit)
        if kelvin < 0:
            raise ValueError(f"{value} {from_unit} is below absolute zero")
        result = _from_kelvin(kelvin, to_unit)
    else:
        result = value * FACTORS[dim_from][from_unit] / FACTORS[dim_from][to_unit]
    return tidy_number(float(f"{result:.6g}"))


TOOLBOX = register_toolbox(make_toolbox("units", [convert]))


def _value(rng: random.Random, dim: str, from_unit: str) -> int | float:
    """A quantity as people write it: mostly whole numbers, some with one decimal."""
    if dim == "temperature":
        low, high = {"celsius": (-40, 200), "fahrenheit": (-40, 400), "kelvin": (200, 500)}[from_unit]
        return rng.randint(low, high)
    if rng.random() < 0.7:
        return rng.choice([rng.randint(1, 20), rng.randint(2, 999)])
    return round(rng.uniform(0.5, 500), 1)


def _phrase(rng: random.Random, value: float, from_unit: str, to_unit: str) -> tuple[str, str]:
    v = format_number(value)
    src = NAMES[from_unit][0 if value == 1 else 1]
    dst = NAMES[to_unit][1]
    templates = {
        "convert": f"Convert {v} {src} to {dst}.",
        "how_many": f"How many {dst} are in {v} {src}?",
        "what_is": f"What is {v} {src} in {dst}?",
        "express": f"I have a value of {v} {src}. Express it in {dst}.",
    }
    if DIMENSION[from_unit] == "temperature":
        del templates["how_many"]
        templates["weather"] = f"The thermometer reads {v} {src}. What is that in {dst}?"
    name = rng.choice(sorted(templates))
    return name, templates[name]


def draft(rng: random.Random) -> Draft:
    """One conversion question; the gold answer comes from running `convert`."""
    while True:
        dim = rng.choice(["length", "mass", "temperature", "volume", "time"])
        units = list(TEMPERATURES) if dim == "temperature" else list(FACTORS[dim])
        from_unit, to_unit = rng.sample(units, 2)
        value = _value(rng, dim, from_unit)
        result = convert(value, from_unit, to_unit)
        if dim == "temperature" or RESULT_RANGE[0] <= abs(result) <= RESULT_RANGE[1]:
            break
    template, question = _phrase(rng, value, from_unit, to_unit)
    if dim == "temperature":
        difficulty = 3
    elif (from_unit in METRIC) != (to_unit in METRIC) and dim != "time":
        difficulty = 2
    else:
        difficulty = 1
    call = ToolCall(name="convert", arguments={"value": value, "from_unit": from_unit, "to_unit": to_unit})
    return Draft(
        question=question,
        key=f"{format_number(value)} {from_unit} -> {to_unit}",
        gold=Gold(answer=format_number(result), calls=[call], needs_tool=True),
        metadata={
            "level": difficulty,
            "difficulty": difficulty,
            "n_steps": 1,
            "template": template,
            "dimension": dim,
            "answer_rel_tol": 1e-3,
            "answer_units": [*NAMES[to_unit], *SYMBOLS[to_unit]],
        },
    )


SUITE = Suite(
    name="units",
    description="Unit conversions (length, mass, temperature, volume, time) with one convert tool; answers within 0.1%.",
    toolbox=TOOLBOX,
    draft=draft,
)
