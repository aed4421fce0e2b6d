"""What a built-in suite is, and the one loop that turns a suite into train and held-out tasks.

A suite module defines tools (plain typed functions), registers their Toolbox on import, and
exposes `SUITE`: a `Suite` whose `draft(rng)` makes one random candidate task. `generate`
draws candidates from a seeded stream per split and keeps the distinct ones:

- every problem belongs to one split for good: `split_of` hashes the draft's `split_key` (the
  suite's notion of "the same problem", e.g. the normalised arithmetic expression) into 10
  buckets, 2 of them held-out, independent of the seed. A split's stream drops candidates of the
  other split, so train and held-out never share a problem or a question text, however and with
  whatever seeds and sizes the two are asked for (each suite makes `split_key` equal whenever
  `key` or the question text is equal);
- within a split, a candidate is dropped when its question text or its `key` was already taken;
- task i of a split depends only on (suite, split, seed, i): the held-out set never depends on
  the train size, and a run can grow its train set;
- `levels` keeps the tasks of some difficulty levels (metadata["level"]) and their ids: the
  result is exactly the matching tasks of the all-levels sequence.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dataengine.tools.registry import Tool, Toolbox, tool_from_callable
from dataengine.types import Gold, Message, Split, Task

# Consecutive rejected candidates (repeats, other split) after which a split counts as exhausted.
MAX_REPEATS_IN_A_ROW = 5000
# split_of: a problem is held-out when its hash falls in the first HELDOUT_BUCKETS of N_BUCKETS.
N_BUCKETS = 10
HELDOUT_BUCKETS = 2


@dataclass(frozen=True)
class Draft:
    """One candidate task before it gets an id and a split.

    question: the user message text.
    key: identity of the underlying problem; two drafts with the same key are the same task.
    gold: the reference solution (answer, calls, needs_tool, end_state_hash).
    metadata: level (in the suite's `levels`), difficulty, n_steps (number of gold calls),
        kind/template and suite specifics.
    initial_state: per-task tool state for stateful suites, else None.
    offered: names of the tools shown to the model, in toolbox order; None shows all of them.
    split_key: what decides the split (`split_of`); None means `key`. Must be equal for two
        drafts whose `key` or whose question text is equal, so that neither crosses splits.
    """

    question: str
    key: str
    gold: Gold
    metadata: dict[str, Any] = field(default_factory=dict)
    initial_state: dict[str, Any] | None = None
    offered: tuple[str, ...] | None = None
    split_key: str | None = None


@dataclass(frozen=True)
class Suite:
    """A built-in task suite.

    name: suite name, also the prefix of task ids ("arithmetic-train-000042").
    description: one line for `dataengine suites list`.
    toolbox: the registered Toolbox whose tools the tasks offer and execute.
    draft: makes one random candidate from a `random.Random`; must use only that rng.
    levels: the difficulty levels its drafts carry in metadata["level"], easiest first.
    """

    name: str
    description: str
    toolbox: Toolbox
    draft: Callable[[random.Random], Draft]
    levels: tuple[int, ...] = (1, 2, 3)


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


def split_of(suite: str, split_key: str) -> Split:
    """The one split a problem of `suite` may appear in: a seed-independent hash partition
    (HELDOUT_BUCKETS of N_BUCKETS buckets, about 20%, are held-out)."""
    digest = hashlib.blake2b(f"{suite}\n{split_key}".encode(), digest_size=8).digest()
    return "heldout" if int.from_bytes(digest, "big") % N_BUCKETS < HELDOUT_BUCKETS else "train"


def check_levels(suite: Suite, levels: Iterable[int] | None) -> frozenset[int]:
    """`levels` as a set (None: all of the suite's levels); ValueError for an unknown level or an
    empty list, TypeError for a non-list."""
    if levels is None:
        return frozenset(suite.levels)
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Iterable):
        raise TypeError(f"levels must be a list of integers, got {levels!r}")
    wanted = list(levels)
    known = ", ".join(map(str, suite.levels))
    for level in wanted:
        if isinstance(level, bool) or not isinstance(level, int) or level not in suite.levels:
            raise ValueError(f"unknown level {level!r} for suite {suite.name!r}; its levels are {known}")
    if not wanted:
        raise ValueError(f"levels is empty; suite {suite.name!r} has levels {known}")
    return frozenset(wanted)


def generate(
    suite: Suite, n_train: int, n_heldout: int, seed: int = 0, *, levels: Iterable[int] | None = None
) -> list[Task]:
    """`n_train` train tasks then `n_heldout` held-out tasks of `suite`, deterministic in `seed`.

    levels: keep only tasks whose metadata["level"] is one of these (None: all levels); the tasks
    kept are those of the all-levels sequence, ids included, so ids may skip numbers.
    """
    for label, n in (("n_train", n_train), ("n_heldout", n_heldout)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{label} must be a non-negative integer, got {n!r}")
    wanted = check_levels(suite, levels)
    heldout = _draw(suite, "heldout", n_heldout, seed, wanted)
    train = _draw(suite, "train", n_train, seed, wanted)
    return train + heldout


def split_drafts(suite: Suite, split: Split, seed: int) -> Iterator[Draft]:
    """The distinct drafts of `split` in order, all levels: the sequence task ids number.

    Candidates come from one stream per (suite, split, seed); those of the other split
    (`split_of`) or whose key or question text was already taken are skipped. Ends when
    MAX_REPEATS_IN_A_ROW candidates in a row were skipped (the split is exhausted).
    """
    # A str seed is hashed with sha512 by random.seed: stable across runs and PYTHONHASHSEED.
    rng = random.Random(f"{suite.name}/{split}/{seed}")
    seen_keys: set[str] = set()
    seen_questions: set[str] = set()
    repeats = 0
    while repeats < MAX_REPEATS_IN_A_ROW:
        draft = suite.draft(rng)
        question = " ".join(draft.question.split())
        split_key = draft.key if draft.split_key is None else draft.split_key
        if split_of(suite.name, split_key) != split or draft.key in seen_keys or question in seen_questions:
            repeats += 1
            continue
        repeats = 0
        seen_keys.add(draft.key)
        seen_questions.add(question)
        if draft.metadata.get("level") not in suite.levels:
            raise ValueError(
                f"suite {suite.name!r} drafted a task with level {draft.metadata.get('level')!r}, not one of {suite.levels}"
            )
        yield draft


def _draw(suite: Suite, split: Split, n: int, seed: int, levels: frozenset[int]) -> list[Task]:
    tools = suite.toolbox.tools
    tasks: list[Task] = []
    if n == 0:
        return tasks
    for index, draft in enumerate(split_drafts(suite, split, seed)):
        if draft.metadata["level"] not in levels:
            continue
        tasks.append(
            Task(
                id=task_id(suite.name, split, index),
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
        if len(tasks) == n:
            return tasks
    which = "" if levels == frozenset(suite.levels) else f" of level {', '.join(map(str, sorted(levels)))}"
    raise ValueError(
        f"suite {suite.name!r} made only {len(tasks)} distinct {split} tasks{which} of the {n} asked "
        f"(seed {seed}): {MAX_REPEATS_IN_A_ROW} candidates in a row repeated earlier tasks or belong "
        f"to the other split; ask for fewer"
    )


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
