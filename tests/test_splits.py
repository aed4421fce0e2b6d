"""Train and held-out splits never share a problem or a question text, however they are asked
for; difficulty levels (metadata["level"]) and the `levels` filter."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from dataengine.suites import generate_suite, get_suite, suite_levels
from dataengine.suites.base import split_drafts, split_of

NAMES = ["arithmetic", "units", "shop", "chains", "notool"]


def _question(task_or_draft) -> str:
    text = task_or_draft.question if hasattr(task_or_draft, "question") else task_or_draft.messages[0].content
    return " ".join(text.split())


def _drafts(name, split, n, seed=0):
    return list(itertools.islice(split_drafts(get_suite(name), split, seed), n))


@pytest.fixture(scope="module", params=NAMES)
def drawn_apart(request):
    """1000 train and 200 held-out tasks of a suite drawn in two separate calls, seed 0."""
    name = request.param
    return name, generate_suite(name, n_train=1000, n_heldout=0, seed=0), generate_suite(name, n_train=0, n_heldout=200, seed=0)


def test_separate_calls_share_no_question_and_no_problem(drawn_apart):
    name, train, heldout = drawn_apart
    assert len(train) == 1000 and len(heldout) == 200
    assert {t.split for t in train} == {"train"} and {t.split for t in heldout} == {"heldout"}
    assert not {_question(t) for t in train} & {_question(t) for t in heldout}
    # The drafts behind the tasks, in the same order: their problem keys and split keys.
    train_drafts, heldout_drafts = _drafts(name, "train", 1000), _drafts(name, "heldout", 200)
    assert [_question(d) for d in train_drafts] == [_question(t) for t in train]
    assert [_question(d) for d in heldout_drafts] == [_question(t) for t in heldout]
    assert not {d.key for d in train_drafts} & {d.key for d in heldout_drafts}
    split_keys = [{d.split_key or d.key for d in drafts} for drafts in (train_drafts, heldout_drafts)]
    assert not split_keys[0] & split_keys[1]


def test_one_call_gives_the_same_tasks_as_separate_calls(drawn_apart):
    name, train, heldout = drawn_apart
    assert generate_suite(name, n_train=1000, n_heldout=200, seed=0) == train + heldout


@pytest.mark.parametrize("name", NAMES)
def test_splits_stay_apart_across_seeds(name):
    """Train of one seed never holds a held-out problem of another (generate and eval seeds differ)."""
    train = [d for seed in (0, 1) for d in _drafts(name, "train", 200, seed)]
    heldout = [d for seed in (0, 2) for d in _drafts(name, "heldout", 50, seed)]
    assert not {_question(d) for d in train} & {_question(d) for d in heldout}
    assert not {d.key for d in train} & {d.key for d in heldout}


@pytest.mark.parametrize("name", NAMES)
def test_split_key_is_a_function_of_the_question_and_of_the_key(name):
    """What makes the partition sound: drafts with equal question text or equal key always have
    the same split key, so they fall in the same split; about 20% of problems are held-out."""
    suite = get_suite(name)
    rng = random.Random(f"split-key-check/{name}")
    by_question: dict[str, str] = {}
    by_key: dict[str, str] = {}
    for _ in range(1000 if name == "shop" else 5000):
        draft = suite.draft(rng)
        split_key = draft.split_key or draft.key
        assert by_question.setdefault(_question(draft), split_key) == split_key, draft.question
        assert by_key.setdefault(draft.key, split_key) == split_key, draft.key
    split_keys = set(by_key.values())
    share = sum(split_of(name, k) == "heldout" for k in split_keys) / len(split_keys)
    assert 0.12 < share < 0.28, share


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_tasks(name):
    a = generate_suite(name, n_train=200, n_heldout=50, seed=5)
    b = generate_suite(name, n_train=200, n_heldout=50, seed=5)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert generate_suite(name, 60, 20, seed=5, levels=[2, 3]) == generate_suite(name, 60, 20, seed=5, levels=[3, 2])


def test_heldout_does_not_depend_on_train_size():
    for name in NAMES:
        assert generate_suite(name, 0, 30, seed=1) == generate_suite(name, 150, 30, seed=1)[150:]


@pytest.mark.parametrize("name", NAMES)
def test_every_task_has_a_level_and_every_level_occurs(name):
    tasks = generate_suite(name, 400, 100, seed=0)
    assert suite_levels(name) == (1, 2, 3)
    assert {t.metadata["level"] for t in tasks if t.split == "train"} == {1, 2, 3}
    assert {t.metadata["level"] for t in tasks if t.split == "heldout"} == {1, 2, 3}
    for task in tasks:
        level, calls = task.metadata["level"], len(task.gold.calls)
        if name in ("arithmetic", "shop"):
            assert level == calls
        elif name == "chains":
            assert level == calls - 1
        elif name == "units":
            assert calls == 1 and (level == 3) == (task.metadata["dimension"] == "temperature")
        else:
            assert calls == 0
            kind = task.metadata["kind"]
            assert level == (1 if kind in ("reply_word", "uppercase", "first_letter") else 2 if kind in ("capital", "fact") else 3)


@pytest.mark.parametrize("name", NAMES)
def test_levels_keep_those_tasks_of_the_full_sequence_with_their_ids(name):
    full = generate_suite(name, 400, 100, seed=3)
    for levels in ([1], [2, 3], [3]):
        some = generate_suite(name, 15, 5, seed=3, levels=levels)
        assert len(some) == 20 and {t.metadata["level"] for t in some} <= set(levels)
        for split in ("train", "heldout"):
            mine = [t for t in some if t.split == split]
            assert mine == [t for t in full if t.split == split and t.metadata["level"] in levels][: len(mine)]


def test_unknown_levels_are_clear_errors():
    for bad, message in [
        ([4], "unknown level 4 for suite 'arithmetic'; its levels are 1, 2, 3"),
        ([1, 0], "unknown level 0 for suite 'arithmetic'"),
        ([True], "unknown level True"),
        (["2"], "unknown level '2'"),
        ([], "levels is empty; suite 'arithmetic' has levels 1, 2, 3"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            generate_suite("arithmetic", 3, 1, levels=bad)
    for bad in ("12", 2):
        with pytest.raises(TypeError, match=re.escape(f"levels must be a list of integers, got {bad!r}")):
            generate_suite("arithmetic", 3, 1, levels=bad)


def test_a_split_too_small_for_the_request_is_a_clear_error():
    with pytest.raises(ValueError, match=r"suite 'notool' made only \d+ distinct heldout tasks of the 1000 asked \(seed 0\)"):
        generate_suite("notool", n_train=0, n_heldout=1000, seed=0)
    with pytest.raises(ValueError, match=r"made only \d+ distinct heldout tasks of level 2 of the 100 asked"):
        generate_suite("notool", n_train=0, n_heldout=100, seed=0, levels=[2])
