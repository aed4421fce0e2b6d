"""parse_action: never raises, round-trips rendered calls, names what is malformed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataengine.parsing import parse_action, render_action, render_tool_calls
from dataengine.types import Action, ToolCall, ToolSpec

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
        ('<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>', ["arguments", "not valid JSON"]),
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
    assert a.parse_error == "the JSON in tool call 1 is nested too deeply"


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
