"""Export files of the derived tables: which rows (filters, committed shards), balancing by
oversampling, and the atomic writing of TRL datasets with their lineage. Knows the dataset
formats (storage.formats) but not how messages are rendered: dataengine.derive.export builds the rows
(messages in TRL's tool-calling form) and calls `write_rows`.

Formats (`out` is the path written):
- `parquet`: one file; the lineage record is in its key-value metadata (`dataengine.lineage`),
  next to the `datasets` features (`huggingface`).
- `jsonl`, `hf`: a dataset folder: `README.md` (a dataset card whose YAML front matter holds
  the data files, the features and the lineage record under `dataengine.lineage`) and
  `data/train-00000-of-00001.jsonl` or `.parquet`. `datasets.load_dataset(folder)` reads it.

Atomic (`storage.atomic`): a file is written under a hidden temporary name in the same folder
and renamed over `out`; a folder is built under a hidden temporary name and swapped with the
old one in one rename. A killed export leaves the old export as it was and at most a hidden
`.<name>.<pid>-*.tmp` entry, which `datasets` and the trainers skip and the next export removes.

Balancing (`oversample`): rows of every value of a balance key repeated in order to the row
count of the largest value; `task_field` reads a key from the rows' stored tasks.

The lineage record (source table versions, filters, dedup and balance settings and counts)
rebuilds the same rows through Delta time travel: dataengine.derive.export.reexport.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

from storage.atomic import destination, replace_file, replace_folder
from storage.formats import (
    DatasetKind,
    chat_tools,
    dataset_kind,
    decoded_row,
    features,
    to_json_text,
)
from storage.schemas import SCHEMA_VERSION
from storage.store import Store

Format = Literal["parquet", "jsonl", "hf"]
KINDS: tuple[str, ...] = ("pairs", "sft", "replay")
FORMATS: tuple[str, ...] = ("parquet", "jsonl", "hf")
LINEAGE_KEY = "dataengine.lineage"
CARD = "README.md"
DATA_FILE = {"jsonl": "data/train-00000-of-00001.jsonl", "hf": "data/train-00000-of-00001.parquet"}


@dataclass
class ExportFilters:
    """Which rows of the source table are exported (all None: every row).

    run_ids, suites, task_ids: keep rows whose column is in the list.
    kinds: pairs `kind` (step | trajectory) or sft `kind` (rs | recovery).
    min_margin: pairs with margin >= this.
    min_score: sft rows with score >= this.
    min_p_success, max_p_success: replay prompts with p_success in this range (GRPO wants
        prompts the policy sometimes solves).
    where: a SQL boolean expression over the source table's columns (Polars SQL).
    limit: at most this many rows (after filters, before dedup).
    """

    run_ids: list[str] | None = None
    suites: list[str] | None = None
    task_ids: list[str] | None = None
    kinds: list[str] | None = None
    min_margin: float | None = None
    min_score: float | None = None
    min_p_success: float | None = None
    max_p_success: float | None = None
    where: str | None = None
    limit: int | None = None

    def apply(self, frame: pl.LazyFrame, kind: str) -> pl.LazyFrame:
        for column, values in (("run_id", self.run_ids), ("suite", self.suites), ("task_id", self.task_ids)):
            if values:
                frame = frame.filter(pl.col(column).is_in(list(values)))
        if self.kinds:
            if kind == "replay":
                raise ValueError("replay rows have no kind; drop the kinds filter")
            frame = frame.filter(pl.col("kind").is_in(list(self.kinds)))
        for value, column, wanted, op in (
            (self.min_margin, "margin", "pairs", "ge"),
            (self.min_score, "score", "sft", "ge"),
            (self.min_p_success, "p_success", "replay", "ge"),
            (self.max_p_success, "p_success", "replay", "le"),
        ):
            if value is None:
                continue
            if kind != wanted:
                raise ValueError(f"filter on {column} applies to {wanted} exports, not {kind}")
            frame = frame.filter(getattr(pl.col(column), op)(value))
        if self.where:
            try:
                frame = frame.filter(pl.sql_expr(self.where))
            except Exception as exc:
                raise ValueError(f"bad --where expression {self.where!r}: {exc}") from exc
        if self.limit is not None:
            frame = frame.head(self.limit)
        return frame


@dataclass
class ExportResult:
    """What an export wrote: path, rows, dedup counts, rows refused as eval items, and the
    lineage to rebuild it."""

    kind: str
    format: str
    path: str
    rows: int
    dedup: dict[str, int]
    source_versions: dict[str, int]
    filters: dict[str, Any]
    dedup_settings: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    balance: dict[str, Any] = field(default_factory=dict)
    decontaminated: dict[str, int] = field(default_factory=dict)  # rows refused as eval items, per source

    def lineage(self) -> dict[str, Any]:
        return asdict(self)


def task_field(store: Store, task_ids: pl.Series, name: str, version: int | None = None) -> pl.Series:
    """`metadata.<name>` of each task in `task_ids` (the stored task JSON; text, null where the
    task or the field is missing). `name` is a plain identifier (balance_keys checks it).
    ValueError when no task has the field (a misspelt name would otherwise balance nothing)."""
    if not store.has_table("tasks"):
        raise ValueError("balance_by needs the store's tasks table, and the store has none")
    values = (
        store.tasks(version).select("task_id", pl.col("task_json").str.json_path_match(f"$.metadata.{name}").alias(name))
        .unique("task_id", keep="first").collect()
    )
    joined = pl.DataFrame({"task_id": task_ids}).join(values, on="task_id", how="left", maintain_order="left")
    if task_ids.len() and joined[name].null_count() == joined.height:
        raise ValueError(f"balance_by: no task of these rows has metadata.{name}")
    return joined[name]


def oversample(rows: pl.DataFrame, column: str) -> tuple[pl.DataFrame, dict[str, int]]:
    """Rows of each value of `column` repeated in order (whole copies, then the first rows) up to
    the row count of the most frequent value; returns them grouped by value in first-seen order,
    and the rows per value before ("null" for a missing value)."""
    if rows.height == 0:
        return rows, {}
    counts = rows.group_by(column, maintain_order=True).len()
    target = int(counts["len"].max())
    parts = []
    for value, n in counts.iter_rows():
        part = rows.filter(pl.col(column).eq_missing(value))
        parts.append(pl.concat([part] * -(-target // n)).head(target))
    return pl.concat(parts), {("null" if v is None else str(v)): int(n) for v, n in counts.iter_rows()}


def committed_source(
    store: Store, kind: str, filters: ExportFilters | None = None, versions: dict[str, int] | None = None,
) -> tuple[pl.DataFrame, dict[str, int]]:
    """The committed, filtered rows of `kind`'s store table and the versions read ({table:
    version}, plus each commit marker table's version when shards of the table declare one).

    Committed shards only: a shard declared with a commit marker table (the store's convention:
    tasks) whose marker has no rows of it is left out. The marker's version is lineage too, so a
    rebuild judges the same shards committed.
    """
    spec = _kind(kind)
    filters = filters or ExportFilters()
    versions = versions or {}
    used = {spec.table: versions.get(spec.table, store.version(spec.table))}
    markers = {}
    for marker in sorted(store.manifest.declared(spec.table)):
        if store.has_table(marker):
            markers[marker] = used[marker] = versions.get(marker, store.version(marker))
    source = store.committed(spec.table, used[spec.table], marker_versions=markers)
    return filters.apply(source, spec.name).collect(), used


def _kind(kind: str) -> DatasetKind:
    try:
        return dataset_kind(kind)
    except ValueError:
        raise ValueError(f"unknown export {kind!r}; choose from {', '.join(KINDS)}") from None


# ---- writing ----------------------------------------------------------------------------------


def to_arrow(rows: pl.DataFrame, kind: str) -> Any:
    """The rows as a pyarrow Table typed by the kind's `datasets` features (JSON leaves as
    Arrow JSON values; the features are in the schema metadata)."""
    from datasets.table import table_cast

    return table_cast(rows.to_arrow(), features(kind, rows.columns).arrow_schema)


def _write_parquet(table: Any, path: Path, lineage_text: str) -> None:
    import pyarrow.parquet as pq

    metadata = {**(table.schema.metadata or {}), LINEAGE_KEY.encode(): lineage_text.encode()}
    pq.write_table(table.replace_schema_metadata(metadata), path)


def _write_jsonl(rows: pl.DataFrame, kind: str, path: Path) -> None:
    tools: dict[tuple[str, ...], str] = {}  # rows share tool lists: decode and encode each once
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows.iter_rows(named=True):
            key = tuple(row.pop("tools"))
            if key not in tools:
                tools[key] = to_json_text(chat_tools(list(key), "tools"))
            line = to_json_text(decoded_row(row, kind))
            handle.write(f'{line[:-1]}, "tools": {tools[key]}}}\n')


def _card(kind: str, fmt: str, rows: int, data_file: Path, lineage: dict[str, Any], feats: Any) -> str:
    """README.md of a dataset folder: YAML front matter (data files, features, lineage) and text."""
    import yaml

    spec = dataset_kind(kind)
    meta = {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": DATA_FILE[fmt]}]}],
        "dataset_info": {
            "features": feats._to_yaml_list(),
            "splits": [{"name": "train", "num_bytes": data_file.stat().st_size, "num_examples": rows}],
        },
        "tags": ["trl"],
        "dataengine": {"lineage": lineage},
    }
    versions = ", ".join(f"`{t}` version {v}" for t, v in lineage.get("source_versions", {}).items())
    return (
        "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n\n"
        f"# dataengine `{spec.name}` export\n\n"
        f"{rows} rows of a TRL {spec.trl_type} dataset ({spec.trainer}), exported from {versions}.\n\n"
        f"Columns: {', '.join(feats)}. Messages carry structured `tool_calls`; `tools` is the list of\n"
        "JSON schemas to pass as `apply_chat_template(..., tools=row[\"tools\"])`.\n\n"
        "Load with `datasets.load_dataset(\"<this folder>\", split=\"train\")`. The lineage record\n"
        "(`dataengine.lineage` above) rebuilds these rows: `dataengine store reexport <this folder> --out NEW`.\n"
    )


def write_rows(rows: pl.DataFrame, out: str | Path, fmt: str, lineage: dict[str, Any]) -> Path:
    """Write TRL rows of `lineage["kind"]` to `out` atomically with their lineage (module doc)."""
    out = Path(out)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if fmt == "parquet" and out.is_dir():
        raise ValueError(f"{out} is a folder; parquet exports write one file")
    if fmt != "parquet" and out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file; {fmt} exports write a dataset folder (README.md and data/)")
    kind = lineage["kind"]
    out = destination(out)
    text = json.dumps(lineage, sort_keys=True)
    if fmt == "parquet":
        table = to_arrow(rows, kind)
        replace_file(out, lambda tmp: _write_parquet(table, tmp, text))
        return out

    def build(folder: Path) -> None:
        data = folder / DATA_FILE[fmt]
        data.parent.mkdir(parents=True)
        if fmt == "hf":
            _write_parquet(to_arrow(rows, kind), data, text)
        else:
            _write_jsonl(rows, kind, data)
        card = _card(kind, fmt, rows.height, data, lineage, features(kind, rows.columns))
        (folder / CARD).write_text(card, encoding="utf-8")

    replace_folder(out, build)
    return out


def lineage_path(out: str | Path, fmt: str) -> Path:
    """Where an export's lineage record is: the parquet file itself, or the folder's README.md."""
    return Path(out) if fmt == "parquet" else Path(out) / CARD


def read_lineage(path: str | Path) -> dict[str, Any] | None:
    """The lineage record of an export (a parquet file, a dataset folder or its README.md, or a
    JSON file holding the record); None when the file carries none. ValueError when unreadable."""
    path = Path(path)
    if path.is_dir():
        path = path / CARD
        if not path.is_file():
            return None
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            raw = (pq.read_schema(path).metadata or {}).get(LINEAGE_KEY.encode())
            return None if raw is None else json.loads(raw)
        if path.suffix == ".md":
            from huggingface_hub.repocard import metadata_load

            meta = metadata_load(path) or {}
            return (meta.get("dataengine") or {}).get("lineage")
        if path.suffix == ".json":
            return json.loads(path.read_text())
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"lineage of {path} is unreadable: {exc}") from exc
    except Exception as exc:  # pyarrow and yaml raise their own types for broken files
        raise ValueError(f"lineage of {path} is unreadable: {exc}") from exc
    raise ValueError(f"{path}: not an export (expected a .parquet file, a dataset folder, README.md or .json)")


def load_exported(path: str | Path, fmt: str = "parquet", *, cache_dir: str | None = None):
    """The export as a datasets.Dataset, loaded the way a TRL user loads it."""
    import datasets

    if fmt == "parquet":
        return datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=cache_dir)
    return datasets.load_dataset(str(path), split="train", cache_dir=cache_dir)
