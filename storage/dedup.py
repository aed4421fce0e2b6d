"""Deduplication of trajectories and derived rows: exact and near-duplicate.

- Exact: sha256 of the normalised messages (roles, contents with whitespace collapsed; tool
  call structure dropped because the raw assistant text already holds the calls).
- Near: cosine similarity of embeddings, searched with faiss (faiss-gpu is used when it is
  installed and a GPU is visible). The default embedding is signed hashed character n-grams
  (no model download); `embedder="st:<model name or path>"` uses sentence-transformers.

Near-duplicate removal is greedy in row order: a row is dropped when an earlier kept row of
the same group is at cosine >= threshold. Groups of up to `SMALL_GROUP` rows are compared
all-pairs with one matrix product; larger groups (and the ungrouped case) use an exact faiss
k-NN search (k = `max_neighbours`), so a cluster larger than k may keep a few extra rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

NGRAMS = (3, 4, 5)
DIM = 256
THRESHOLD = 0.95
MAX_NEIGHBOURS = 64
SMALL_GROUP = 512
_CHUNK_BYTES = 4_000_000


def normalise_messages(messages: Sequence[dict[str, Any]] | str) -> list[dict[str, str]]:
    """Messages reduced to role, whitespace-collapsed content and (tool turns) name."""
    if isinstance(messages, str):
        messages = json.loads(messages)
    out = []
    for m in messages:
        item = {"role": str(m.get("role", "")), "content": " ".join(str(m.get("content") or "").split())}
        if m.get("name") is not None:
            item["name"] = str(m["name"])
        out.append(item)
    return out


def trajectory_hash(messages: Sequence[dict[str, Any]] | str) -> str:
    """Exact-dedup key of a message list: sha256 (16 hex chars) of its normalised JSON."""
    text = json.dumps(normalise_messages(messages), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def messages_text(messages: Sequence[dict[str, Any]] | str) -> str:
    """Plain text of a message list for embedding: "role: content" lines."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in normalise_messages(messages))


def hashed_ngram_embeddings(
    texts: Sequence[str], *, dim: int = DIM, ngrams: Sequence[int] = NGRAMS
) -> np.ndarray:
    """Signed hashed character n-gram counts, L2-normalised: float32 `[len(texts), dim]`.

    Texts are lower-cased with whitespace collapsed and encoded as UTF-8 bytes; every byte
    n-gram is hashed (polynomial hash, then a 64-bit mix) to a bucket and a sign. Vectorised
    over chunks of texts with numpy; deterministic across processes and machines.
    """
    if dim < 2:
        raise ValueError(f"dim must be >= 2, got {dim}")
    out = np.zeros((len(texts), dim), dtype=np.float32)
    encoded = [(" ".join(t.lower().split())).encode() for t in texts]
    start = 0
    while start < len(encoded):
        stop, size = start, 0
        while stop < len(encoded) and (size == 0 or size + len(encoded[stop]) <= _CHUNK_BYTES):
            size += len(encoded[stop]) + 1
            stop += 1
        out[start:stop] = _embed_chunk(encoded[start:stop], dim, ngrams)
        start = stop
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def _embed_chunk(chunk: list[bytes], dim: int, ngrams: Sequence[int]) -> np.ndarray:
    lengths = np.array([len(b) for b in chunk], dtype=np.int64)
    ends = np.cumsum(lengths)
    data = np.frombuffer(b"".join(chunk), dtype=np.uint8).astype(np.uint64)
    row_of = np.repeat(np.arange(len(chunk)), lengths)
    counts = np.zeros(len(chunk) * dim, dtype=np.float64)
    for n in ngrams:
        if data.size < n:
            continue
        m = data.size - n + 1
        h = np.zeros(m, dtype=np.uint64)
        for j in range(n):
            h = h * np.uint64(1_000_003) + data[j : j + m] + np.uint64(1)
        h ^= np.uint64((n * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
        # splitmix64 finaliser: spreads the polynomial hash over all bits.
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
        rows = row_of[:m]
        valid = np.arange(m) + n <= ends[rows]
        rows, h = rows[valid], h[valid]
        bucket = (h % np.uint64(dim)).astype(np.int64)
        sign = np.where((h >> np.uint64(63)) == 0, 1.0, -1.0)
        counts += np.bincount(rows * dim + bucket, weights=sign, minlength=len(chunk) * dim)
    return counts.reshape(len(chunk), dim).astype(np.float32)


def sentence_transformer_embeddings(texts: Sequence[str], model: str) -> np.ndarray:
    """Embeddings from a sentence-transformers model, L2-normalised: float32 `[N, D]`."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(
            "embedder 'st:...' needs sentence-transformers: pip install sentence-transformers"
        ) from exc
    encoder = SentenceTransformer(model)
    vectors = encoder.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)


def embed(texts: Sequence[str], embedder: str = "ngram") -> np.ndarray:
    """Embeddings `[N, D]` by name: "ngram" (default, hashed n-grams) or "st:<model>"."""
    if embedder == "ngram":
        return hashed_ngram_embeddings(texts)
    if embedder.startswith("st:"):
        return sentence_transformer_embeddings(texts, embedder[3:])
    raise ValueError(f"unknown embedder {embedder!r}; use 'ngram' or 'st:<sentence-transformers model>'")


def _gpu_count(faiss) -> int:
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") and hasattr(faiss, "StandardGpuResources") else 0


def near_duplicate_mask(
    vectors: np.ndarray,
    groups: Sequence[Any] | None = None,
    *,
    threshold: float = THRESHOLD,
    max_neighbours: int = MAX_NEIGHBOURS,
    small_group: int = SMALL_GROUP,
) -> np.ndarray:
    """Bool `[N]`: True for rows to keep.

    vectors: float32 `[N, D]`, L2-normalised (inner product = cosine).
    groups: optional `[N]` labels; only rows of the same group are compared.
    threshold: cosine at or above which a later row duplicates an earlier kept one.
    max_neighbours: k of the k-NN search per row.
    small_group: groups up to this size are compared all-pairs with numpy instead of faiss.
    """
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n = vectors.shape[0]
    keep = np.ones(n, dtype=bool)
    if n < 2:
        return keep
    if groups is None:
        members = [np.arange(n)]
    else:
        labels = pl.Series("g", list(groups)).cast(pl.String).fill_null("")
        frame = pl.DataFrame({"g": labels, "i": np.arange(n)}).group_by("g", maintain_order=True).agg("i")
        members = [np.asarray(ix) for ix in frame["i"].to_list() if len(ix) > 1]
    use_gpu = _gpu_count(faiss) > 0
    for ix in members:
        x = vectors[ix]
        if len(ix) <= small_group:
            # All pairs of a small group: one matrix product beats building an index per group.
            sims = x @ x.T
            close = np.tril(sims >= threshold, k=-1)
            local_keep = np.ones(len(ix), dtype=bool)
            for i in np.flatnonzero(close.any(axis=1)):
                if (close[i] & local_keep).any():
                    local_keep[i] = False
            keep[ix] = local_keep
            continue
        index = faiss.IndexFlatIP(x.shape[1])
        if use_gpu:
            index = faiss.index_cpu_to_all_gpus(index)
        index.add(x)
        sims, nbrs = index.search(x, min(len(ix), max_neighbours))
        local_keep = np.ones(len(ix), dtype=bool)
        candidates = (sims >= threshold) & (nbrs < np.arange(len(ix))[:, None]) & (nbrs >= 0)
        for i in np.flatnonzero(candidates.any(axis=1)):
            if local_keep[nbrs[i][candidates[i]]].any():
                local_keep[i] = False
        keep[ix] = local_keep
    return keep


@dataclass(frozen=True)
class DedupReport:
    """Rows in, exact duplicates removed, near duplicates removed, rows out."""

    rows_in: int
    exact_removed: int
    near_removed: int
    rows_out: int

    def as_dict(self) -> dict[str, int]:
        return {"rows_in": self.rows_in, "exact_removed": self.exact_removed,
                "near_removed": self.near_removed, "rows_out": self.rows_out}


def dedup_frame(
    frame: pl.DataFrame,
    *,
    key: Callable[[dict[str, Any]], str] | Sequence[str],
    text: Callable[[dict[str, Any]], str] | str | None = None,
    group: str | None = None,
    exact: bool = True,
    near_threshold: float | None = None,
    embedder: str = "ngram",
) -> tuple[pl.DataFrame, DedupReport]:
    """Drop exact duplicates (first kept) and, with `near_threshold`, near duplicates.

    key: column names whose values together identify a row, or a function of the row dict.
    text: column name or function giving the text to embed for near-duplicate search.
    group: column; near duplicates are only looked for among rows with equal values.
    """
    rows_in = frame.height
    if exact and rows_in:
        if callable(key):
            keys = pl.Series("_dedup_key", [key(r) for r in frame.iter_rows(named=True)])
            frame = frame.with_columns(keys).unique("_dedup_key", keep="first", maintain_order=True).drop("_dedup_key")
        else:
            frame = frame.unique(list(key), keep="first", maintain_order=True)
    exact_removed = rows_in - frame.height
    near_removed = 0
    if near_threshold is not None and frame.height > 1:
        if text is None:
            raise ValueError("near-duplicate removal needs a text column or function")
        texts = frame[text].to_list() if isinstance(text, str) else [text(r) for r in frame.iter_rows(named=True)]
        vectors = embed(texts, embedder)
        groups = frame[group].to_list() if group else None
        mask = near_duplicate_mask(vectors, groups, threshold=near_threshold)
        near_removed = int((~mask).sum())
        frame = frame.filter(pl.Series(mask))
    return frame, DedupReport(rows_in, exact_removed, near_removed, frame.height)
