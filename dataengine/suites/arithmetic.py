"""Arithmetic suite: multi-digit add/subtract/multiply/divide chains of 1-3 operations.

Numbers are large enough (3-4 digit operands, products up to ~10^8) that a 135M model cannot do
them in its head; each operation is one tool call whose output feeds the next. Every division
in a gold solution is exact (the divisor is drawn among the divisors of the running value), and
no intermediate value is negative, so the gold answer is an integer written as plain digits.

Level (metadata["level"]) = number of operations = number of gold tool calls: 1, 2 or 3.
Problem key: the expression with the operands of a leading + or * in ascending order
("919 + 482" and "482 + 919" are one problem), so both orders land in the same split.
"""

from __future__ import annotations

import random

from dataengine.suites.base import (
    Draft,
    Suite,
    format_number,
    make_toolbox,
    tidy_number,
)
from dataengine.tools.registry import register_toolbox
from dataengine.types import Gold, ToolCall


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        The sum a + b.
    """
    return tidy_number(a + b)


def subtract(a: float, b: float) -> float:
    """Subtract the second number from the first.

    Args:
        a: The number to subtract from.
        b: The number to subtract.

    Returns:
        The difference a - b.
    """
    return tidy_number(a - b)


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.

    Returns:
        The product a * b.
    """
    return tidy_number(a * b)


def divide(a: float, b: float) -> float:
    """Divide the first number by the second.

    Args:
        a: The dividend.
        b: The divisor (must not be zero).

    Returns:
        The quotient a / b (rounded to 10 decimals when it is not a whole number).
    """
    if b == 0:
        raise ZeroDivisionError("cannot divide by zero: argument b must be non-zero")
    return tidy_number(a / b)


TOOLBOX = register_toolbox(make_toolbox("arithmetic", [add, subtract, multiply, divide]))

FUNCTIONS = {"add": add, "subtract": subtract, "multiply": multiply, "divide": divide}
SYMBOL = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}
# How each operation reads in the step-by-step template; {x} is the operand.
STEP_WORDS = {
    "add": "add {x}",
    "subtract": "subtract {x}",
    "multiply": "multiply by {x}",
    "divide": "divide by {x}",
}
# Running values stay below this so products remain readable integers.
MAX_VALUE = 10**9


def _operand(rng: random.Random, op: str, value: int) -> int | None:
    """A second operand for `op` applied to `value`, or None when `op` does not fit `value`."""
    if op == "add":
        return rng.randint(100, 9999)
    if op == "subtract":
        return rng.randint(1, value - 1) if value > 100 else None
    if op == "multiply":
        x = rng.randint(11, 999)
        return x if value * x < MAX_VALUE else None
    divisors = [d for d in range(3, 1000) if value % d == 0 and d not in (10, 100) and value // d > 1]
    return rng.choice(divisors) if divisors else None


def _expression(first: int, steps: list[tuple[str, int]]) -> str:
    """Fully bracketed infix form, e.g. "(482 + 919) * 37"."""
    text = str(first)
    for i, (op, x) in enumerate(steps):
        text = f"{text} {SYMBOL[op]} {x}"
        if i < len(steps) - 1:
            text = f"({text})"
    return text


def _problem_key(first: int, steps: list[tuple[str, int]]) -> str:
    """The expression with a leading commutative operation's operands sorted."""
    op, x = steps[0]
    if op in ("add", "multiply") and x < first:
        first, steps = x, [(op, first), *steps[1:]]
    return _expression(first, steps)


def _phrase(rng: random.Random, first: int, steps: list[tuple[str, int]]) -> tuple[str, str]:
    """(template name, question text) in one of a few natural phrasings."""
    expr = _expression(first, steps)
    templates = ["what_is", "calculate", "steps"]
    if len(steps) == 1:
        templates.append("words")
    name = rng.choice(templates)
    if name == "what_is":
        return name, f"What is {expr}?"
    if name == "calculate":
        return name, f"Calculate {expr} and give me the exact result."
    if name == "steps":
        parts = [STEP_WORDS[op].format(x=x) for op, x in steps]
        said = parts[0] if len(parts) == 1 else ", then ".join(parts)
        return name, f"Start with {first}, {said}. What number do you get?"
    op, x = steps[0]
    words = {
        "add": f"What is the sum of {first} and {x}?",
        "subtract": f"What do you get when you take {x} away from {first}?",
        "multiply": f"What is the product of {first} and {x}?",
        "divide": f"What is {first} divided by {x}?",
    }
    return name, words[op]


def draft(rng: random.Random) -> Draft:
    """One random chain of 1-3 operations with its gold calls computed by running the tools."""
    n_ops = rng.choice([1, 1, 2, 2, 3])
    first = rng.randint(100, 9999)
    value = first
    steps: list[tuple[str, int]] = []
    calls: list[ToolCall] = []
    while len(steps) < n_ops:
        op = rng.choice(["add", "subtract", "multiply", "divide"])
        x = _operand(rng, op, value)
        if x is None:
            continue
        calls.append(ToolCall(name=op, arguments={"a": value, "b": x}))
        value = FUNCTIONS[op](value, x)
        steps.append((op, x))
    template, question = _phrase(rng, first, steps)
    return Draft(
        question=question,
        key=_problem_key(first, steps),
        gold=Gold(answer=format_number(value), calls=calls, needs_tool=True),
        metadata={
            "level": n_ops,
            "difficulty": n_ops,
            "n_steps": n_ops,
            "template": template,
            "expression": _expression(first, steps),
            "answer_rel_tol": 0.0,
        },
    )


SUITE = Suite(
    name="arithmetic",
    description="Multi-digit add/subtract/multiply/divide chains (1-3 dependent tool calls); exact integer answers.",
    toolbox=TOOLBOX,
    draft=draft,
)
