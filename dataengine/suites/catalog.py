"""Every suite name the engine accepts, resolved in one place: the built-in suites
(`SUITE_MODULES`) and the external benchmark sets `bfcl:<category>` and `tau2:<domain>`.

    from dataengine.suites.catalog import suite_tasks
    tasks = suite_tasks("bfcl:simple_python", 50)          # the first 50 BFCL entries
    tasks = suite_tasks("arithmetic", 50, split="train")   # generate_suite's train stream

The external sets are eval-only: they have no train split, every task has split "heldout" and
metadata["eval_only"] = True, `suite_tasks(..., split="train")` refuses them (generate searches
them only when asked for `--split heldout`), and `eval_only_items()` lists all of them for
decontamination. Their tasks come in the benchmark's own order (the seed does not draw them):
the first n of a BFCL category's file, the first n of a tau2 domain's tasks.json.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from dataengine.types import Task

EXTERNAL = ("bfcl", "tau2")


def _built_in() -> list[str]:
    from dataengine.suites import SUITE_MODULES

    return list(SUITE_MODULES)


def known_forms() -> str:
    """The accepted suite names, in one line: the built-in names, then the external forms."""
    from dataengine.external.bfcl.tasks import CATEGORIES
    from dataengine.external.tau2.db import DOMAINS

    return (f"{', '.join(_built_in())}, bfcl:<category> ({', '.join(CATEGORIES)}), "
            f"tau2:<domain> ({', '.join(DOMAINS)})")


def check_suite_name(name: str) -> str:
    """`name` if the engine knows it (no data is read), else ValueError listing the known forms.
    A BFCL alias (bfcl:simple) is accepted and returned canonical (bfcl:simple_python)."""
    from dataengine.external.bfcl.tasks import ALIASES, CATEGORIES
    from dataengine.external.tau2.db import DOMAINS

    if not isinstance(name, str):
        raise ValueError(f"a suite name must be a string, got {name!r}")
    if name in _built_in():
        return name
    prefix, colon, rest = name.partition(":")
    if colon and prefix == "bfcl" and ALIASES.get(rest, rest) in CATEGORIES:
        return f"bfcl:{ALIASES.get(rest, rest)}"
    if colon and prefix == "tau2" and rest in DOMAINS:
        return name
    raise ValueError(f"unknown suite {name!r}; known: {known_forms()}")


def is_eval_only(name: str) -> bool:
    """Whether suite `name` is an evaluation set (BFCL, tau2): no train split, never training data."""
    return name.partition(":")[0] in EXTERNAL and ":" in name


def bfcl_category(name: str) -> str | None:
    """The BFCL category of suite `name` (bfcl:<category>), or None for any other suite."""
    name = check_suite_name(name)
    return name.split(":", 1)[1] if name.startswith("bfcl:") else None


def suite_tasks(
    name: str,
    n: int,
    *,
    split: Literal["train", "heldout"] = "heldout",
    seed: int = 0,
    levels: Iterable[int] | None = None,
    user: Literal["scenario", "simulated"] = "scenario",
) -> list[Task]:
    """`n` tasks of suite `name` of `split`.

    Built-in suites: `generate_suite` (seeded, levels as there). External sets: the first `n`
    of the benchmark (split must be "heldout"; seed and levels do not apply, levels is refused).
    user: tau2's opening ("scenario": the whole user scenario as the first message; "simulated":
    the agent's greeting, for a user simulator to answer; dataengine.external.tau2.load_tasks).
    """
    from dataengine.suites import generate_suite

    name = check_suite_name(name)
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if not is_eval_only(name):
        counts = (n, 0) if split == "train" else (0, n)
        return generate_suite(name, *counts, seed=seed, **({"levels": list(levels)} if levels else {}))
    if split == "train":
        raise ValueError(f"suite {name!r} is eval-only (an evaluation benchmark, it has no train split): evaluate "
                         "it with `dataengine eval`, or search its tasks with split heldout (--split heldout)")
    if levels:
        raise ValueError(f"suite {name!r} has no difficulty levels; leave levels unset for it")
    prefix, rest = name.split(":", 1)
    if prefix == "bfcl":
        from dataengine.external.bfcl import load_tasks as load_bfcl

        return load_bfcl(rest, limit=n)
    from dataengine.external.tau2 import load_tasks as load_tau2

    return load_tau2(rest, limit=n, user=user)


@functools.cache
def _eval_only_items() -> tuple[Task, ...]:
    from dataengine.external.bfcl.tasks import CATEGORIES
    from dataengine.external.bfcl.tasks import load_tasks as load_bfcl
    from dataengine.external.tau2 import DOMAINS
    from dataengine.external.tau2 import load_tasks as load_tau2

    items: list[Task] = []
    for category in CATEGORIES:
        items += load_bfcl(category)
    for domain in DOMAINS:
        items += load_tau2(domain, policy=False)
    return tuple(items)


def eval_only_items() -> list[Task]:
    """Every task of every eval-only set: each BFCL category, then tau2's domains (with the user
    scenario as the first user message, no policy system message). Loaded once per process
    (cached). The built-in suites' held-out splits are not listed: they are hash partitions of
    each suite's problem keys, which no train task can fall in (docs/suites.md)."""
    return list(_eval_only_items())
