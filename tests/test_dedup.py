"""Dedup: exact hashes of normalised messages, hashed n-gram embeddings, faiss near duplicates."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from storage.dedup import (
    dedup_frame,
    embed,
    hashed_ngram_embeddings,
    messages_text,
    near_duplicate_mask,
    trajectory_hash,
)


def test_trajectory_hash_ignores_whitespace_and_tool_call_structure():
    a = [{"role": "user", "content": "add 2  and 3"}, {"role": "assistant", "content": "<tool_call>x</tool_call>"}]
    b = [{"role": "user", "content": " add 2 and 3\n"},
         {"role": "assistant", "content": "<tool_call>x</tool_call>", "tool_calls": [{"name": "add"}]}]
    c = [{"role": "user", "content": "add 2 and 4"}, {"role": "assistant", "content": "<tool_call>x</tool_call>"}]
    assert trajectory_hash(a) == trajectory_hash(b)
    assert trajectory_hash(a) != trajectory_hash(c)
    assert trajectory_hash(a) == trajectory_hash('[{"role": "user", "content": "add 2 and 3"}, '
                                                 '{"role": "assistant", "content": "<tool_call>x</tool_call>"}]')


def test_embeddings_are_normalised_deterministic_and_meaningful():
    texts = ["book a flight from Paris to Rome on Monday", "Book a flight from Paris to Rome on monday!",
             "what is the refund policy for damaged items", ""]
    x = hashed_ngram_embeddings(texts, dim=512)
    assert x.shape == (4, 512) and x.dtype == np.float32
    assert np.allclose(np.linalg.norm(x[:3], axis=1), 1.0, atol=1e-5)
    assert not x[3].any()
    assert np.array_equal(x, hashed_ngram_embeddings(texts, dim=512))
    sims = x @ x.T
    assert sims[0, 1] > 0.9 and sims[0, 2] < 0.5


def test_embedding_chunks_do_not_change_the_result(monkeypatch):
    from storage import dedup

    texts = [f"user asks for item {i} " * (i % 7 + 1) for i in range(200)]
    whole = hashed_ngram_embeddings(texts)
    monkeypatch.setattr(dedup, "_CHUNK_BYTES", 300)
    assert np.allclose(whole, hashed_ngram_embeddings(texts))


def test_near_duplicates_respect_threshold_order_and_groups():
    texts = ["call add with 17 and 25 please", "call add with 17 and 25 please!", "cancel my order 123 today",
             "call add with 17 and 25 please"]
    x = hashed_ngram_embeddings(texts)
    assert near_duplicate_mask(x, threshold=0.9).tolist() == [True, False, True, False]
    assert near_duplicate_mask(x, ["a", "b", "a", "c"], threshold=0.9).tolist() == [True, True, True, True]
    assert near_duplicate_mask(x, threshold=0.99999).tolist() == [True, True, True, False]


def test_faiss_and_matrix_paths_agree():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(40, 32)).astype(np.float32)
    x = np.concatenate([base, base + rng.normal(scale=0.05, size=base.shape).astype(np.float32)])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    order = rng.permutation(len(x))
    x = x[order]
    groups = (order % 40) // 10
    by_matrix = near_duplicate_mask(x, groups, threshold=0.98)
    by_faiss = near_duplicate_mask(x, groups, threshold=0.98, small_group=0)
    assert by_matrix.tolist() == by_faiss.tolist()
    assert (~by_matrix).sum() == 40


def test_dedup_frame_reports_counts():
    frame = pl.DataFrame({"text": ["a b c d e f", "a b c d e f", "a b c d e f g", "x y z"], "g": ["1", "1", "1", "1"]})
    out, report = dedup_frame(frame, key=lambda r: r["text"], text=lambda r: r["text"], group="g", near_threshold=0.8)
    assert report.as_dict() == {"rows_in": 4, "exact_removed": 1, "near_removed": 1, "rows_out": 2}
    assert out["text"].to_list() == ["a b c d e f", "x y z"]
    _, report = dedup_frame(frame, key=lambda r: r["text"], exact=False)
    assert report.rows_out == 4


def test_messages_text_and_bad_embedder():
    assert messages_text([{"role": "user", "content": " hi  there "}]) == "user: hi there"
    with pytest.raises(ValueError, match="unknown embedder"):
        embed(["x"], "bert")


def test_sentence_transformers_embedder_names_the_missing_package():
    import importlib.util

    if importlib.util.find_spec("sentence_transformers") is not None:
        pytest.skip("sentence-transformers is installed")
    with pytest.raises(ImportError, match="pip install sentence-transformers"):
        embed(["x"], "st:all-MiniLM-L6-v2")
