"""Final answer: the whole reply, after a fixed normalisation, must BE the gold answer.

Extraction. The answer is `Episode.final_answer`: the whole text of the last final reply (the
parser already dropped a leading "Answer:" / "Final answer:" label and anything from a
hallucinated `<tool_response>` on). Nothing is picked out of a longer reply: no first or last
number, no last line, no search for the gold inside the text. A reply that says the right
thing and then more ("112\\nAll ices were pocket...") is wrong.

Normalisation (`normalize_answer`, applied to reply and gold alike):
    NFKC, accents folded (Reykjavík = Reykjavik), whitespace runs -> one space, then for up
    to _ROUNDS rounds: surrounding quotes, brackets and markdown (`*`, `_`, `` ` ``) stripped
    from both ends, currency signs from the front, `. ! ? , ; :` from the end, a leading
    "Answer:" / "Final answer:" label dropped; finally lower-cased (unless the task is case
    sensitive). Internal punctuation stays.
Lead-in (rule "exact" only): a leading "The answer is" ("The final/correct answer is", "My
    answer is", optional ":") and a leading "the " are dropped, so "The answer is 42." passes
    for 42 and "The Sun" for Sun. A task whose question says "only the word" / "nothing else"
    sets rule "only", and there a lead-in or article makes the answer wrong.

Rules, from `task.metadata` (built-in suites set them; see docs/verifiers.md):
    answer_match: "exact" (default), "only" (no lead-in), "contains" (the gold on word boundaries
        anywhere in the reply; refused for golds of one word or one number).
    answer_case_sensitive: compare case too (notool's "write it in capital letters").
    answer_units: words allowed after a numeric answer ("3.1 miles", "12 dollars").
    answer_aliases: other accepted answers ("William Shakespeare" for "Shakespeare").
    answer_rel_tol / answer_abs_tol: numeric tolerance (math.isclose).
A numeric gold passes when the reply is exactly one number (1,234.5 allowed), optionally
followed by one of the task's units, within tolerance.

Outcomes and their confidence (what a Cascade reads): exact 1.0, numeric 0.95, contained 0.7
pass; mentioned 0.7 (a miss whose reply contains the gold: could be a correct sentence, could be
nonsense mentioning it), miss 0.9, miss_numeric 1.0 fail.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dataengine.types import Episode, Task, Verdict
from dataengine.verifiers.base import not_applicable, verdict

# a digit is required (an all-optional pattern matches the empty string at every position)
_NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")
# Surrounding characters: quotes, brackets, markdown emphasis/code. Leading "." "-" "+" are kept
# (".5", "-3"); "." and the other sentence marks are stripped only from the end.
_WRAP = "\"'`*_()[]{}<>“”‘’«»„"
_LEAD = _WRAP + "$€£¥"
_TRAIL = _WRAP + ".!?,;:。！？"
_LABEL = re.compile(r"(?:final )?answer ?[:：] ?", re.IGNORECASE)
_LEAD_IN = re.compile(r"(?:(?:the|my) )?(?:final |correct )?answer is:? ?", re.IGNORECASE)
_THE = re.compile(r"the (?=.)", re.IGNORECASE)
# Wrapper/label rounds: enough for "**Answer:** *42*", and bounded so that a reply of a thousand
# stacked labels stays linear.
_ROUNDS = 6

RULES = ("exact", "only", "contains")
PASSING = ("exact", "numeric", "contained")
CONFIDENCE = {
    "exact": 1.0,
    "numeric": 0.95,
    "contained": 0.7,
    "mentioned": 0.7,
    "miss": 0.9,
    "miss_numeric": 1.0,
}


@dataclass(frozen=True)
class AnswerRule:
    """How a task's final answer is compared (read from task.metadata by `answer_rule`).

    match: "exact" | "only" | "contains"; case_sensitive: compare case; units: words allowed
    after a number; aliases: other accepted answers; rel_tol, abs_tol: numeric tolerance.
    """

    match: str = "exact"
    case_sensitive: bool = False
    units: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    rel_tol: float = 1e-6
    abs_tol: float = 1e-6
    _units: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.match not in RULES:
            raise ValueError(f"answer_match must be one of {', '.join(RULES)}; got {self.match!r}")
        object.__setattr__(self, "_units", frozenset(_fold(u).lower() for u in self.units))


def _strings(task: Task, key: str) -> tuple[str, ...]:
    value = task.metadata.get(key, ())
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"task {task.id}: metadata[{key!r}] must be a list of strings, got {value!r}")
    return tuple(value)


def _number(task: Task, key: str, default: float) -> float:
    value = task.metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"task {task.id}: metadata[{key!r}] must be a number >= 0, got {value!r}")
    return float(value)


def answer_rule(task: Task, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> AnswerRule:
    """The AnswerRule of `task` (its metadata over the given default tolerance); a bad field is a
    TypeError (wrong type) or ValueError naming the task and the field."""
    meta = task.metadata
    case = meta.get("answer_case_sensitive", False)
    if not isinstance(case, bool):
        raise TypeError(f"task {task.id}: metadata['answer_case_sensitive'] must be true or false, got {case!r}")
    match = meta.get("answer_match", "exact")
    if match not in RULES:
        raise ValueError(f"task {task.id}: metadata['answer_match'] must be one of {', '.join(RULES)}; got {match!r}")
    rule = AnswerRule(
        match=match,
        case_sensitive=case,
        units=_strings(task, "answer_units"),
        aliases=_strings(task, "answer_aliases"),
        rel_tol=_number(task, "answer_rel_tol", rel_tol),
        abs_tol=_number(task, "answer_abs_tol", abs_tol),
    )
    if rule.match == "contains":
        for gold in (task.gold.answer or "", *rule.aliases):
            g = normalize_answer(gold)
            if len(g.split()) < 2 or parse_number(g) is not None:
                raise ValueError(
                    f"task {task.id}: metadata['answer_match'] = 'contains' needs gold answers of two or more "
                    f"words, not one word or a number: {gold!r}"
                )
    return rule


def _fold(text: str) -> str:
    """NFKC with accents removed."""
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text))
    return unicodedata.normalize("NFC", "".join(c for c in text if not unicodedata.combining(c)))


def normalize_answer(text: str, case_sensitive: bool = False, loose: bool = False) -> str:
    """`text` normalised as the module docstring says; loose=True (rules other than "only") also
    drops a lead-in ("The answer is") and a leading "the "."""
    text = " ".join(_fold(text).split())
    for _ in range(_ROUNDS):
        before = text
        text = text.lstrip(_LEAD).rstrip(_TRAIL).strip()
        for pattern in (_LABEL, _LEAD_IN) if loose else (_LABEL,):
            m = pattern.match(text)
            if m and m.end() < len(text):
                text = text[m.end() :]
        if text == before:
            break
    if not case_sensitive:
        text = text.lower()
    m = _THE.match(text) if loose else None
    return text[m.end() :] if m else text


def numbers_in(text: str) -> list[float]:
    """Every number in `text`, in order (thousands separators allowed: 1,234.5)."""
    return [float(m.group(0).replace(",", "")) for m in _NUMBER.finditer(text)]


def parse_number(text: str, units: frozenset[str] = frozenset()) -> float | None:
    """The number `text` (already normalised) is: exactly one number, then optionally one of `units`."""
    m = _NUMBER.match(text)
    if m is None:
        return None
    rest = text[m.end() :].strip()
    if rest and rest not in units:
        return None
    return float(m.group(0).replace(",", ""))


def _mentions(pred: str, gold: str) -> bool:
    return bool(gold) and re.search(r"(?<!\w)" + re.escape(gold) + r"(?!\w)", pred) is not None


def match_one(pred: str, gold: str, rule: AnswerRule) -> str:
    """How reply `pred` matches one accepted answer `gold` under `rule` (see CONFIDENCE's keys)."""
    loose = rule.match != "only"
    p = normalize_answer(pred, rule.case_sensitive, loose)
    g = normalize_answer(gold, rule.case_sensitive, loose)
    if p == g:
        return "exact"
    gold_number = parse_number(g.lower())
    if gold_number is not None:
        value = parse_number(p.lower(), rule._units)
        close = lambda x: math.isclose(x, gold_number, rel_tol=rule.rel_tol, abs_tol=rule.abs_tol)
        if value is not None and close(value):
            return "numeric"
        if value is None and rule.match == "exact" and any(close(x) for x in numbers_in(p)):
            return "mentioned"
        return "miss_numeric"
    if rule.match == "contains" and _mentions(p, g):
        return "contained"
    if rule.match == "exact" and _mentions(p.lower(), g.lower()):
        return "mentioned"
    return "miss"


_ORDER = ("exact", "numeric", "contained", "mentioned", "miss", "miss_numeric")


def match_answer(pred: str, gold: str, rel_tol: float = 1e-6, abs_tol: float = 1e-6, rule: AnswerRule | None = None) -> str:
    """How `pred` matches `gold` and the rule's aliases: the best of "exact", "numeric",
    "contained" (these pass), "mentioned", "miss", "miss_numeric" (these fail).

    Without `rule`: the default rule ("exact") with the given tolerance.
    """
    rule = rule or AnswerRule(rel_tol=rel_tol, abs_tol=abs_tol)
    outcomes = [match_one(pred, g, rule) for g in (gold, *rule.aliases)]
    return min(outcomes, key=_ORDER.index)


class FinalAnswerVerifier:
    """The episode's final answer against task.gold.answer under the task's AnswerRule.

    rel_tol, abs_tol: default numeric tolerance (math.isclose); task.metadata["answer_rel_tol"]
        and ["answer_abs_tol"] override them per task. Not applicable without a gold answer.
    details: match (a CONFIDENCE key, or "none" without a final answer), rule, answer.
    Version 2: whole-reply matching; version 1 passed replies that merely contained
    the gold or whose first or last number equalled it.
    """

    name = "final_answer"
    version = "2"

    def __init__(self, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> None:
        self.rel_tol = rel_tol
        self.abs_tol = abs_tol

    def verify(self, episode: Episode) -> Verdict:
        gold = episode.task.gold.answer
        if gold is None:
            return not_applicable(self.name, self.version, "task has no gold answer")
        rule = answer_rule(episode.task, self.rel_tol, self.abs_tol)
        answer = episode.final_answer
        if answer is None:
            return verdict(self.name, self.version, False, confidence=1.0, match="none", rule=rule.match, answer=None)
        how = match_answer(answer, gold, rule=rule)
        details: dict[str, Any] = {"match": how, "rule": rule.match, "answer": answer[:500]}
        return verdict(self.name, self.version, how in PASSING, confidence=CONFIDENCE[how], **details)
