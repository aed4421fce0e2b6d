"""Rule verifiers, composite reward and cascade on hand-built episodes (no external packages)."""

from __future__ import annotations

import pytest

from dataengine.types import (
    Action,
    Episode,
    Gold,
    Message,
    Step,
    Task,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from dataengine.verifiers import (
    ArgumentsVerifier,
    Cascade,
    CompositeReward,
    EfficiencyVerifier,
    EndStateVerifier,
    ExecutionVerifier,
    FinalAnswerVerifier,
    FormatVerifier,
    LengthVerifier,
    NumericArgumentsVerifier,
    RewardWeights,
    WhenVerifier,
    WhichVerifier,
    axes,
    check_call,
    default_verifiers,
    match_answer,
    standardize_string,
    verdict,
)

ADD = ToolSpec(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
UNIT = ToolSpec(
    name="convert",
    parameters={
        "type": "object",
        "properties": {
            "value": {"type": "number"},
            "unit": {"type": "string", "enum": ["km", "mi"]},
            "round": {"type": "boolean"},
        },
        "required": ["value", "unit"],
    },
)


def make_task(**gold) -> Task:
    return Task(
        id="t-add",
        suite="arithmetic",
        messages=[Message(role="user", content="What is 17 plus 25?")],
        tools=[ADD, UNIT],
        toolbox="arithmetic",
        gold=Gold(**gold),
    )


def call_step(*calls: ToolCall, status: str = "ok") -> Step:
    return Step(
        action=Action(text="<tool_call>...</tool_call>", tool_calls=list(calls)),
        results=[ToolResult(call=c, status=status, output=42 if status == "ok" else None, error=None if status == "ok" else "boom") for c in calls],
    )


def answer_step(text: str) -> Step:
    return Step(action=Action(text=text, final_answer=text))


def bad_step(text: str = "<tool_call>{oops") -> Step:
    return Step(action=Action(text=text, parse_error="invalid JSON in <tool_call>"))


GOLD_CALL = ToolCall(name="add", arguments={"a": 17, "b": 25})
TASK = make_task(answer="42", calls=[GOLD_CALL])
GOOD = Episode(task=TASK, steps=[call_step(GOLD_CALL), answer_step("The answer is 42.")], done=True)


def test_gold_episode_passes_every_verifier():
    verdicts = [v.verify(GOOD) for v in default_verifiers(TASK)]
    assert {v.name for v in verdicts} >= {"format", "which", "when", "execution", "arguments", "final_answer"}
    assert all(v.passed for v in verdicts), [v for v in verdicts if not v.passed]
    result = CompositeReward().score(GOOD)
    assert result.success and result.reward == pytest.approx(1.15)
    assert axes(result.verdicts) == {"when": True, "which": True, "how": True, "final": True}


def test_format_catches_parse_errors_and_schema_violations():
    v = FormatVerifier()
    assert v.verify_step(TASK, bad_step()).passed is False
    wrong_type = call_step(ToolCall(name="add", arguments={"a": "17", "b": 25}))
    out = v.verify_step(TASK, wrong_type)
    assert out.passed is False and "a: '17' is not of type 'integer'" in out.details["errors"][0]
    missing = call_step(ToolCall(name="add", arguments={"a": 17}))
    assert "'b' is a required property" in v.verify_step(TASK, missing).details["errors"][0]
    bad_enum = call_step(ToolCall(name="convert", arguments={"value": 3, "unit": "furlong"}))
    assert v.verify_step(TASK, bad_enum).passed is False
    ep = Episode(task=TASK, steps=[bad_step(), call_step(GOLD_CALL)])
    whole = v.verify(ep)
    assert whole.passed is False and whole.score == 0.5 and whole.details["bad_steps"] == 1


def test_which_when_execution():
    wrong_tool = Episode(task=TASK, steps=[call_step(ToolCall(name="convert", arguments={"value": 1, "unit": "km"}))])
    assert WhichVerifier().verify(wrong_tool).details["off_gold"] == ["convert"]
    unknown = Episode(task=TASK, steps=[call_step(ToolCall(name="divide", arguments={}))])
    assert WhichVerifier().verify(unknown).details["unknown"] == ["divide"]
    no_call = Episode(task=TASK, steps=[answer_step("42")])
    assert WhichVerifier().verify(no_call).passed is None
    assert WhenVerifier().verify(no_call).passed is False
    notool = make_task(answer="Paris", needs_tool=False)
    assert WhenVerifier().verify(Episode(task=notool, steps=[answer_step("Paris")])).passed is True
    assert WhenVerifier().verify(Episode(task=notool, steps=[call_step(GOLD_CALL)])).passed is False
    failed = Episode(task=TASK, steps=[call_step(GOLD_CALL, status="timeout")])
    out = ExecutionVerifier().verify(failed)
    assert out.passed is False and out.details["failures"][0]["status"] == "timeout"


@pytest.mark.parametrize(
    "pred,gold,how",
    [
        ("42", "42", "exact"),
        ("The answer is 42.", "42", "exact"),
        ("**Answer:** 42", "42", "exact"),
        ("42.0000001", "42", "numeric"),
        ("1,234.5", "1234.5", "numeric"),
        ("1,234.5 km", "1234.5", "mentioned"),  # units only where the task lists them
        ("17 + 25 = 42", "42", "mentioned"),
        ("17 + 25 = 43", "42", "miss_numeric"),
        ("It is Paris, France.", "paris", "mentioned"),
        ("Parisian food", "paris", "miss"),
        ("  PARIS. ", "Paris", "exact"),
    ],
)
def test_match_answer(pred, gold, how):
    assert match_answer(pred, gold) == how


def test_final_answer_confidence_and_missing_answer():
    v = FinalAnswerVerifier()
    mentioned = v.verify(Episode(task=make_task(answer="Paris"), steps=[answer_step("I think it is Paris.")]))
    assert mentioned.passed is False and mentioned.confidence < 0.8 and mentioned.details["match"] == "mentioned"
    assert mentioned.version == "2"
    none = v.verify(Episode(task=TASK, steps=[call_step(GOLD_CALL)]))
    assert none.passed is False
    assert v.verify(Episode(task=make_task(), steps=[])).passed is None


def test_standardize_string_matches_bfcl():
    assert standardize_string("April 1, 2024") == standardize_string("april 1 2024") == "april12024"
    assert standardize_string("New-York_City") == "newyorkcity"
    assert standardize_string("it's") == 'it"s'


def test_check_call_bfcl_semantics():
    params = UNIT.parameters
    acc = {"value": [3.0], "unit": ["km"], "round": ["", False]}
    ok = ToolCall(name="convert", arguments={"value": 3, "unit": "KM"})  # int for float; case-insensitive
    assert check_call(params, ok, "convert", acc).valid
    assert check_call(params, ToolCall(name="convert", arguments={"value": 3, "unit": "km", "round": False}), "convert", acc).valid
    cases = {
        "wrong_func_name": ToolCall(name="add", arguments={"value": 3, "unit": "km"}),
        "missing_required": ToolCall(name="convert", arguments={"value": 3}),
        "unexpected_param": ToolCall(name="convert", arguments={"value": 3, "unit": "km", "digits": 2}),
        "type_error:simple": ToolCall(name="convert", arguments={"value": "3", "unit": "km"}),
        "value_error:string": ToolCall(name="convert", arguments={"value": 3, "unit": "mi"}),
        "value_error:others": ToolCall(name="convert", arguments={"value": 3.5, "unit": "km"}),
    }
    for kind, call in cases.items():
        result = check_call(params, call, "convert", acc)
        assert not result.valid and result.error_type.endswith(kind), (kind, result)
    # a bool is not an integer even though True == 1 in Python
    assert not check_call(ADD.parameters, ToolCall(name="add", arguments={"a": True, "b": 25}), "add", {"a": [1], "b": [25]}).valid
    # an acceptable-but-absent optional parameter needs "" in its list
    strict = {"value": [3.0], "unit": ["km"], "round": [True]}
    assert check_call(params, ok, "convert", strict).error_type.endswith("missing_optional")


def test_arguments_parallel_unordered_and_counts():
    c1 = ToolCall(name="add", arguments={"a": 1, "b": 2})
    c2 = ToolCall(name="add", arguments={"a": 3, "b": 4})
    task = make_task(calls=[c1, c2])
    v = ArgumentsVerifier()
    assert v.verify(Episode(task=task, steps=[call_step(c2, c1)])).passed
    extra = v.verify(Episode(task=task, steps=[call_step(c2, c1, c1)]))
    assert not extra.passed and extra.details["error_type"] == "wrong_count" and extra.score == pytest.approx(2 / 3)
    changed = v.verify(Episode(task=task, steps=[call_step(c1, ToolCall(name="add", arguments={"a": 3, "b": 5}))]))
    assert not changed.passed and changed.details["matched"] == 1


def test_numeric_arguments_graded_and_bounded():
    v = NumericArgumentsVerifier()
    near = Episode(task=TASK, steps=[call_step(ToolCall(name="add", arguments={"a": 17, "b": 24}))])
    far = Episode(task=TASK, steps=[call_step(ToolCall(name="add", arguments={"a": 1, "b": 24}))])
    huge = Episode(task=TASK, steps=[call_step(ToolCall(name="add", arguments={"a": -1e12, "b": 24}))])
    assert v.verify(GOOD).score == 1.0 and v.verify(GOOD).passed
    # per argument 1 / (1 + |pred - gold| / max(1, |gold|)), averaged over a and b
    assert v.verify(near).score == pytest.approx((1 + 25 / 26) / 2) and not v.verify(near).passed
    assert v.verify(far).score == pytest.approx((17 / 33 + 25 / 26) / 2)
    assert v.verify(near).details["distance"] == 1.0 and v.verify(far).details["distance"] == 17.0
    out = v.verify(huge)
    assert 0.0 < out.score < 0.5 and out.details["distance"] == pytest.approx(1e12 + 18)
    missing = Episode(task=TASK, steps=[answer_step("42")])
    assert v.verify(missing).score == 0.0
    assert v.verify(missing).details["distance"] == 17 + 25 + 1  # every |gold| value, plus 1 for the missing call
    wrong_type = Episode(task=TASK, steps=[call_step(ToolCall(name="add", arguments={"a": "17", "b": 25}))])
    assert v.verify(wrong_type).score == pytest.approx(0.5)


def test_every_rule_verifier_score_is_in_unit_interval():
    from dataengine.verifiers import MultiTurnVerifier, rule_verifiers
    from dataengine.verifiers.tau2 import Tau2Verifier

    calls = [ToolCall(name="add", arguments={"a": a, "b": b}) for a, b in ((17, 25), (-1e15, 3), (0, 0), (1e300, -1e300))]
    steps = [call_step(c) for c in calls] + [call_step(calls[0], status="timeout"), bad_step(), answer_step("x" * 3000),
                                             answer_step("42"), answer_step("-9e99"), call_step(ToolCall(name="nope", arguments={}))]
    tasks = [TASK, make_task(answer="42", needs_tool=False), make_task(calls=[GOLD_CALL, GOLD_CALL])]
    episodes = [Episode(task=t, steps=[]) for t in tasks]
    episodes += [Episode(task=t, steps=[s]) for t in tasks for s in steps]
    episodes += [Episode(task=t, steps=steps[i:i + 3]) for t in tasks for i in range(len(steps))]
    assert any(isinstance(v, (MultiTurnVerifier, Tau2Verifier)) for v in rule_verifiers())
    for v in rule_verifiers():
        for ep in episodes:
            out = v.verify(ep)
            assert 0.0 <= out.score <= 1.0, (v.name, out)
            for step in ep.steps:
                sv = v.verify_step(ep.task, step) if hasattr(v, "verify_step") else None
                assert sv is None or 0.0 <= sv.score <= 1.0, (v.name, sv)


def test_efficiency_and_length():
    rep = Episode(task=TASK, steps=[call_step(GOLD_CALL), call_step(GOLD_CALL), call_step(GOLD_CALL), answer_step("42")])
    out = EfficiencyVerifier(slack=1).verify(rep)
    assert out.details["repeats"] == 2 and out.details["extra"] == 1 and out.score == pytest.approx(1 / 4)
    assert EfficiencyVerifier().verify(GOOD).passed
    long = Episode(task=TASK, steps=[answer_step("x" * 50)])
    assert LengthVerifier(max_chars=40).verify(long).passed is False
    assert LengthVerifier(max_chars=40).verify_step(TASK, answer_step("short")).passed


def test_end_state_with_stored_hash_and_replay():
    from dataengine.types import stable_hash

    task = make_task(calls=[GOLD_CALL], end_state_hash=stable_hash({"total": 42}))
    v = EndStateVerifier()
    assert v.verify(Episode(task=task, final_state={"total": 42})).passed
    assert not v.verify(Episode(task=task, final_state={"total": 41})).passed
    assert not v.verify(Episode(task=task, final_state=None)).passed
    stateful = make_task(calls=[GOLD_CALL]).model_copy(update={"initial_state": {"total": 0}})
    replayed = EndStateVerifier(replay=lambda t, calls: {"total": sum(c.arguments["a"] + c.arguments["b"] for c in calls)})
    assert replayed.verify(Episode(task=stateful, final_state={"total": 42})).passed
    assert replayed.verify(Episode(task=TASK)).passed is None  # stateless task


def test_composite_success_dominates_and_caps():
    w = RewardWeights()
    reward = CompositeReward(w)
    wrong = Episode(task=TASK, steps=[call_step(GOLD_CALL), answer_step("The answer is 41.")])
    bad_syntax = Episode(task=TASK, steps=[bad_step(), bad_step(), bad_step(), call_step(GOLD_CALL), answer_step("42")])
    r_good, r_wrong, r_bad = reward.score(GOOD), reward.score(wrong), reward.score(bad_syntax)
    assert r_good.success and not r_wrong.success and r_bad.success
    assert r_wrong.reward <= w.shaping_cap < r_bad.reward
    assert r_bad.reward >= w.success + w.syntax_penalty_cap  # penalty is capped
    assert r_good.reward > r_bad.reward
    step_r, step_verdicts = reward.step_reward(TASK, bad_step())
    assert step_r == pytest.approx(w.syntax_penalty) and step_verdicts[0].name == "format"
    assert reward.step_reward(TASK, call_step(GOLD_CALL))[0] == pytest.approx(w.step_cap)
    with pytest.raises(ValueError, match="shaping can never outweigh success"):
        RewardWeights(shaping_cap=0.95)


def test_when_failure_blocks_success():
    notool = make_task(answer="Paris", needs_tool=False)
    called = Episode(task=notool, steps=[call_step(GOLD_CALL), answer_step("Paris")])
    result = CompositeReward().score(called)
    assert not result.success and axes(result.verdicts)["when"] is False


class ConstantVerifier:
    """A rule-based stand-in with a fixed confidence, to exercise escalation."""

    def __init__(self, name: str, passed: bool, confidence: float) -> None:
        self.name, self.version = name, "test"
        self.passed, self.confidence = passed, confidence
        self.calls = 0

    def verify(self, episode: Episode):
        self.calls += 1
        return verdict(self.name, self.version, self.passed, confidence=self.confidence)


def test_cascade_escalates_only_when_unsure():
    judge = ConstantVerifier("judge", passed=False, confidence=0.99)
    cascade = Cascade([FinalAnswerVerifier(), judge], min_confidence=0.8)
    sure = cascade.verify(GOOD)
    assert sure.passed and sure.details["decided_by"] == "final_answer" and judge.calls == 0
    unsure_ep = Episode(task=make_task(answer="Paris"), steps=[answer_step("Maybe Paris, or Lyon.")])
    out = cascade.verify(unsure_ep)
    assert judge.calls == 1 and out.passed is False and out.name == "final_answer"
    assert out.details["decided_by"] == "judge" and [t["name"] for t in out.details["tiers"]] == ["final_answer", "judge"]
    # not-applicable rule verdicts are final: nothing to escalate
    assert cascade.verify(Episode(task=make_task(), steps=[])).passed is None and judge.calls == 1
    # the cascade slots into the composite under the first tier's name
    result = CompositeReward(verifiers=[cascade, WhenVerifier()]).score(unsure_ep)
    assert not result.success
