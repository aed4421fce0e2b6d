"""Built-in task suites (arithmetic, units, shop, chains, notool, fncall) and task files.

Importing this package is cheap: a suite module (and its toolbox) is imported only when the
suite is used, so a sandbox worker that needs one toolbox does not build the others.

    from dataengine.suites import generate_suite, gold_turns, save_tasks, load_tasks
    tasks = generate_suite("arithmetic", n_train=1000, n_heldout=200, seed=0)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from dataengine.suites.gold import gold_turns
from dataengine.suites.io import TaskFileError, load_tasks, save_tasks

if TYPE_CHECKING:
    from dataengine.suites.base import Suite
    from dataengine.types import Task

# Suite name -> module that defines `SUITE` (and registers its toolbox on import).
SUITE_MODULES: dict[str, str] = {
    "arithmetic": "dataengine.suites.arithmetic",
    "units": "dataengine.suites.units",
    "shop": "dataengine.suites.shop",
    "chains": "dataengine.suites.chains",
    "notool": "dataengine.suites.notool",
    "fncall": "dataengine.suites.fncall",
}


def get_suite(name: str) -> Suite:
    """The Suite called `name`; a clear error lists the known names."""
    if name not in SUITE_MODULES:
        raise KeyError(f"unknown suite {name!r}; known suites: {', '.join(SUITE_MODULES)}")
    return importlib.import_module(SUITE_MODULES[name]).SUITE


class _Generators(Mapping[str, Callable[..., "list[Task]"]]):
    """Suite name -> generator(n_train, n_heldout, seed=0, *, levels=None), importing the suite
    on first use."""

    def __getitem__(self, name: str) -> Callable[..., list[Task]]:
        suite = get_suite(name)

        def generator(n_train: int, n_heldout: int, seed: int = 0, *, levels: Iterable[int] | None = None) -> list[Task]:
            from dataengine.suites.base import generate

            return generate(suite, n_train, n_heldout, seed, levels=levels)

        generator.__name__ = f"generate_{name}"
        return generator

    def __iter__(self) -> Iterator[str]:
        return iter(SUITE_MODULES)

    def __len__(self) -> int:
        return len(SUITE_MODULES)


SUITES: Mapping[str, Callable[..., list[Task]]] = _Generators()


def list_suites() -> list[str]:
    """Names of the built-in suites."""
    return list(SUITE_MODULES)


def generate_suite(
    name: str, n_train: int, n_heldout: int, seed: int = 0, *, levels: Iterable[int] | None = None
) -> list[Task]:
    """`n_train` train then `n_heldout` held-out tasks of suite `name`, deterministic in `seed`.

    Train and held-out never share a problem or a question text, whatever the sizes and seeds of
    the calls that ask for them. levels: only tasks of these metadata["level"] values (None: all;
    an unknown level is a ValueError), with the ids they have in the all-levels sequence.
    """
    return SUITES[name](n_train, n_heldout, seed, levels=levels)


def suite_levels(name: str) -> tuple[int, ...]:
    """The difficulty levels of suite `name`, easiest first (docs/suites.md says what they mean)."""
    return get_suite(name).levels


__all__ = [
    "SUITES",
    "SUITE_MODULES",
    "TaskFileError",
    "generate_suite",
    "get_suite",
    "gold_turns",
    "list_suites",
    "load_tasks",
    "save_tasks",
    "suite_levels",
]
