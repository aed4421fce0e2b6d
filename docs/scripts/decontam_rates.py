"""Decontamination's error rates by near-duplicate threshold (docs/derive.md, "Decontamination").

False positives: the first TRAIN train drafts (seed 0) of every built-in suite against the eval
index. Train and held-out problems are disjoint by construction (suites.base.split_of), so a
refused train question is a false positive unless it is, word for word, a BFCL or tau2 question
(printed apart as "exact"). Recall: SAMPLE BFCL/tau2 questions of five or more tokens with one
word (not one holding a digit) replaced by another, seeded.

    .venv/bin/python docs/scripts/decontam_rates.py [--train 3000] [--sample 800]
"""

from __future__ import annotations

import argparse
import itertools
import random

from dataengine.derive.decontam import NEAR_SOURCES, eval_index, normalise_question
from dataengine.suites import SUITE_MODULES, get_suite
from dataengine.suites.base import split_drafts

THRESHOLDS = (0.75, 0.8, 0.85, 0.9, 0.95)
WORDS = ("apple", "river", "blue", "quickly", "seven", "table", "green", "mountain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=3000, help="train drafts per suite")
    parser.add_argument("--sample", type=int, default=800, help="one-word-changed eval questions")
    args = parser.parse_args()
    index = eval_index()
    print(f"index {index.digest}: {len(index.items)} items, sources {', '.join(index.sources)}")
    print("suite       exact  " + "  ".join(f"near@{t}" for t in THRESHOLDS))
    for name in SUITE_MODULES:
        texts = [[d.question] for d in itertools.islice(split_drafts(get_suite(name), "train", 0), args.train)]
        none = [[]] * len(texts)
        exact = sum(s is not None for s in index.refusals(texts, none, threshold=None).sources)
        near = [sum(s is not None for s in index.refusals(texts, none, threshold=t).sources) - exact for t in THRESHOLDS]
        print(f"{name:<10} {exact:>6}  " + "  ".join(f"{n:>7}" for n in near) + f"   (of {len(texts)})")
    rng = random.Random(0)
    frame = index.frame()
    pool = sorted({q for q, s in zip(frame["question"], frame["source"]) if s in NEAR_SOURCES and len(q.split()) >= 5})
    changed = []
    for q in rng.sample(pool, min(args.sample, len(pool))):
        tokens = q.split()
        free = [i for i, t in enumerate(tokens) if not any(ch.isdigit() for ch in t)]
        tokens[rng.choice(free)] = rng.choice(WORDS)
        changed.append([normalise_question(" ".join(tokens))])
    caught = [sum(s is not None for s in index.refusals(changed, [[]] * len(changed), threshold=t).sources)
              for t in THRESHOLDS]
    print("one word changed, caught: " + "  ".join(f"@{t} {c / len(changed):.3f}" for t, c in zip(THRESHOLDS, caught))
          + f"   (of {len(changed)})")


if __name__ == "__main__":
    main()
