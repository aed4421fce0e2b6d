"""Checksums, file verification and repair of a store's data files.

- `commit_adds` finds the data files one Delta commit added (by the commit's token in its
  commitInfo) and `file_record` hashes them for the manifest, right after the commit.
- `verify_files` checks a table's active files: present, the size the Delta log records, the
  recorded sha256 (re-hashed when the file changed since its last verification, or always
  with `full`), and with `full` decoded with Polars' Parquet reader (the one queries use).
- `repair` drops every shard that has a damaged file (and its marker rows, and the rows of
  the tables declared with the same marker), so rerunning its run regenerates it.
- The Delta log: every log entry (`_delta_log/<version>.json`, checkpoints) a store commit
  writes has its sha256 recorded too, under the manifest table name `<table>/_delta_log`
  (`log_problems` checks them; a read re-hashes only entries whose stamp changed), so a
  damaged statistic is caught before a read skips files because of it. `heal` completes
  half-recorded commits (a writer killed between its commit and its records): each added
  file must decode, hold the row count and key range its log entry states, then it and the
  entry are recorded.
- Manifest marker rows must name store tables; `fix_markers` rewrites a damaged one from
  the `dataengine.marker` of the shard's commits in the Delta log.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
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

KINDS = ("missing", "size", "checksum", "unreadable", "unrecorded", "log")
LOG_DIR = "_delta_log"
# Immutable log files: commits and checkpoints (`_last_checkpoint` is rewritten in place).
_LOG_FILE = re.compile(r"^(\d{20})\.(?:json|checkpoint(?:\.\d+\.\d+)?\.parquet)$")


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
        if self.path.startswith(LOG_DIR + "/"):
            todo = (f"run `dataengine store repair --store {root}` to drop the files it added (then rerun their run)"
                    if self.kind == "log" else f"run `dataengine store repair --adopt --store {root}` to check and record it")
            return f"table {self.table!r}: Delta log entry {self.file} {self.detail}; {todo}"
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
    markers: list[str] = field(default_factory=list)
    healed: list[str] = field(default_factory=list)
    unrecorded_logs: list[FileProblem] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.damaged or self.unrecorded or self.adopted or self.markers or self.healed
                    or self.unrecorded_logs)

    def lines(self, root: Path) -> list[str]:
        """One line per finding and per dropped shard of a table, in the order done."""
        would = "would " if self.dry_run else ""
        out = [*self.markers, *(f"{would}heal: {line}" for line in self.healed)]
        out += [f"damaged: {p.message(root)}" for p in self.damaged]
        for table, path in self.removed_files:
            out.append(f"{would}remove data file {path} from table {table!r}")
        for d in self.dropped:
            rows = "rows" if d.rows is None else f"{d.rows} row(s)"
            out.append(f"{would}drop {rows} of run {d.key[0]!r} shard {d.key[1]!r} from table {d.table!r} ({d.how})")
        for p in self.adopted:
            out.append(f"{would}adopt: record the sha256 of {p.file} (table {p.table!r}; it decodes, but its content "
                       "before now cannot be verified)")
        for p in [*self.unrecorded, *self.unrecorded_logs]:
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
    checking, store.check_log = store.check_log, False  # a damaged log entry is what is repaired here
    try:
        _repair(store, tables, report, dry_run=dry_run, adopt=adopt)
    finally:
        store.check_log = checking
    return report


def _repair(store: Any, tables: list[str] | None, report: RepairReport, *, dry_run: bool, adopt: bool) -> None:
    report.markers = fix_markers(store, dry_run)
    damaged_logs: list[FileProblem] = []
    for table in tables or store.tables():
        problems = store.verify(table, full=True)
        if adopt and any(p.kind == "unrecorded" and p.path.startswith(LOG_DIR + "/") for p in problems):
            if dry_run:
                report.healed += [p.path for p in problems if p.kind == "unrecorded" and p.path.startswith(LOG_DIR)]
            else:
                report.healed += heal(store, table)
                problems = store.verify(table, full=True)
        for p in problems:
            if p.kind == "log":
                damaged_logs.append(p)
            elif p.kind == "unrecorded" and p.path.startswith(LOG_DIR + "/"):
                report.unrecorded_logs.append(p)
            else:
                (report.unrecorded if p.kind == "unrecorded" else report.damaged).append(p)
    for p in damaged_logs:
        # The entry stays in the log: drop the files it added that latest reads still use.
        report.damaged.append(p)
        records = store.manifest.records(p.table)
        active = {row["path"]: row for row in store.data_files(p.table).to_pylist()}
        for add in (_add_row(a["add"]) for a in _log_actions(p.file) or [] if "add" in a):
            if add["path"] in active:
                rec = records.get(add["path"])
                keys = rec.keys if rec is not None else tuple(k for k, _ in _read_keys(p.file.parent.parent / add["path"]))
                report.damaged.append(FileProblem(p.table, add["path"], p.file.parent.parent / add["path"], "log",
                                                  f"was added by damaged log entry {p.file.name}", keys,
                                                  active[add["path"]].get("num_records"),
                                                  rec.rows if rec is not None else ()))
    report.damaged = [p for p in report.damaged if not p.path.startswith(LOG_DIR + "/")] + [
        p for p in report.damaged if p.path.startswith(LOG_DIR + "/")]
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
        if p.path.startswith(LOG_DIR + "/"):
            continue
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
    if not dry_run:
        for p in damaged_logs:
            # Its files are gone from the latest version: accept the entry as it now reads.
            record_log(store, p.table, [int(p.file.name[:20])], source="repair")


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
        heal(store, table)  # records the log entry just written (it adds no files)
    for key in sorted(leftover):
        declared = [m for t, m in store.manifest.declarations(key) if t == table]
        store.append(table, [], run_id=key[0], shard_id=key[1], marker=declared[0] if declared else None)


# ---------------------------------------------------------------------------- the Delta log


def log_table(table: str) -> str:
    """The manifest table name under which the log entries of `table` are recorded."""
    return f"{table}/{LOG_DIR}"


def log_files(base: Path) -> dict[str, Stamp]:
    """{file name: stamp} of the immutable files of the Delta log of the table at `base`."""
    out = {}
    try:
        entries = list(os.scandir(base / LOG_DIR))
    except OSError:
        return out
    for entry in entries:
        if _LOG_FILE.match(entry.name):
            try:
                st = entry.stat()
            except OSError:
                continue
            out[entry.name] = Stamp(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return out


def record_log(store: Any, table: str, versions: list[int], *, source: str = "commit") -> None:
    """Record the sha256 of the log files of `versions` of `table` (commit and checkpoints)."""
    base = store.table_path(table) / LOG_DIR
    wanted = set(versions)
    records = []
    for name, stamp in log_files(store.table_path(table)).items():
        if int(_LOG_FILE.match(name).group(1)) in wanted:
            records.append(file_record(base, name, stamp.size, [], version=int(name[:20]), source=source))
    store.manifest.record(log_table(table), records)


def log_problems(store: Any, table: str, *, full: bool, seen: dict[str, Stamp] | None = None) -> list[FileProblem]:
    """The damaged (kind "log") and, with `full`, unrecorded log entries of `table`. `seen`:
    {name: stamp} of entries this process already found intact (skipped while unchanged)."""
    base = store.table_path(table)
    files = log_files(base)
    if seen is not None and not full and all(seen.get(n) == st for n, st in files.items()):
        return []
    records = store.manifest.records(log_table(table))
    problems, verified = [], {}
    for name, stamp in sorted(files.items()):
        if seen is not None and not full and seen.get(name) == stamp:
            continue
        rel, path, record = f"{LOG_DIR}/{name}", base / LOG_DIR / name, records.get(name)
        if record is None:
            if full:
                problems.append(FileProblem(table, rel, path, "unrecorded", (
                    "has no recorded checksum (written before log checksums were recorded, by another tool, or by "
                    "a writer killed right after its commit)")))
            continue
        if full or not record.verified_since(stamp):
            if record.size != stamp.size or sha256_file(path) != record.sha256:
                problems.append(FileProblem(table, rel, path, "log", (
                    "does not match the sha256 recorded at its commit (damaged: its file statistics could make "
                    "reads skip or misread data files)")))
                continue
            verified[name] = stamp
        if seen is not None:
            seen[name] = stamp
    store.manifest.mark_verified(log_table(table), verified)
    return problems


def _log_actions(path: Path) -> list[dict[str, Any]] | None:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    except (OSError, ValueError):
        return None


def _content_problem(path: Path, add: dict[str, Any]) -> str | None:
    """Why data file `path` does not hold what its add action states (rows, key range), or None."""
    try:
        frame = scan_parquet(path).select(
            pl.len().alias("n"), *(getattr(pl.col(c), side)().alias(f"{side}.{c}")
                                   for c in ("run_id", "shard_id") for side in ("min", "max"))).collect()
    except BaseException as exc:  # Polars panics on some damage
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return f"cannot be decoded: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}"
    got = frame.row(0, named=True)
    if add.get("num_records") is not None and got["n"] != add["num_records"]:
        return f"holds {got['n']} rows, its commit states {add['num_records']}"
    for key, value in got.items():
        if key != "n" and add.get(key) is not None and value != add[key]:
            return f"has {key} {value!r}, its commit states {add[key]!r}"
    return None


def heal(store: Any, table: str) -> list[str]:
    """Record the half-recorded commits of `table` (module doc); return one line per entry
    healed. An entry whose files do not match stays unrecorded (`check --full` names it)."""
    if not store.logs_recorded:
        return []  # object storage: its log is not checksummed (docs/store.md)
    base = store.table_path(table)
    files = log_files(base)
    if not files:
        return []
    logged = store.manifest.records(log_table(table))
    todo = sorted(n for n in files if n not in logged)
    if not todo:
        return []
    recorded = store.manifest.records(table)
    active = {row["path"] for row in store.data_files(table).to_pylist()}
    lines = []
    for name in todo:
        version = int(name[:20])
        new: list[FileRecord] = []
        problem = None
        if name.endswith(".json"):
            actions = _log_actions(base / LOG_DIR / name)
            if actions is None:
                continue
            for add in (_add_row(a["add"]) for a in actions if "add" in a):
                rel = add["path"]
                if rel in recorded or rel not in active:
                    continue  # recorded already, or replaced since (latest reads never use it)
                if (problem := _content_problem(base / rel, add)) is not None:
                    break
                new.append(file_record(base, rel, add["size_bytes"], file_keys(base, add), version=version,
                                       source="heal"))
        if problem is not None:
            continue
        if new:
            store.manifest.record(table, new)
        record_log(store, table, [version], source="heal")
        lines.append(f"table {table!r}: recorded log entry {name}" + (f" and {len(new)} data file(s)" if new else ""))
    return lines


# ------------------------------------------------------------------------------ markers


def fix_markers(store: Any, dry_run: bool) -> list[str]:
    """Rewrite manifest marker rows that do not name store tables: the table and marker of
    the shard's commits in the Delta log (`dataengine.marker`), else the closest table names;
    a row neither finds is removed. Returns one line per row."""
    from storage.schemas import TABLES

    bad = [row for row in store.manifest.marker_rows()
           if row[0] not in TABLES or row[3] not in TABLES or row[0] == row[3]]
    if not bad:
        return []
    logged: dict[Key, set[tuple[str, str]]] = {}
    for name in store.tables():
        for commit in store.history(name):
            key = (commit.get("dataengine.run_id"), commit.get("dataengine.shard_id"))
            if commit.get("dataengine.marker"):
                logged.setdefault(key, set()).add((name, commit["dataengine.marker"]))
    would = "would " if dry_run else ""
    lines = []
    for tbl, run_id, shard_id, marker in bad:
        fixed = None
        for cand_tbl, cand_marker in sorted(logged.get((run_id, shard_id), ())):
            if cand_tbl == tbl or cand_marker == marker or (tbl not in TABLES and marker not in TABLES):
                fixed = (cand_tbl, cand_marker)
                break
        how = "from the Delta log"
        if fixed is None:
            near_tbl = tbl if tbl in TABLES else next(iter(difflib.get_close_matches(tbl, TABLES, 1, 0.6)), None)
            near_marker = marker if marker in TABLES else next(
                iter(difflib.get_close_matches(marker, TABLES, 1, 0.6)), None)
            if near_tbl and near_marker and near_tbl != near_marker:
                fixed, how = (near_tbl, near_marker), "by the closest table names"
        shard = f"run {run_id!r} shard {shard_id!r}"
        if fixed is None:
            lines.append(f"{would}remove manifest marker row ({tbl!r} needs {marker!r}) of {shard}: names no table")
        else:
            lines.append(f"{would}fix manifest marker row of {shard}: ({tbl!r} needs {marker!r}) -> "
                         f"({fixed[0]!r} needs {fixed[1]!r}) {how}")
        if not dry_run:
            store.manifest.declare(tbl, run_id, shard_id, None)
            if fixed is not None:
                store.manifest.declare(fixed[0], run_id, shard_id, fixed[1])
    return lines
