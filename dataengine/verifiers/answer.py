"""Final answer: exact, numeric within tolerance, or contained on word boundaries.

The three ways to match differ in how sure they are, which is what the cascade reads:
exact 1.0, numeric 0.95, contained 0.7 (a long reply that merely mentions the answer may
still be wrong), and a miss 0.9 (a miss of a free-text answer might be a paraphrase).
"""

from __future__ import annotations

import math
import re
import unicodedata

from dataengine.types import Episode, Verdict
from dataengine.verifiers.base import not_applicable, verdict

# a digit is required (an all-optional pattern matches the empty string at every position)
_NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")
_PUNCT = re.compile(r"[^\w\s.\-+]")

CONFIDENCE = {"exact": 1.0, "numeric": 0.95, "contained": 0.7, "miss": 0.9, "miss_numeric": 1.0}


def normalize_answer(text: str) -> str:
    """Lower-case, NFKC, drop punctuation other than . - +, collapse spaces, strip a final '.'."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = _PUNCT.sub(" ", text)
    text = " ".join(text.split())
    return text.rstrip(".").strip()


def numbers_in(text: str) -> list[float]:
    """Every number in `text`, in order (thousands separators allowed: 1,234.5)."""
    out = []
    for m in _NUMBER.finditer(text):
        s = m.group(0)
        try:
            out.append(float(s.replace(",", "")))
        except ValueError:
            continue
    return out


def parse_number(text: str) -> float | None:
    """The number `text` is, if it is exactly one number (after normalisation)."""
    nums = numbers_in(text)
    stripped = _NUMBER.sub("", normalize_answer(text)).strip()
    return nums[0] if len(nums) == 1 and not stripped else None


def match_answer(pred: str, gold: str, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> str:
    """How `pred` matches `gold`: "exact", "numeric", "contained", "miss" or "miss_numeric"."""
    p, g = normalize_answer(pred), normalize_answer(gold)
    if p == g:
        return "exact"
    gold_number = parse_number(gold)
    if gold_number is not None:
        nums = numbers_in(pred)
        # the first or the last number of the reply is the answer; a middle one is working
        ends = nums[:1] + nums[-1:]
        if any(math.isclose(x, gold_number, rel_tol=rel_tol, abs_tol=abs_tol) for x in ends):
            return "numeric"
        return "miss_numeric"
    if g and re.search(r"(?<!\w)" + re.escape(g) + r"(?!\w)", p):
        return "contained"
    return "miss"


class FinalAnswerVerifier:
    """The episode's final answer against task.gold.answer.

    rel_tol, abs_tol: numeric tolerance (math.isclose); task.metadata["answer_rel_tol"] and
        ["answer_abs_tol"] override them per task. Not applicable without a gold answer.
    details: match ("exact" | "numeric" | "contained" | "miss" | "miss_numeric"), answer.
    """

    name = "final_answer"
    version = "1"

    def __init__(self, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> None:
        self.rel_tol = rel_tol
        self.abs_tol = abs_tol

    def verify(self, episode: Episode) -> Verdict:
        gold = episode.task.gold.answer
        if gold is None:
            return not_applicable(self.name, self.version, "task has no gold answer")
        answer = episode.final_answer
        if answer is None:
            return verdict(self.name, self.version, False, confidence=1.0, match="none", answer=None)
        # a suite may set its own tolerance (units: 1e-3 relative)
        rel_tol = float(episode.task.metadata.get("answer_rel_tol", self.rel_tol))
        abs_tol = float(episode.task.metadata.get("answer_abs_tol", self.abs_tol))
        how = match_answer(answer, gold, rel_tol, abs_tol)
        passed = how in ("exact", "numeric", "contained")
        return verdict(self.name, self.version, passed, confidence=CONFIDENCE[how], match=how, answer=answer[:500])
