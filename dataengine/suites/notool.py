"""Notool suite: questions a good agent answers directly, with calculator tools still offered.

This is the "when" axis: gold.needs_tool is False, gold.calls is empty, and gold.answer is a
short checkable answer (a word, a name or a number). Kinds:
    capital             "What is the capital of France?" -> "Paris" (well-known capitals)
    fact                simple common knowledge ("How many days are in a week?" -> "7")
    reply_word          "Reply with the word yes." -> "yes" (instruction following, chit-chat)
    uppercase           "Write the word 'river' in capital letters." -> "RIVER"
    first_letter        "What is the first letter of the word 'apple'?" -> "a"
    trivial_arithmetic  single-digit sums, differences and products ("What is 2 + 3?" -> "5"):
                        calling a calculator for these is wasted steps, so they belong here;
                        multi-digit arithmetic lives in the arithmetic suite.
The offered tools are the arithmetic suite's add/subtract/multiply/divide (toolbox "notool"), so a
wrong call still executes.

Problem key: the question text, within a split. The split is decided by what is asked
(Draft.split_key): the country, the fact, the word and kind, or the operands with + and *
operands sorted, so the same fact or sum never appears in both splits, in any wording.
No task needs a tool call, so levels rank what the answer takes, by design (not measured):
    1  the answer is in the question: reply_word, uppercase, first_letter
    2  recall of common knowledge: capital, fact
    3  single-digit arithmetic: the offered calculator fits the question, so declining it is
       the hardest "when" decision of the suite
"""

from __future__ import annotations

import random

from dataengine.suites import arithmetic
from dataengine.suites.base import Draft, Suite
from dataengine.tools.registry import Toolbox, register_toolbox
from dataengine.types import Gold

TOOLBOX = register_toolbox(Toolbox(name="notool", tools=dict(arithmetic.TOOLBOX.tools)))

CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin", "Spain": "Madrid",
    "Egypt": "Cairo", "Russia": "Moscow", "China": "Beijing", "the United Kingdom": "London",
    "Greece": "Athens", "Portugal": "Lisbon", "Ireland": "Dublin", "Norway": "Oslo", "Sweden": "Stockholm",
    "Finland": "Helsinki", "Denmark": "Copenhagen", "Austria": "Vienna", "Poland": "Warsaw",
    "Hungary": "Budapest", "the Czech Republic": "Prague", "Kenya": "Nairobi", "Peru": "Lima",
    "Argentina": "Buenos Aires", "Mexico": "Mexico City", "Thailand": "Bangkok", "South Korea": "Seoul",
    "Cuba": "Havana", "Chile": "Santiago", "Belgium": "Brussels", "Iceland": "Reykjavik",
}  # fmt: skip
FACTS = [
    ("How many days are in a week?", "7"), ("How many legs does a spider have?", "8"),
    ("What color is a ripe banana?", "yellow"), ("What is the opposite of hot?", "cold"),
    ("How many months are in a year?", "12"), ("How many sides does a triangle have?", "3"),
    ("What planet do we live on?", "Earth"), ("What is the largest ocean on Earth?", "Pacific"),
    ("Which animal is known as the king of the jungle?", "lion"), ("How many hours are in a day?", "24"),
    ("What do bees make?", "honey"), ("How many continents are there?", "7"),
    ("How many minutes are in an hour?", "60"), ("What is the opposite of up?", "down"),
    ("How many wheels does a bicycle have?", "2"), ("Which season comes after winter?", "spring"),
    ("How many legs does a dog have?", "4"), ("What color do you get by mixing blue and yellow?", "green"),
    ("At how many degrees Celsius does water boil at sea level?", "100"),
    ("What language is mainly spoken in Brazil?", "Portuguese"), ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("What is the tallest animal in the world?", "giraffe"), ("How many days are in a leap year?", "366"),
    ("What is the chemical symbol for gold?", "Au"), ("How many players are on a soccer team on the field?", "11"),
    ("What is frozen water called?", "ice"), ("Which star is at the center of our solar system?", "Sun"),
    ("What is the largest planet in our solar system?", "Jupiter"), ("How many seconds are in a minute?", "60"),
    ("What is the opposite of left?", "right"),
]  # fmt: skip
# Other full answers a strict answer check accepts (metadata["answer_aliases"]).
ALIASES = {"Shakespeare": ["William Shakespeare"], "Pacific": ["Pacific Ocean"], "Earth": ["planet Earth"]}
WORDS = ["apple", "river", "yes", "no", "hello", "thanks", "green", "blue", "purple", "orange", "window", "garden", "table", "pencil", "rocket", "planet", "forest", "silver", "golden", "winter", "summer", "autumn", "spring", "bridge", "castle", "dragon", "falcon", "guitar", "hammer", "island", "jacket", "kitten", "lemon", "marble", "needle", "ocean", "pepper", "quartz", "rabbit", "saddle", "tiger", "umbrella", "violin", "walnut", "yellow", "zebra", "anchor", "basket", "candle", "desert", "engine", "feather", "glacier", "harbor", "igloo", "jungle", "kettle", "ladder", "meadow", "napkin", "orchard", "pillow", "quiver", "ribbon", "sunset", "tunnel", "valley", "wagon", "yogurt", "acorn", "banana", "cactus", "dolphin", "eagle", "fossil", "goblet", "helmet", "insect", "jigsaw", "koala", "lantern", "magnet", "nectar", "otter", "parrot", "quilt", "raven", "spider", "turtle", "unicorn", "velvet", "whistle", "canyon", "breeze", "comet", "lizard", "mango", "nutmeg", "oyster", "panda", "sparrow", "tomato", "waffle", "cherry", "copper", "cotton", "crystal", "dinner", "donkey", "elbow", "fabric", "fiddle", "finger", "flower", "frozen", "ginger", "hollow", "honey", "hunter", "jelly", "jungle", "kernel", "kidney", "legend", "linen", "lotus", "mirror", "monkey", "muffin", "object", "orbit", "oxygen", "paddle", "palace", "peanut", "pebble", "pirate", "pocket", "puzzle", "radar", "rocket", "salad", "shadow", "silk", "sugar", "tablet", "thunder", "timber", "tulip", "velvet", "vessel", "wander", "wizard"]
WORDS = sorted(set(WORDS))
KINDS = ["capital", "fact", "reply_word", "uppercase", "first_letter", "trivial_arithmetic"]
KIND_WEIGHTS = [1, 1, 3, 2, 2, 3]
LEVEL = {"reply_word": 1, "uppercase": 1, "first_letter": 1, "capital": 2, "fact": 2, "trivial_arithmetic": 3}


def _capital(rng: random.Random) -> tuple[str, str, str]:
    country = rng.choice(sorted(CAPITALS))
    template = rng.choice([
        "What is the capital of {}?",
        "Name the capital city of {}.",
        "Which city is the capital of {}? Answer with just the city name.",
    ])  # fmt: skip
    return template.format(country), CAPITALS[country], country


def _fact(rng: random.Random) -> tuple[str, str, str]:
    question, answer = rng.choice(FACTS)
    template = rng.choice(["{}", "Quick question: {}", "{} Please answer briefly."])
    return template.format(question), answer, question


def _reply_word(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS + ["yes", "no", "ok", "hello", "thanks"])
    template = rng.choice([
        "Reply with the word {}.",
        "Please answer with only the word '{}'.",
        "Say {} and nothing else.",
        "Respond with exactly one word: {}.",
        "Hi! Just reply '{}' so I know you are there.",
    ])  # fmt: skip
    return template.format(word), word, word


def _uppercase(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    template = rng.choice(["Write the word '{}' in capital letters.", "Convert '{}' to uppercase."])
    return template.format(word), word.upper(), word


def _first_letter(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    template = rng.choice(["What is the first letter of the word '{}'?", "Which letter does the word '{}' start with?"])
    return template.format(word), word[0], word


def _trivial_arithmetic(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    op = rng.choice(["plus", "minus", "times"])
    if op == "minus" and b > a:
        a, b = b, a
    value = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    symbol = {"plus": "+", "minus": "-", "times": "*"}[op]
    template = rng.choice(["What is {a} {symbol} {b}?", "Quick one: what is {a} {op} {b}?"])
    asked = f"{min(a, b)} {symbol} {max(a, b)}" if op != "minus" else f"{a} - {b}"
    return template.format(a=a, b=b, op=op, symbol=symbol), str(value), asked


MAKERS = {
    "capital": _capital,
    "fact": _fact,
    "reply_word": _reply_word,
    "uppercase": _uppercase,
    "first_letter": _first_letter,
    "trivial_arithmetic": _trivial_arithmetic,
}


def _answer_rule(kind: str, question: str, answer: str) -> dict:
    """Answer-check fields (dataengine.verifiers.answer): reply-with-word questions and "just the
    city name" want the answer alone; the uppercase kind is about case."""
    rule: dict = {}
    if kind == "reply_word" or "just the" in question:
        rule["answer_match"] = "only"
    if kind == "uppercase":
        rule["answer_case_sensitive"] = True
    if answer in ALIASES:
        rule["answer_aliases"] = ALIASES[answer]
    return rule


def draft(rng: random.Random) -> Draft:
    """One question answered without tools."""
    kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
    question, answer, asked = MAKERS[kind](rng)
    return Draft(
        question=question,
        key=question,
        split_key=f"{kind}:{asked}",
        gold=Gold(answer=answer, calls=[], needs_tool=False),
        metadata={
            "level": LEVEL[kind],
            "difficulty": 0,
            "n_steps": 0,
            "kind": kind,
            "answer_rel_tol": 0.0,
            **_answer_rule(kind, question, answer),
        },
    )


SUITE = Suite(
    name="notool",
    description="Questions to answer directly (capitals, simple facts, reply-with-word, 2 + 3) with calculator tools offered.",
    toolbox=TOOLBOX,
    draft=draft,
)
