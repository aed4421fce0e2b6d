"""Why an episode failed, read from its stored messages (the report's "Why episodes fail" table,
docs/scripts/call_failures.py).

The first tool turn decides: what the environment said about the episode's first call (or that
there was none) is where a weak policy goes wrong, and later turns mostly repeat it. Kinds:

- success;
- no call: no assistant turn holds a parsed tool call (plain answers, empty replies);
- call cut off (unclosed tag): no parsed call, and a call's closing tag fell past the token limit;
- empty reply: the first assistant turn was empty, a later one called a tool;
- unknown tool: the first call names a tool the task does not offer;
- call missing a required argument / argument outside the enum / unexpected argument: the first
  call failed its tool's JSON schema that way;
- tool raised: the tool ran and raised (an unknown id, an order that already shipped);
- call ran, then wrong: the first call ran; the episode still ended without success;
- other error: any other first tool error (its first 50 characters).
"""

from __future__ import annotations

import json
from typing import Any

# First-tool-turn text -> kind, checked in order (ToolEnv's and the sandbox's error messages).
ERROR_KINDS = (
    ("is a required property", "call missing a required argument"),
    ("is not one of", "argument outside the enum"),
    ("empty reply", "empty reply"),
    ("unknown_tool:", "unknown tool"),
    ("unexpected argument", "unexpected argument"),
    ("Error: exception:", "tool raised"),
)


def failure_kind(messages: list[dict[str, Any]], success: bool = False) -> str:
    """The kind of an episode from its chat messages (role/content/tool_calls dicts)."""
    if success:
        return "success"
    calls = [c for m in messages if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
    tools = [m.get("content") or "" for m in messages if m["role"] == "tool"]
    if not calls:
        # A call whose closing tag fell past the token limit parses as no call.
        return "call cut off (unclosed tag)" if any("unclosed <tool_call>" in t for t in tools) else "no call"
    first = tools[0] if tools else ""
    for text, kind in ERROR_KINDS:
        if text in first:
            return kind
    return "call ran, then wrong" if not first.startswith("Error") else f"other error: {first[:50]}"


def failure_kinds(trajectories: Any) -> Any:
    """Episodes per run, suite and kind: a Polars frame (run_id, suite, kind, episodes, share of
    the run's episodes in that suite), from a trajectories frame with messages_json and success."""
    import polars as pl

    frame = trajectories.select("run_id", "suite", "success", "messages_json")
    kinds = [failure_kind(json.loads(m), bool(s)) for m, s in zip(frame["messages_json"], frame["success"])]
    return (
        frame.with_columns(kind=pl.Series(kinds, dtype=pl.String))
        .group_by("run_id", "suite", "kind").agg(episodes=pl.len())
        .with_columns(share=pl.col("episodes") / pl.col("episodes").sum().over("run_id", "suite"))
        .sort(["run_id", "suite", "episodes", "kind"], descending=[False, False, True, False])
    )
