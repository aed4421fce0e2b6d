"""Checksums, file verification and repair of a store's data files.

- `commit_adds` finds the data files one Delta commit added (by the commit's token in its
  commitInfo) and `file_record` hashes them for the manifest, right after the commit.
- `verify_files` checks a table's active files: present, the size the Delta log records, the
  recorded sha256 (re-hashed when the file changed since its last verification, or always
  with `full`), and with `full` decoded with Polars' Parquet reader (the one queries use).
- `repair` drops every shard that has a damaged file (and its marker rows, and the rows of
  the tables declared with the same marker), so rerunning its run regenerates it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import polars as pl

from storage.errors import StoreError
from storage.location import scan_parquet
from storage.manifest import FileRecord, Key, Stamp

KINDS = ("missing", "size", "checksum", "unreadable", "unrecorded")


@dataclass(frozen=True)
class FileProblem:
    """One data file that failed verification.

    kind: missing | size | checksum | unreadable | unrecorded (no checksum recorded).
    keys: the (run_id, shard_id) shards the file holds (empty when unknown); rows: its row
    count from the Delta log.
    """

    table: str
    path: str
    file: Path
    kind: str
    detail: str
    keys: tuple[Key, ...] = ()
    rows: int | None = None
    key_rows: tuple[int | None, ...] = ()

    def shards(self) -> str:
        if not self.keys:
            return "shards unknown"
        text = ", ".join(f"run {r!r} shard {s!r}" for r, s in self.keys[:3])
        return text + (f" and {len(self.keys) - 3} more shard(s)" if len(self.keys) > 3 else "")

    def message(self, root: Path) -> str:
        """One line: the table, the file, its shards, what is wrong and what to run."""
        if self.kind == "unrecorded":
            todo = f"run `dataengine store repair --adopt --store {root}` to record it once it decodes"
        else:
            todo = (f"run `dataengine store repair --store {root}` to drop its shard(s), then rerun their run "
                    "to regenerate them")
        return f"table {self.table!r}: data file {self.file} ({self.shards()}) {self.detail}; {todo}"


def _read_keys(path: Path) -> list[tuple[Key, int]]:
    """[((run_id, shard_id), rows)] of the shards one data file holds, read from the file."""
    frame = scan_parquet(path).group_by("run_id", "shard_id").len().sort("run_id", "shard_id").collect()
    return [((r, s), n) for r, s, n in frame.iter_rows()]


def file_keys(base: Path, row: dict[str, Any]) -> list[tuple[Key, int | None]]:
    """[(key, rows)] of a data file: from its statistics when they name one shard, else read."""
    single = stats_keys(row)
    return [(single[0], row.get("num_records"))] if single else _read_keys(base / row["path"])


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_record(base: Path, rel: str, size: int, keys: list[tuple[Key, int | None]], *, version: int | None,
                source: str) -> FileRecord:
    """The manifest record of data file `base/rel` holding [(key, rows)], as it is now
    (hashed), verified now."""
    path = base / rel
    stamp = Stamp.of(path)
    if stamp.size != size:
        raise StoreError(f"data file {path} has {stamp.size} bytes right after its commit, the Delta log records {size}")
    digest = sha256_file(path)
    return FileRecord(rel, size, digest, tuple(k for k, _ in keys), tuple(n for _, n in keys), version, source, stamp,
                      time.time_ns())


def commit_adds(table_path: Path, token: str, latest: int, read_version: int) -> tuple[int, list[dict[str, Any]]]:
    """(version, [{path, size_bytes, min.run_id, ...}]) of the commit of `table_path` whose commitInfo carries
    `dataengine.commit == token`, searched from `latest` down to `read_version + 1`, then up."""
    log = table_path / "_delta_log"

    def read(version: int) -> list[dict[str, Any]] | None:
        try:
            lines = (log / f"{version:020d}.json").read_text(encoding="utf-8").split("\n")
        except FileNotFoundError:
            return None
        actions = [json.loads(line) for line in lines if line.strip()]
        if not any(a.get("commitInfo", {}).get("dataengine.commit") == token for a in actions):
            return None
        return [_add_row(a["add"]) for a in actions if "add" in a]

    for version in range(max(latest, read_version + 1), read_version, -1):
        if (adds := read(version)) is not None:
            return version, adds
    version = latest + 1
    while (log / f"{version:020d}.json").exists():
        if (adds := read(version)) is not None:
            return version, adds
        version += 1
    raise StoreError(
        f"table {table_path.name!r}: cannot find the commit just written in {log} to record its checksums; "
        "run `dataengine store repair --adopt`"
    )


def _add_row(add: dict[str, Any]) -> dict[str, Any]:
    """A Delta add action as a Store.data_files row (path, size_bytes, min/max keys)."""
    stats = json.loads(add.get("stats") or "{}")
    row = {"path": unquote(add["path"]), "size_bytes": int(add["size"]), "num_records": stats.get("numRecords")}
    for side in ("min", "max"):
        values = stats.get(f"{side}Values") or {}
        for col in ("run_id", "shard_id"):
            row[f"{side}.{col}"] = values.get(col)
    return row


def stats_keys(row: dict[str, Any]) -> tuple[Key, ...]:
    """The single (run_id, shard_id) of a data file when its Delta min/max statistics agree."""
    run, shard = row.get("min.run_id"), row.get("min.shard_id")
    if run is not None and shard is not None and run == row.get("max.run_id") and shard == row.get("max.shard_id"):
        return ((run, shard),)
    return ()


def _age_s(modification_time: Any) -> float:
    if modification_time is None:
        return float("inf")
    if isinstance(modification_time, datetime):
        return time.time() - modification_time.timestamp()
    return time.time() - float(modification_time) / 1000


def _decode_error(path: Path) -> str | None:
    """None when Polars decodes the whole file, else the first line of its error."""
    try:
        scan_parquet(path).collect()
    except BaseException as exc:  # Polars panics on some damage (PanicException)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return None


def _file_problem(store: Any, path: Path, row: dict[str, Any], record: FileRecord | None, full: bool,
                  verified: dict[str, Stamp]) -> tuple[str | None, str]:
    """(kind, detail) of what is wrong with one data file, or (None, ""); adds the file's
    stamp to `verified` when its hash was checked and matched."""
    try:
        stamp = Stamp.of(path)
    except FileNotFoundError:
        return "missing", "is missing"
    logged = row.get("size_bytes")
    if logged is not None and stamp.size != logged:
        return "size", f"is truncated or damaged: {stamp.size} bytes, the Delta log records {logged}"
    if record is None:
        if not full and _age_s(row.get("modification_time")) <= store.record_grace_s:
            return None, ""
        if full and (error := _decode_error(path)) is not None:
            return "unreadable", f"cannot be decoded: {error}"
        return "unrecorded", ("has no recorded checksum (written before checksums were recorded, by another tool, "
                              "or by a writer killed right after its commit)")
    if full or not record.verified_since(stamp):
        if record.size != stamp.size or sha256_file(path) != record.sha256:
            return "checksum", "does not match the sha256 recorded when it was written (damaged on disk)"
        verified[row["path"]] = stamp
    if full and (error := _decode_error(path)) is not None:
        return "unreadable", f"matches its checksum but cannot be decoded: {error}"
    return None, ""


def verify_files(store: Any, table: str, files, *, full: bool) -> list[FileProblem]:
    """The problems of `table`'s data files `files` (Store.data_files rows); see module doc."""
    base = store.table_path(table)
    records = store.manifest.records(table)
    problems: list[FileProblem] = []
    verified: dict[str, Stamp] = {}
    for row in files.to_pylist():
        rel, path = row["path"], base / row["path"]
        record = records.get(rel)
        keys = record.keys if record is not None else stats_keys(row)
        key_rows = record.rows if record is not None else (row.get("num_records"),) * len(keys)
        kind, detail = _file_problem(store, path, row, record, full, verified)
        if kind is not None:
            problems.append(FileProblem(table, rel, path, kind, detail, keys, row.get("num_records"), key_rows))
    store.manifest.mark_verified(table, verified)
    return problems


# ---------------------------------------------------------------------------------- repair


@dataclass
class Dropped:
    """Rows of one shard of one table that repair removed (or would remove): rows None when
    unknown (a damaged file holding several shards), how: why they went."""

    table: str
    key: Key
    rows: int | None
    how: str


@dataclass
class RepairReport:
    """What `repair` found and did (`dry_run`: what it would do)."""

    dry_run: bool
    damaged: list[FileProblem] = field(default_factory=list)
    unrecorded: list[FileProblem] = field(default_factory=list)
    adopted: list[FileProblem] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    removed_files: list[tuple[str, str]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.damaged or self.unrecorded or self.adopted)

    def lines(self, root: Path) -> list[str]:
        """One line per finding and per dropped shard of a table, in the order done."""
        would = "would " if self.dry_run else ""
        out = [f"damaged: {p.message(root)}" for p in self.damaged]
        for table, path in self.removed_files:
            out.append(f"{would}remove data file {path} from table {table!r}")
        for d in self.dropped:
            rows = "rows" if d.rows is None else f"{d.rows} row(s)"
            out.append(f"{would}drop {rows} of run {d.key[0]!r} shard {d.key[1]!r} from table {d.table!r} ({d.how})")
        for p in self.adopted:
            out.append(f"{would}adopt: record the sha256 of {p.file} (table {p.table!r}; it decodes, but its content "
                       "before now cannot be verified)")
        for p in self.unrecorded:
            out.append(f"unverified: {p.message(root)}")
        runs = sorted({d.key[0] for d in self.dropped})
        if runs:
            out.append(f"rerun run(s) {', '.join(repr(r) for r in runs)} to regenerate the dropped shard(s)")
        if not out:
            out.append("nothing to repair: every data file is present, matches its checksum and decodes")
        return out


def repair(store: Any, tables: list[str] | None = None, *, dry_run: bool = False, adopt: bool = False) -> RepairReport:
    """See `Store.repair`."""
    report = RepairReport(dry_run=dry_run)
    for table in tables or store.tables():
        for p in store.verify(table, full=True):
            (report.unrecorded if p.kind == "unrecorded" else report.damaged).append(p)
    if adopt:
        report.adopted, report.unrecorded = report.unrecorded, []
        if not dry_run:
            for p in report.adopted:
                keys = list(zip(p.keys, p.key_rows, strict=True)) or _read_keys(p.file)
                size = p.file.stat().st_size
                store.manifest.record(p.table, [file_record(store.table_path(p.table), p.path, size, keys,
                                                            version=None, source="adopt")])

    # {table: {key: why}} and the damaged files of each table.
    drops: dict[str, dict[Key, str]] = {}
    bad_files: dict[str, set[str]] = {}
    markers: set[str] = set()
    for p in report.damaged:
        bad_files.setdefault(p.table, set()).add(p.path)
        for key in p.keys:
            related = store.manifest.declarations(key)
            group = {t for t, _ in related} | {m for _, m in related}
            markers |= {m for _, m in related}
            drops.setdefault(p.table, {})[key] = f"damaged file {p.path}"
            if p.table in group:
                for t in sorted(group - {p.table}):
                    how = "its commit marker" if t in markers else f"same shard as damaged file {p.path} of {p.table!r}"
                    drops.setdefault(t, {}).setdefault(key, how)
    # Marker tables first: the shard is invisible from the first commit on.
    order = sorted(set(drops) | set(bad_files), key=lambda t: (t not in markers, t))
    for table in order:
        _drop(store, table, drops.get(table, {}), bad_files.get(table, set()), report, dry_run)
    return report


def _drop(store: Any, table: str, keys: dict[Key, str], bad: set[str], report: RepairReport, dry_run: bool) -> None:
    """Remove `table`'s damaged files and every file holding only dropped shards in one
    commit, then delete the dropped shards' rows left in files shared with other shards."""
    from deltalake import CommitProperties
    from deltalake.transaction import RemoveAction

    if not store.has_table(table):
        return
    dt = store._delta(table)
    records = store.manifest.records(table)
    base = store.table_path(table)
    dropped = set(keys)
    remove: list[dict] = []
    leftover: set[Key] = set()  # dropped shards with rows in healthy files that also hold other shards
    rows: dict[Key, int | None] = {}

    def add(key: Key, n: int | None) -> None:
        if key in rows and rows[key] is None:
            return
        rows[key] = None if n is None else rows.get(key, 0) + n

    def count(rel: str, hits: set[Key]) -> None:
        frame = scan_parquet(base / rel).select("run_id", "shard_id")
        for key in hits:
            n = frame.filter((pl.col("run_id") == key[0]) & (pl.col("shard_id") == key[1])).select(pl.len()).collect().item()
            if n:
                add(key, n)

    for row in store.data_files(table).to_pylist():
        rel = row["path"]
        held = set(records[rel].keys) if rel in records else set(stats_keys(row))
        recorded = dict(zip(records[rel].keys, records[rel].rows, strict=False)) if rel in records else {}
        if rel in bad:
            remove.append(row)
            for key in held & dropped:
                add(key, row["num_records"] if len(held) == 1 else recorded.get(key))
            if not held:
                report.removed_files.append((table, rel))
        elif not held:
            # Keys unknown (no record, mixed statistics): read them from the healthy file.
            held = {k for k, _ in _read_keys(base / rel)}
            if held & dropped:
                count(rel, held & dropped)
                leftover |= held & dropped
        elif held <= dropped:
            remove.append(row)
            if len(held) == 1:
                add(next(iter(held)), row["num_records"])
            else:
                count(rel, held)
        elif held & dropped:
            count(rel, held & dropped)
            leftover |= held & dropped
    for key, how in sorted(keys.items()):
        if key in rows:
            report.dropped.append(Dropped(table, key, rows[key], how))
    if dry_run:
        return
    if remove:
        now = int(time.time() * 1000)
        dt.create_write_transaction(
            [RemoveAction(r["path"], True, now, r["size_bytes"]) for r in remove], mode="append", schema=dt.schema(),
            commit_properties=CommitProperties(custom_metadata={
                "dataengine.operation": "repair",
                "dataengine.removed": json.dumps(sorted(r["path"] for r in remove)),
            }),
        )
    for key in sorted(leftover):
        declared = [m for t, m in store.manifest.declarations(key) if t == table]
        store.append(table, [], run_id=key[0], shard_id=key[1], marker=declared[0] if declared else None)
