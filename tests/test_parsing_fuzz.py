"""Adversarial fuzzing of parse_action: never raises, always one Action, bounded time,
and the string-operation label/fence handling matches the old regexes on short inputs."""

from __future__ import annotations

import json
import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from dataengine.parsing import _unfence, parse_action
from dataengine.types import Action, argument_problem
from storage.rows import to_json

MAX_SECONDS = 2.0  # CPU seconds of this thread; the cubic parser took 50 s on 4k spaces, linear takes ~0.06 s

# Pieces a model can emit cheaply, each repeated up to thousands of times (SmolLM2 has an
# 81-space token): whitespace runs, fences, tags, brackets, labels, odd numbers, unicode.
PIECES = [
    " ", " " * 81, "\t", "\n", "\r\n", "\u00a0", "\u2028", "\u3000", "```", "```json", "`",
    "<tool_call>", "</tool_call>", "<tool_response>", "<tool_", "[", "]", "{", "}", "[{", "}]",
    '{"name": "f", "arguments": ', '{"name": "f", "arguments": "', '"', '\\"', "\\", "\\u00", ":", ",",
    "NaN", "Infinity", "-Infinity", "1e999", "-1E400", "9" * 50, "1.5", "0", "true", "null",
    "Answer", "answer", "Final", "final answer", "FINAL ANSWER", "**", "：", "İ", "ſ", "é", "😀", "\x00", "x",
]
segments = st.tuples(
    st.sampled_from(PIECES),
    st.one_of(st.integers(1, 3), st.integers(1, 200), st.integers(1, 5_000)),
).map(lambda p: p[0] * p[1])
soup = st.lists(segments, max_size=10).map("".join)


def _nested(depth: int, leaf: str) -> str:
    return "[" * depth + leaf + "]" * depth


structured = st.builds(
    lambda depth, leaf, wrap, fence, tail: wrap.format(
        fence[0] + '{"name": "f", "arguments": {"a": ' + _nested(depth, leaf) + "}}" + fence[1]
    ) + tail,
    st.one_of(st.integers(0, 40), st.integers(0, 3_000)),
    st.sampled_from(["1", "NaN", "-Infinity", "1e999", "9" * 5_000, '"s"', "{}", "{" * 100, "", "1,"]),
    st.sampled_from(["<tool_call>{}</tool_call>", "<tool_call>[{}]</tool_call>", "<tool_call>{}", "x {} y"]),
    st.sampled_from([("", ""), ("```json\n", "\n```"), ("```", "``"), ("``` " * 50, " ```" * 50)]),
    st.sampled_from(["", "<tool_response>", "</tool_call>", "<tool_call>", " " * 4_000]),
)

worst = {"seconds": 0.0, "chars": 0}


@settings(max_examples=10_000, deadline=None)
@given(st.one_of(soup, structured, st.text(max_size=200)))
def test_parse_action_never_raises_and_is_fast(text):
    start = time.thread_time()
    action = parse_action(text)
    seconds = time.thread_time() - start
    if seconds > worst["seconds"]:
        worst.update(seconds=seconds, chars=len(text))
    assert seconds < MAX_SECONDS, f"{seconds:.3f} s for {len(text)} chars"
    assert isinstance(action, Action)
    assert sum([bool(action.tool_calls), action.final_answer is not None, action.parse_error is not None]) == 1
    # Whatever parses is storable: finite, bounded depth, keyable, serialisable as standard JSON.
    for call in action.tool_calls:
        assert argument_problem(call.arguments) is None
    assert isinstance(action.key(), str)
    json.loads(to_json(action), parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(c)))


# The patterns parsing.py used before its linear-time rewrite: exact but backtracking, so oracles on short input only.
OLD_LABEL = re.compile(r"^\s*(?:\*\*)?(?:final\s+answer|answer)\s*(?:\*\*)?\s*[:：]\s*(?:\*\*)?", re.IGNORECASE)
OLD_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)

label_bits = st.lists(
    st.sampled_from(["final", "answer", "FINAL", "Answer", "fİnal", "fınal", "anſwer", " ", "\t", "\n", "\u00a0",
                     "\u2028", "**", "*", ":", "：", "x", "7"]),
    max_size=10,
).map("".join)
fence_bits = st.lists(
    st.sampled_from(["```", "`", "``", "json", "JSON", "js", " ", "\n", "\u00a0", "{}", "x", "\\"]), max_size=10
).map("".join)


@settings(max_examples=1_000, deadline=None)
@given(label_bits)
def test_answer_label_matches_the_old_regex(text):
    old = OLD_LABEL.sub("", text.strip(), count=1).strip()
    action = parse_action(text)
    assert action.final_answer == (old or None)


@settings(max_examples=1_000, deadline=None)
@given(fence_bits)
def test_unfence_matches_the_old_regex(body):
    body = body.strip()
    fenced = OLD_FENCE.match(body)
    assert _unfence(body) == (fenced.group(1) if fenced else body)
