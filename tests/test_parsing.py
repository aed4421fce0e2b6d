"""parse_action: never raises, round-trips rendered calls, names what is malformed."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dataengine.parsing import (
    MAX_ARGUMENT_CHARS,
    MAX_REPLY_CHARS,
    parse_action,
    render_action,
    render_tool_calls,
)
from dataengine.types import MAX_ARGUMENT_DEPTH, Action, Message, ToolCall, ToolSpec
from storage.rows import to_json

json_scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
names = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() == s and s != "")
calls = st.builds(ToolCall, name=names, arguments=st.dictionaries(st.text(max_size=10), json_values, max_size=4))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_never_raises_on_any_text(text):
    action = parse_action(text)
    assert isinstance(action, Action)
    # Exactly one of: calls, final answer, parse error.
    assert sum([bool(action.tool_calls), action.final_answer is not None, action.parse_error is not None]) == 1


fragments = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<tool_response>", '{"name": "f", "arguments": {', "}", '"', "{", "Answer:", "\n", "x"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(fragments, max_size=12).map("".join))
def test_never_raises_on_tag_soup(text):
    assert isinstance(parse_action(text), Action)


@settings(max_examples=200, deadline=None)
@given(st.lists(calls, min_size=1, max_size=4))
def test_rendered_calls_parse_back_to_the_same_calls(cs):
    action = parse_action(render_tool_calls(cs))
    assert action.parse_error is None
    assert action.tool_calls == cs


@settings(max_examples=100, deadline=None)
@given(st.lists(calls, min_size=1, max_size=3), st.text(max_size=40).filter(lambda t: "<tool_" not in t and "</tool_" not in t))
def test_render_action_round_trips_thought_and_calls(cs, thought):
    action = parse_action(render_action(Action(text="", thought=thought.strip() or None, tool_calls=cs)))
    assert action.tool_calls == cs and action.thought == (thought.strip() or None)


def test_single_call():
    a = parse_action('<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>')
    assert a.tool_calls == [ToolCall(name="add", arguments={"a": 17, "b": 25})]
    assert a.thought is None and a.final_answer is None and a.parse_error is None and not a.is_final


def test_several_calls_and_a_thought():
    text = 'I will add then multiply.\n<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
    a = parse_action(text)
    assert [c.name for c in a.tool_calls] == ["add", "multiply"]
    assert a.thought == "I will add then multiply."


def test_arguments_as_a_json_string_and_parameters_alias():
    a = parse_action('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>')
    assert a.tool_calls[0].arguments == {"a": 1, "b": 2}
    b = parse_action('<tool_call>{"name": "add", "parameters": {"a": 1}}</tool_call>')
    assert b.tool_calls[0].arguments == {"a": 1}
    c = parse_action('<tool_call>{"name": "now"}</tool_call>')
    assert c.tool_calls == [ToolCall(name="now", arguments={})]


def test_code_fence_inside_the_block_is_accepted():
    a = parse_action('<tool_call>\n```json\n{"name": "add", "arguments": {"a": 1}}\n```\n</tool_call>')
    assert a.tool_calls[0].name == "add"


def test_hallucinated_tool_response_is_dropped():
    text = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n<tool_response>3</tool_response>\nThe answer is 3.'
    a = parse_action(text)
    assert a.tool_calls == [ToolCall(name="add", arguments={"a": 1, "b": 2})]
    assert "<tool_response>" not in a.text and a.text.endswith("</tool_call>")


@pytest.mark.parametrize(
    "text, answer",
    [("42", "42"), ("  Final answer: 42 \n", "42"), ("Answer: Paris", "Paris"), ("**Final Answer:** 7", "7"),
     ("The answer is 5.", "The answer is 5.")],
)
def test_text_without_a_tag_is_a_final_answer(text, answer):
    a = parse_action(text)
    assert a.final_answer == answer and a.is_final and a.parse_error is None


@pytest.mark.parametrize(
    "text, words",
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}', ["unclosed", "<tool_call>"]),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>', ["invalid JSON", "line 1 column", "char"]),
        ('<tool_call>{"arguments": {"a": 1}}</tool_call>', ['no "name"']),
        ('<tool_call>{"name": 3}</tool_call>', ['"name"', "not a non-empty string"]),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', ["arguments", "array", "not an object"]),
        ('<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>', ['"arguments" string', "invalid JSON", "char 1"]),
        ('<tool_call>["add"]</tool_call>', ["item 1 of the array", "string", "expected an object"]),
        ("<tool_call>[]</tool_call>", ["empty JSON array"]),
        ('<tool_call>[{"name": "a"}, {"arguments": {}}]</tool_call>', ["item 2 of the array in tool call 1", 'no "name"']),
        ('<tool_call>7</tool_call>', ["tool call 1 is a JSON number"]),
        ("<tool_call></tool_call>", ["empty tool call"]),
        ("the end </tool_call>", ["without an opening"]),
        ("   ", ["empty reply"]),
        ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b"', ["unclosed", "tool call 2"]),
    ],
)
def test_malformed_replies_name_the_problem(text, words):
    a = parse_action(text)
    assert a.parse_error is not None and not a.tool_calls and a.final_answer is None
    for word in words:
        assert word in a.parse_error, a.parse_error


def test_json_array_of_calls_is_accepted():
    # SmolLM2's fine-tuning format: a list of calls inside one block.
    a = parse_action('<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "neg", "arguments": {"x": 3}}]</tool_call>')
    assert a.parse_error is None
    assert [(c.name, c.arguments) for c in a.tool_calls] == [("add", {"a": 1, "b": 2}), ("neg", {"x": 3})]


def test_deeply_nested_json_is_a_parse_error():
    a = parse_action("<tool_call>" + "[" * 100_000 + "</tool_call>")
    assert a.parse_error == "the JSON in tool call 1 is nested too deeply (arguments may nest at most 32 levels)"


def test_long_replies_parse_in_linear_time():
    text = "x" * 1_000_000 + '<tool_call>{"name": "a"}</tool_call>' * 1000
    assert len(parse_action(text).tool_calls) == 1000


def test_unknown_tool_names_are_not_rejected():
    tools = [ToolSpec(name="add")]
    a = parse_action('<tool_call>{"name": "divide", "arguments": {}}</tool_call>', tools=tools)
    assert a.parse_error is None and a.tool_calls[0].name == "divide"


def test_non_text_input_is_a_parse_error():
    assert parse_action(None).parse_error  # type: ignore[arg-type]


def test_render_is_canonical_hermes():
    text = render_tool_calls([ToolCall(name="add", arguments={"a": 1, "b": 2})])
    assert text == '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert json.loads(text.splitlines()[1]) == {"name": "add", "arguments": {"a": 1, "b": 2}}


def test_render_action_of_answer_and_error():
    assert render_action(parse_action("Final answer: 9")) == "9"
    bad = parse_action("<tool_call>{")
    assert render_action(bad) == bad.text


# ---- limits on untrusted text: linear time, bounded depth and size, finite numbers ----


def _timed_parse(text: str) -> tuple[Action, float]:
    start = time.perf_counter()
    action = parse_action(text)
    return action, time.perf_counter() - start


WS = " \t\n\u00a0"  # runs of mixed whitespace, as SmolLM2's 81-space token makes cheaply


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [2_000, 1_000_000])
@pytest.mark.parametrize(
    "make",
    [
        lambda w: "<tool_call>```" + w + "x</tool_call>",  # the old fence regex: cubic
        lambda w: "<tool_call>```json" + w + "x" + w + "``</tool_call>",
        lambda w: "<tool_call>```" + w + "```" + w + "</tool_call>",
        lambda w: "Answer" + w + "x",  # the old label regex: quadratic
        lambda w: "**Final" + w + "answer" + w + "**" + w + "x",
        lambda w: "answer" + w + "**" + w + ":" + w + "**" + w,
    ],
    ids=["fence", "json-fence", "fence-pair", "answer", "final-answer", "label-colon"],
)
def test_whitespace_runs_parse_in_linear_time(make, size):
    text = make((WS * (size // len(WS) + 1))[:size])
    action, seconds = _timed_parse(text)
    assert seconds < 1.0, f"{seconds:.2f} s for {len(text)} chars"
    assert isinstance(action, Action) and not action.tool_calls


def test_fenced_whitespace_run_is_an_invalid_json_error_not_a_stall():
    action, seconds = _timed_parse("<tool_call>```" + " " * 1_000_000 + "x</tool_call>")
    assert seconds < 1.0 and action.parse_error is not None and "invalid JSON in tool call 1" in action.parse_error


@pytest.mark.parametrize(
    "text, answer",
    [("**Answer**: 3", "3"), ("answer :  **4**", "4**"), ("Final\n\tAnswer：5", "5"), ("FINAL ANSWER:", None),
     ("finalanswer: 6", "finalanswer: 6"), ("Answer 7", "Answer 7"), ("** answer: 8", "** answer: 8")],
)
def test_answer_label_forms(text, answer):
    a = parse_action(text)
    if answer is None:
        assert a.parse_error is not None and "empty reply" in a.parse_error
    else:
        assert a.final_answer == answer


@pytest.mark.parametrize(
    "body, name",
    [("```json\n{\"name\": \"a\"}\n```", "a"), ("```{\"name\": \"b\"}```", "b"), ("``` \n {\"name\": \"c\"} \n ```", "c")],
)
def test_code_fence_forms(body, name):
    assert [c.name for c in parse_action(f"<tool_call>{body}</tool_call>").tool_calls] == [name]


def test_reply_over_the_length_cap_is_a_parse_error():
    at_cap = "y" * MAX_REPLY_CHARS
    assert parse_action(at_cap).final_answer == at_cap
    over = parse_action("y" * (MAX_REPLY_CHARS + 1))
    assert over.parse_error == f"reply is {MAX_REPLY_CHARS + 1} characters long, over the {MAX_REPLY_CHARS}-character limit"
    # The hallucinated tool reply is cut before the cap is applied.
    call = '<tool_call>{"name": "a"}</tool_call>'
    assert parse_action(call + "<tool_response>" + "z" * MAX_REPLY_CHARS).tool_calls == [ToolCall(name="a")]


def _nested(depth: int) -> str:
    """Arguments JSON whose containers nest `depth` levels (the arguments object is level 1)."""
    return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def _call_text(arguments_json: str) -> str:
    return '<tool_call>{"name": "f", "arguments": ' + arguments_json + "}</tool_call>"


def test_arguments_at_the_depth_limit_parse():
    a = parse_action(_call_text(_nested(MAX_ARGUMENT_DEPTH)))
    assert a.parse_error is None and len(a.tool_calls) == 1
    assert a.key().startswith("calls:") and json.loads(to_json(a))["tool_calls"][0]["name"] == "f"


@pytest.mark.parametrize("depth", [MAX_ARGUMENT_DEPTH + 1, 260, 989, 990, 5_000])
def test_over_deep_arguments_are_a_parse_error_naming_the_limit(depth):
    for text in (_call_text(_nested(depth)), _call_text(json.dumps(_nested(depth)))):
        a = parse_action(text)
        assert a.parse_error is not None and not a.tool_calls, a
        assert f"{MAX_ARGUMENT_DEPTH} levels" in a.parse_error
        assert a.key().startswith("error:") and to_json(a)  # storable, keyable


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1E400", "1" * 400 + ".0"])
def test_non_finite_numbers_are_a_parse_error(literal):
    for arguments in ('{"x": ' + literal + "}", json.dumps('{"x": [' + literal + "]}")):
        a = parse_action(_call_text(arguments))
        assert a.parse_error is not None and not a.tool_calls, a
        assert "not a finite number" in a.parse_error and literal[:40] in a.parse_error
        assert "NaN" not in to_json(a.tool_calls) and "Infinity" not in to_json(a.tool_calls)


def test_huge_numbers_and_arguments_are_bounded():
    a = parse_action(_call_text('{"x": ' + "9" * 5_000 + "}"))
    assert a.parse_error is not None and "number that cannot be read" in a.parse_error and "4300" in a.parse_error
    big = parse_action(_call_text(json.dumps({"s": "q" * MAX_ARGUMENT_CHARS})))
    assert big.parse_error is not None and f"{MAX_ARGUMENT_CHARS}-character limit" in big.parse_error
    fits = parse_action(_call_text(json.dumps({"s": "q" * (MAX_ARGUMENT_CHARS - 10)})))
    assert fits.parse_error is None and fits.tool_calls[0].arguments["s"].startswith("q")


def test_tool_call_rejects_unstorable_arguments():
    deep: dict = {"a": []}
    inner = deep["a"]
    for _ in range(MAX_ARGUMENT_DEPTH):
        inner.append([])
        inner = inner[0]
    with pytest.raises(ValidationError, match=f"nest deeper than {MAX_ARGUMENT_DEPTH} levels"):
        ToolCall(name="f", arguments=deep)
    with pytest.raises(ValidationError, match="not a finite number"):
        ToolCall.model_validate({"name": "f", "arguments": {"x": [float("nan")]}})
    with pytest.raises(ValidationError, match="not a finite number"):
        ToolCall(name="f", arguments={"x": {"y": float("-inf")}})
    assert ToolCall(name="f", arguments=json.loads(_nested(MAX_ARGUMENT_DEPTH))).key().startswith('{"arguments"')


def test_parsed_actions_round_trip_through_the_nodes_table(tmp_path):
    """What search stores for a node (dataengine/search/rows.py) writes and reads back for deep,
    NaN and at-the-limit replies: a resume reading the store cannot crash on them."""
    from dataengine.search.rows import messages_dicts
    from storage.store import Store

    texts = [
        _call_text(_nested(MAX_ARGUMENT_DEPTH)),
        _call_text(_nested(989)),
        _call_text('{"x": NaN}'),
        "<tool_call>" + "{" * 100_000 + "</tool_call>",
        "Answer" + " " * 100_000 + "x",
    ]
    actions = [parse_action(t) for t in texts]
    assert [bool(a.tool_calls) for a in actions] == [True, False, False, False, False]
    rows = [
        {
            "task_id": "t", "tree_id": "t", "node_id": n, "depth": 1,
            "action_text": a.text, "action_json": to_json(a), "action_key": a.key(), "parse_error": a.parse_error,
            "messages_json": to_json(messages_dicts([a.to_message()])),
        }
        for n, a in enumerate(actions)
    ]
    store = Store(tmp_path / "store")
    store.append("nodes", rows, run_id="r", shard_id="s")
    back = store.nodes().sort("node_id").collect()
    for action, row in zip(actions, back.iter_rows(named=True), strict=True):
        again = Action.model_validate_json(row["action_json"])
        assert again == action and again.key() == row["action_key"] and row["parse_error"] == action.parse_error
        assert [Message.model_validate(m) for m in json.loads(row["messages_json"])] == [action.to_message()]
