"""What a built-in suite is, and the one loop that turns a suite into train and held-out tasks.

A suite module defines tools (plain typed functions), registers their Toolbox on import, and
exposes `SUITE`: a `Suite` whose `draft(rng)` makes one random candidate task. `generate`
draws candidates from a seeded stream per split and keeps the distinct ones:

- held-out tasks are drawn first, from their own stream, so the held-out set depends only on
  (seed, n_heldout), never on how many train tasks are asked for;
- a candidate is dropped when its question text or its `key` (the suite's notion of "the same
  problem", e.g. the arithmetic expression) was already taken, so the splits are disjoint and no
  question repeats;
- train task i is the same for every n_train > i (a run can grow its train set).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from dataengine.tools.registry import Tool, Toolbox, tool_from_callable
from dataengine.types import Gold, Message, Split, Task

# Consecutive rejected candidates (repeats) after which a suite counts as exhausted.
MAX_REPEATS_IN_A_ROW = 5000


@dataclass(frozen=True)
class Draft:
    """One candidate task before it gets an id and a split.

    question: the user message text.
    key: identity of the underlying problem; two drafts with the same key are the same task.
    gold: the reference solution (answer, calls, needs_tool, end_state_hash).
    metadata: difficulty, n_steps (number of gold calls), kind/template and suite specifics.
    initial_state: per-task tool state for stateful suites, else None.
    offered: names of the tools shown to the model, in toolbox order; None shows all of them.
    """

    question: str
    key: str
    gold: Gold
    metadata: dict[str, Any] = field(default_factory=dict)
    initial_state: dict[str, Any] | None = None
    offered: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Suite:
    """A built-in task suite.

    name: suite name, also the prefix of task ids ("arithmetic-train-000042").
    description: one line for `dataengine suites list`.
    toolbox: the registered Toolbox whose tools the tasks offer and execute.
    draft: makes one random candidate from a `random.Random`; must use only that rng.
    """

    name: str
    description: str
    toolbox: Toolbox
    draft: Callable[[random.Random], Draft]


def make_tool(fn: Callable[..., Any], writes_state: bool = True) -> Tool:
    """`tool_from_callable` without importing torch (`writes_state=False`: a read-only stateful tool).

    transformers' schema code imports torch on every call only to map torch.Tensor to an
    "audio" type, which no built-in tool uses; importing torch would add ~1 s and hundreds of MB
    to every sandbox worker that loads a toolbox, so it is told torch is absent for this call.
    """
    from transformers.utils import chat_template_utils

    real = chat_template_utils.is_torch_available
    chat_template_utils.is_torch_available = lambda: False
    try:
        return tool_from_callable(fn, writes_state=writes_state)
    finally:
        chat_template_utils.is_torch_available = real


def make_toolbox(
    name: str,
    functions: list[Callable[..., Any]],
    make_initial_state: Callable[[Any], dict[str, Any] | None] | None = None,
    read_only: Collection[str] = (),
) -> Toolbox:
    """A Toolbox of `functions` (keyed by function name), schemas derived from their docstrings.

    read_only: names of stateful tools that never change the state (the sandbox then does not
    send the state back after them).
    """
    unknown = set(read_only) - {fn.__name__ for fn in functions}
    if unknown:
        raise ValueError(f"read_only names tools that are not in toolbox {name!r}: {sorted(unknown)}")
    tools = [make_tool(fn, writes_state=fn.__name__ not in read_only) for fn in functions]
    return Toolbox(name=name, tools={t.name: t for t in tools}, make_initial_state=make_initial_state)


def task_id(suite: str, split: Split, index: int) -> str:
    """Stable task id, e.g. ("arithmetic", "train", 42) -> "arithmetic-train-000042"."""
    return f"{suite}-{split}-{index:06d}"


def generate(suite: Suite, n_train: int, n_heldout: int, seed: int = 0) -> list[Task]:
    """`n_train` train tasks then `n_heldout` held-out tasks of `suite`, deterministic in `seed`."""
    for label, n in (("n_train", n_train), ("n_heldout", n_heldout)):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{label} must be a non-negative integer, got {n!r}")
    seen_keys: set[str] = set()
    seen_questions: set[str] = set()
    heldout = _draw(suite, "heldout", n_heldout, seed, seen_keys, seen_questions)
    train = _draw(suite, "train", n_train, seed, seen_keys, seen_questions)
    return train + heldout


def _draw(
    suite: Suite, split: Split, n: int, seed: int, seen_keys: set[str], seen_questions: set[str]
) -> list[Task]:
    # A str seed is hashed with sha512 by random.seed: stable across runs and PYTHONHASHSEED.
    rng = random.Random(f"{suite.name}/{split}/{seed}")
    tools = suite.toolbox.tools
    tasks: list[Task] = []
    repeats = 0
    while len(tasks) < n:
        if repeats >= MAX_REPEATS_IN_A_ROW:
            raise ValueError(
                f"suite {suite.name!r} made only {len(tasks)} distinct {split} tasks of the {n} "
                f"asked (seed {seed}): {repeats} candidates in a row repeated earlier tasks; ask for fewer"
            )
        draft = suite.draft(rng)
        question = " ".join(draft.question.split())
        if draft.key in seen_keys or question in seen_questions:
            repeats += 1
            continue
        repeats = 0
        seen_keys.add(draft.key)
        seen_questions.add(question)
        tasks.append(
            Task(
                id=task_id(suite.name, split, len(tasks)),
                suite=suite.name,
                messages=[Message(role="user", content=draft.question)],
                tools=[t.spec for name, t in tools.items() if draft.offered is None or name in draft.offered],
                toolbox=suite.toolbox.name,
                gold=draft.gold,
                split=split,
                initial_state=draft.initial_state,
                metadata={"seed": seed, **draft.metadata},
            )
        )
    return tasks


def format_number(x: float) -> str:
    """A number as an answer text: integers without ".0", others with up to 6 significant digits."""
    if isinstance(x, bool):
        raise TypeError("expected a number, got a bool")
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    text = f"{x:.6g}"
    if "e" in text:
        text = f"{x:.6f}".rstrip("0").rstrip(".")
    return text


def tidy_number(x: float) -> float | int:
    """A tool's numeric output: ints stay ints, integral floats become ints, others keep 10 decimals."""
    if isinstance(x, int):
        return x
    if not math.isfinite(x):
        raise ValueError(f"result is not a finite number: {x}")
    if float(x).is_integer():
        return int(x)
    return round(x, 10)
