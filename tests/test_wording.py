"""Tracked files date their content by date, commit and command, not by work periods or tracker
numbers: every line of every tracked text file is matched against PATTERNS, and the test fails
naming file:line for each hit."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

# One alternative per way of dating by process instead of by date/commit/command. "session" alone
# stays allowed (MCP, HTTP, Prefect and process sessions); only a numbered one is refused.
PATTERNS = re.compile(
    # The bracketed letters keep these lines from matching themselves in other checkers.
    r"sess[i]ons? ?[0-9]"         # a numbered work period, singular or plural
    r"|iss[u]es? ?#?[0-9]"        # a numbered tracker item, with or without '#'
    r"|sess[i]on-[0-9]"           # the same, hyphenated
    r"|#[0-9]{1,3}\b"             # "#15" as a tracker reference
    r"|closing note"
    r"|the team's",
    re.IGNORECASE,
)


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}); nothing to list")
    return [p for p in out.stdout.decode().split("\0") if p and p != SELF]


def hits(paths: list[str]) -> list[str]:
    """`file:line: text` for every line matching PATTERNS in the given tracked text files."""
    found = []
    for rel in paths:
        path = ROOT / rel
        if not path.is_file():  # deleted in the work tree, or a submodule
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # binary files (images, parquet) hold no prose
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if PATTERNS.search(line):
                found.append(f"{rel}:{number}: {line.strip()[:120]}")
    return found


def test_the_patterns_catch_what_they_are_for():
    # Built from pieces so that this file's own lines stay clean for other line checkers.
    period, item = "sess" + "ion", "iss" + "ue"
    for line in [f"({period} 30)", f"{period}s 19-23", f"{item} 15's target", f"{item.title()} #7",
                 f"the {period}-26 row", "see #12", f"{period.title()} 34 closing note", "the team's numbered"]:
        assert PATTERNS.search(line), line
    for line in ["an MCP session", "ClientSession()", "order #W8417589", "2026-11-30, commit 9e23c00",
                 "a Prefect session of its own"]:
        assert not PATTERNS.search(line), line


def test_no_tracked_file_dates_content_by_work_periods_or_tracker_numbers():
    found = hits(tracked_files())
    assert not found, (f"{len(found)} line(s) date content by work period or tracker number; write a "
                       "date (YYYY-MM-DD), commit and command, or say what the thing does:\n" + "\n".join(found))
