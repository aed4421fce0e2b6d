"""Decontamination's error rates by near-duplicate threshold (docs/derive.md, "Decontamination").

False positives: the first TRAIN train drafts (seed 0) of every built-in suite against the eval
index. Train and held-out problems are disjoint by construction (suites.base.split_of), so a
refused train question is a false positive unless it is, word for word, a BFCL or tau2 question
(printed apart as "exact"). Recall: SAMPLE BFCL/tau2 questions of five or more tokens with one
word (not one holding a digit) replaced by another, seeded. Why held-out items match exactly
only: per suite, train questions equal to one of the first 500 held-out ones (seed 0) with all
punctuation collapsed and with normalise_question, and those whose nearest such held-out
question is at cosine >= 0.85.

    .venv/bin/python docs/scripts/decontam_rates.py [--train 3000] [--sample 800]
"""

from __future__ import annotations

import argparse
import itertools
import random
import re

from dataengine.derive.decontam import DIM, NEAR_SOURCES, THRESHOLD, eval_index, normalise_question
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
    templates()
    print("one word changed, caught: " + "  ".join(f"@{t} {c / len(changed):.3f}" for t, c in zip(THRESHOLDS, caught))
          + f"   (of {len(changed)})")


def templates(train: int = 3000, heldout: int = 500) -> None:
    import faiss

    from storage.dedup import hashed_ngram_embeddings

    def collapsed(text: str) -> str:
        return " ".join(re.sub(r"[\W_]+", " ", text.lower()).split())

    print(f"suite       equal to held-out: collapsed  ours   nearest held-out cosine >= {THRESHOLD}")
    for name in SUITE_MODULES:
        suite = get_suite(name)
        questions = [d.question for d in itertools.islice(split_drafts(suite, "train", 0), train)]
        held = [d.question for d in itertools.islice(split_drafts(suite, "heldout", 0), heldout)]
        equal_collapsed = len([q for q in questions if collapsed(q) in {collapsed(h) for h in held}])
        ours = sorted({normalise_question(h) for h in held})
        equal_ours = len([q for q in questions if normalise_question(q) in set(ours)])
        index = faiss.IndexFlatIP(DIM)
        index.add(hashed_ngram_embeddings(ours, dim=DIM))
        sims, _ = index.search(hashed_ngram_embeddings([normalise_question(q) for q in questions], dim=DIM), 1)
        print(f"{name:<10} {equal_collapsed:>29} {equal_ours:>5} {int((sims[:, 0] >= THRESHOLD).sum()):>8}"
              f"   (of {len(questions)})")


if __name__ == "__main__":
    main()
