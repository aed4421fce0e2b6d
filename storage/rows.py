"""Small converters from in-memory objects to store column values.

They accept plain dicts or pydantic models (anything with `model_dump`), so `storage/` needs
nothing from `dataengine/`: `verdict_structs(episode_verdicts)` gives the `verdicts` column
value, `to_json(task)` a `*_json` column value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def to_json(value: Any) -> str | None:
    """Canonical JSON (sorted keys, no spaces) for a `*_json` column; None stays None."""
    if value is None:
        return None
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def verdict_struct(verdict: Any) -> dict[str, Any]:
    """One `VERDICT` struct from a Verdict model or dict with name, version, score, passed,
    confidence (default 1.0) and details (dict, stored as details_json)."""
    v = _plain(verdict)
    if not isinstance(v, dict):
        raise TypeError(f"a verdict must be a dict or a pydantic model, not {type(verdict).__name__}")
    missing = [k for k in ("name", "version", "score") if k not in v]
    if missing:
        raise ValueError(f"verdict {v.get('name', '?')!r} lacks {', '.join(missing)}")
    details = v.get("details_json")
    if details is None:
        details = to_json(v.get("details") or {})
    return {
        "name": str(v["name"]),
        "version": str(v["version"]),
        "score": None if v["score"] is None else float(v["score"]),
        "passed": v.get("passed"),
        "confidence": float(v.get("confidence", 1.0)),
        "details_json": details,
    }


def verdict_structs(verdicts: Iterable[Any] | None) -> list[dict[str, Any]]:
    """The `verdicts` column value (list of `VERDICT` structs) of several verdicts."""
    return [verdict_struct(v) for v in verdicts or ()]
