"""The store's manifest: `<root>/_manifest.sqlite` (stdlib sqlite3) for a local store, two
append-only Delta tables under `<root>/_manifest/` for a store in object storage
(`ObjectManifest`, same methods).

Three tables:

- `files`: one row per data file a `Store` committed (append or compaction): table, path
  (relative to the table folder, as in the Delta log), size, sha256, the (run_id, shard_id)
  keys it holds, the Delta version that added it and how it was recorded (commit, compact,
  adopt). Data files are immutable and their names unique, so a row stays valid through later
  commits, compaction (which adds new files, recorded too) and time travel; `vacuum` forgets
  the files it deletes.
- the verification cache (columns of `files`): the (size, mtime_ns, ctime_ns, inode) stamp of
  the file when its hash last matched, and when that was. A read re-hashes a file whose stamp
  changed or that was modified less than `RACY_NS` before its last verification.
- `markers`: shards written as part of a multi-table shard, `(table, run_id, shard_id) ->
  marker table`. Such a shard is committed only once the marker table has rows of the same
  (run_id, shard_id); the declaration is written before the data commit.

SQLite serialises concurrent writers with file locks (local file systems); every call opens
its own connection, so the object is safe to share across threads and forks. Object stores have
no file locks: see `ObjectManifest`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from storage.errors import StoreError
from storage.schemas import TABLES

MANIFEST_FILE = "_manifest.sqlite"
MANIFEST_DIR = "_manifest"
# A file modified within this long before its verification is hashed again on the next read:
# a later change in the same timestamp tick would otherwise keep the old stamp.
RACY_NS = 1_000_000_000

Key = tuple[str, str]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    tbl TEXT NOT NULL, path TEXT NOT NULL, size INTEGER NOT NULL, sha256 TEXT NOT NULL,
    shards TEXT NOT NULL, version INTEGER, source TEXT NOT NULL, recorded_at REAL NOT NULL,
    v_size INTEGER, v_mtime_ns INTEGER, v_ctime_ns INTEGER, v_ino INTEGER, v_at_ns INTEGER,
    PRIMARY KEY (tbl, path));
CREATE TABLE IF NOT EXISTS markers (
    tbl TEXT NOT NULL, run_id TEXT NOT NULL, shard_id TEXT NOT NULL, marker TEXT NOT NULL,
    PRIMARY KEY (tbl, run_id, shard_id));
"""


@dataclass(frozen=True)
class Stamp:
    """What a stat says about a file; equal stamps mean the file was not written since."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int

    @classmethod
    def of(cls, path: Path) -> Stamp:
        st = path.stat()
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@dataclass(frozen=True)
class FileRecord:
    """One recorded data file: path (relative), size, sha256, keys ((run_id, shard_id) pairs)
    with rows (row count of each key), version (Delta version that added it), source (commit
    | compact | adopt), and the stamp and time (ns) of its last successful verification."""

    path: str
    size: int
    sha256: str
    keys: tuple[Key, ...]
    rows: tuple[int | None, ...] = ()
    version: int | None = None
    source: str = "commit"
    verified: Stamp | None = None
    verified_at_ns: int | None = None

    def verified_since(self, stamp: Stamp) -> bool:
        """Whether the hash matched for exactly this stamp, and the file was not modified
        within RACY_NS before that check."""
        return (
            self.verified == stamp
            and self.verified_at_ns is not None
            and max(stamp.mtime_ns, stamp.ctime_ns) < self.verified_at_ns - RACY_NS
        )


class Manifest:
    """The sidecar of one store root (module doc)."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / MANIFEST_FILE

    @contextmanager
    def _db(self, *, write: bool) -> Iterator[sqlite3.Connection | None]:
        """A connection in one transaction; None when reading a manifest that does not exist."""
        if not write and not self.path.exists():
            yield None
            return
        try:
            with closing(sqlite3.connect(self.path, timeout=60, isolation_level=None)) as db:
                db.execute("PRAGMA busy_timeout = 60000")
                db.executescript(_SCHEMA)
                if write:
                    db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                    if write:
                        db.execute("COMMIT")
                except BaseException:
                    if write and db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
        except sqlite3.OperationalError as exc:
            raise StoreError(f"store manifest {self.path} is not usable: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"store manifest {self.path} is damaged ({exc}); move it away and run "
                "`dataengine store repair --adopt` to record the checksums of the current files again"
            ) from exc

    # ---- checksums --------------------------------------------------------------------------

    def record(self, table: str, records: Iterable[FileRecord]) -> None:
        rows = [
            (table, r.path, r.size, r.sha256, json.dumps([[*k, n] for k, n in zip(r.keys, r.rows or [None] * len(r.keys), strict=True)]), r.version, r.source, time.time(),
             *(_stamp_row(r.verified, r.verified_at_ns)))
            for r in records
        ]
        if not rows:
            return
        with self._db(write=True) as db:
            db.executemany("INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)

    def records(self, table: str, paths: Iterable[str] | None = None) -> dict[str, FileRecord]:
        """{path: FileRecord} of `table` (only `paths` when given)."""
        with self._db(write=False) as db:
            if db is None:
                return {}
            rows = db.execute(
                "SELECT path, size, sha256, shards, version, source, v_size, v_mtime_ns, v_ctime_ns, v_ino, v_at_ns "
                "FROM files WHERE tbl = ?", (table,)
            ).fetchall()
        wanted = None if paths is None else set(paths)
        out = {}
        for path, size, sha, shards, version, source, vs, vm, vc, vi, vat in rows:
            if wanted is not None and path not in wanted:
                continue
            stamp = Stamp(vs, vm, vc, vi) if vs is not None else None
            held = json.loads(shards)
            out[path] = FileRecord(path, size, sha, tuple((k[0], k[1]) for k in held), tuple(k[2] if len(k) > 2 else None for k in held),
                                   version, source, stamp, vat)
        return out

    def mark_verified(self, table: str, stamps: dict[str, Stamp]) -> None:
        """Cache that the files' hashes matched now, at these stamps (best effort: a read-only
        store just re-hashes next time)."""
        if not stamps:
            return
        now = time.time_ns()
        try:
            with self._db(write=True) as db:
                db.executemany(
                    "UPDATE files SET v_size=?, v_mtime_ns=?, v_ctime_ns=?, v_ino=?, v_at_ns=? WHERE tbl=? AND path=?",
                    [(*_stamp_row(s, now), table, p) for p, s in stamps.items()],
                )
        except StoreError:
            pass

    def forget(self, table: str, paths: Iterable[str]) -> None:
        rows = [(table, p) for p in paths]
        if rows:
            with self._db(write=True) as db:
                db.executemany("DELETE FROM files WHERE tbl = ? AND path = ?", rows)

    # ---- commit markers ---------------------------------------------------------------------

    def declare(self, table: str, run_id: str, shard_id: str, marker: str | None) -> None:
        """Record that shard (run_id, shard_id) of `table` is committed only once `marker` has
        rows of it; marker None removes such a declaration."""
        with self._db(write=True) as db:
            if marker is None:
                db.execute("DELETE FROM markers WHERE tbl=? AND run_id=? AND shard_id=?", (table, run_id, shard_id))
            else:
                db.execute("INSERT OR REPLACE INTO markers VALUES (?,?,?,?)", (table, run_id, shard_id, marker))

    def undeclare_if_present(self, table: str, run_id: str, shard_id: str) -> None:
        """Drop a declaration without creating the manifest for stores that never had one."""
        if self.path.exists():
            self.declare(table, run_id, shard_id, None)

    def declared(self, table: str) -> dict[str, set[Key]]:
        """{marker table: {(run_id, shard_id)}} of the shards of `table` that need a marker."""
        with self._db(write=False) as db:
            if db is None:
                return {}
            rows = db.execute("SELECT marker, run_id, shard_id FROM markers WHERE tbl = ?", (table,)).fetchall()
        out: dict[str, set[Key]] = {}
        for marker, run_id, shard_id in rows:
            _check_marker(self.path, table, run_id, shard_id, marker)
            out.setdefault(marker, set()).add((run_id, shard_id))
        return out

    def marker_rows(self) -> list[tuple[str, str, str, str]]:
        """Every marker row (table, run_id, shard_id, marker), unchecked (for repair)."""
        with self._db(write=False) as db:
            if db is None:
                return []
            return db.execute("SELECT tbl, run_id, shard_id, marker FROM markers ORDER BY tbl, run_id, shard_id").fetchall()

    def declarations(self, key: Key) -> list[tuple[str, str]]:
        """[(table, marker)] of every table whose shard `key` needs a marker."""
        with self._db(write=False) as db:
            if db is None:
                return []
            rows = db.execute(
                "SELECT tbl, marker FROM markers WHERE run_id = ? AND shard_id = ? ORDER BY tbl", key
            ).fetchall()
        for table, marker in rows:
            _check_marker(self.path, table, *key, marker)
        return rows


def _check_marker(where: Any, table: str, run_id: str, shard_id: str, marker: str) -> None:
    """A marker row must name two different store tables: else a one-line StoreError."""
    if table not in TABLES or marker not in TABLES or table == marker:
        raise StoreError(
            f"store manifest {where} is damaged: its marker row of run {run_id!r} shard {shard_id!r} says table "
            f"{table!r} needs marker {marker!r}, which is not a pair of store tables; run `dataengine store repair` "
            "to rewrite it from the Delta log"
        )


def _stamp_row(stamp: Stamp | None, at_ns: int | None) -> tuple:
    if stamp is None:
        return (None, None, None, None, None)
    return (stamp.size, stamp.mtime_ns, stamp.ctime_ns, stamp.ino, at_ns)


def open_manifest(root: Any) -> Manifest | ObjectManifest:
    """The manifest of the store at `root`: SQLite for a local folder, Delta tables for a bucket."""
    from storage.location import is_object_path

    return ObjectManifest(root) if is_object_path(root) else Manifest(root)


# A checkpoint every 10 commits: opening a table then reads at most 10 log entries, not all.
CHECKPOINTS = {"delta.checkpointInterval": "10"}
_FILES_SCHEMA = pa.schema([
    pa.field("tbl", pa.string(), nullable=False), pa.field("path", pa.string(), nullable=False),
    pa.field("size", pa.int64()), pa.field("sha256", pa.string()), pa.field("shards", pa.string()),
    pa.field("version", pa.int64()), pa.field("source", pa.string()), pa.field("recorded_at", pa.float64()),
    *(pa.field(c, pa.int64()) for c in ("v_size", "v_mtime_ns", "v_ctime_ns", "v_ino", "v_at_ns")),
    pa.field("seq", pa.int64(), nullable=False), pa.field("deleted", pa.bool_(), nullable=False),
])
_MARKERS_SCHEMA = pa.schema([
    pa.field("tbl", pa.string(), nullable=False), pa.field("run_id", pa.string(), nullable=False),
    pa.field("shard_id", pa.string(), nullable=False), pa.field("marker", pa.string()),
    pa.field("seq", pa.int64(), nullable=False),
])


class ObjectManifest:
    """The manifest of a store in object storage: `<root>/_manifest/files` and
    `<root>/_manifest/markers`, two Delta tables that are only ever appended to.

    Object stores have no file locks, but Delta commits each log entry with a conditional put,
    and appends never conflict with each other, so any number of writers on any machines
    record concurrently (tests/test_object_store.py). A row never changes: the newest row
    (highest `seq`) of a file path or of a (table, run_id, shard_id) wins. A re-verification
    appends the record with its new stamp, `forget` appends a row with `deleted`, undeclaring a
    marker appends a row whose marker is null. `seq` is nanoseconds since the epoch, raised
    above the newest row of the same key read before writing, so calls made one after another
    keep their order even across machines whose clocks differ. A read that finds more than
    COMPACT_FILES small files compacts them (best effort; rows are kept).
    """

    COMPACT_FILES = 64

    def __init__(self, root: Any) -> None:
        from storage.location import delta_options

        self.root = root
        self.path = root / MANIFEST_DIR
        self._options = delta_options(root)

    # ---- Delta plumbing -----------------------------------------------------------------------

    def _read(self, name: str, predicate: Any, keys: list[str]) -> Any:
        """The newest row per `keys` of table `name` among the rows matching `predicate`
        (a polars DataFrame; empty when the table does not exist yet)."""
        import polars as pl
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        schema = _FILES_SCHEMA if name == "files" else _MARKERS_SCHEMA
        uri = str(self.path / name)
        try:
            dt = DeltaTable(uri, storage_options=self._options)
            frame = pl.scan_delta(dt).filter(predicate).collect()
        except TableNotFoundError:
            return pl.from_arrow(schema.empty_table())
        except (DeltaError, OSError, pl.exceptions.PolarsError) as exc:
            raise StoreError(f"store manifest {uri} is not readable: {_first_line(exc)}") from exc
        if len(dt.file_uris()) > self.COMPACT_FILES:
            self._compact(dt)
        return frame.sort("seq").group_by(keys, maintain_order=True).last()

    def _append(self, name: str, rows: list[dict[str, Any]]) -> None:
        from deltalake import write_deltalake
        from deltalake.exceptions import DeltaError

        if not rows:
            return
        schema = _FILES_SCHEMA if name == "files" else _MARKERS_SCHEMA
        data = pa.Table.from_pylist(rows, schema=schema)
        uri = str(self.path / name)
        last: Exception | None = None
        for attempt in range(12):
            try:
                # The first append creates the table; racing creators retry as appenders.
                write_deltalake(uri, data, mode="append", storage_options=self._options, configuration=CHECKPOINTS)
                return
            except DeltaError as exc:
                last = exc
                time.sleep(min(0.05 * 2**attempt, 2.0))
        raise StoreError(f"store manifest {uri}: append failed after 12 attempts: {_first_line(last)}")

    def _compact(self, dt: Any) -> None:
        try:
            dt.optimize.compact()
        except Exception:  # noqa: BLE001 - best effort: a concurrent compaction or a read-only user
            pass

    @staticmethod
    def _seq(prior: Any) -> int:
        """Now in ns, above every `seq` of `prior` (a frame of the rows being superseded)."""
        newest = prior["seq"].max() if prior.height else None
        return max(time.time_ns(), (newest or 0) + 1)

    # ---- checksums --------------------------------------------------------------------------

    def _files(self, table: str) -> Any:
        import polars as pl

        return self._read("files", pl.col("tbl") == table, ["path"]).filter(~pl.col("deleted"))

    def record(self, table: str, records: Iterable[FileRecord]) -> None:
        now, seq = time.time(), time.time_ns()
        self._append("files", [_file_row(table, r, now, seq) for r in records])

    def records(self, table: str, paths: Iterable[str] | None = None) -> dict[str, FileRecord]:
        """{path: FileRecord} of `table` (only `paths` when given)."""
        wanted = None if paths is None else set(paths)
        out = {}
        for row in self._files(table).iter_rows(named=True):
            if wanted is None or row["path"] in wanted:
                out[row["path"]] = _file_record(row)
        return out

    def mark_verified(self, table: str, stamps: dict[str, Stamp]) -> None:
        """Cache that the files' hashes matched now, at these stamps (best effort)."""
        import polars as pl

        if not stamps:
            return
        try:
            current = self._files(table).filter(pl.col("path").is_in(list(stamps)))
            now_ns, seq = time.time_ns(), self._seq(current)
            rows = []
            for row in current.iter_rows(named=True):
                record = _file_record(row)
                verified = FileRecord(record.path, record.size, record.sha256, record.keys, record.rows,
                                      record.version, record.source, stamps[row["path"]], now_ns)
                rows.append(_file_row(table, verified, row["recorded_at"], seq))
            self._append("files", rows)
        except StoreError:
            pass

    def forget(self, table: str, paths: Iterable[str]) -> None:
        import polars as pl

        paths = list(paths)
        if not paths:
            return
        current = self._files(table).filter(pl.col("path").is_in(paths))
        seq = self._seq(current)
        self._append("files", [{"tbl": table, "path": p, "seq": seq, "deleted": True} for p in paths])

    # ---- commit markers ---------------------------------------------------------------------

    def _markers(self, predicate: Any) -> Any:
        return self._read("markers", predicate, ["tbl", "run_id", "shard_id"])

    def declare(self, table: str, run_id: str, shard_id: str, marker: str | None) -> None:
        """Record that shard (run_id, shard_id) of `table` is committed only once `marker` has
        rows of it; marker None removes such a declaration. Writes nothing when unchanged."""
        import polars as pl

        current = self._markers((pl.col("tbl") == table) & (pl.col("run_id") == run_id) & (pl.col("shard_id") == shard_id))
        if (current["marker"][0] if current.height else None) == marker:
            return
        self._append("markers", [{"tbl": table, "run_id": run_id, "shard_id": shard_id, "marker": marker,
                                  "seq": self._seq(current)}])

    def undeclare_if_present(self, table: str, run_id: str, shard_id: str) -> None:
        self.declare(table, run_id, shard_id, None)

    def declared(self, table: str) -> dict[str, set[Key]]:
        """{marker table: {(run_id, shard_id)}} of the shards of `table` that need a marker."""
        import polars as pl

        out: dict[str, set[Key]] = {}
        for run_id, shard_id, marker in (self._markers(pl.col("tbl") == table)
                                         .filter(pl.col("marker").is_not_null())
                                         .select("run_id", "shard_id", "marker").iter_rows()):
            _check_marker(self.path, table, run_id, shard_id, marker)
            out.setdefault(marker, set()).add((run_id, shard_id))
        return out

    def marker_rows(self) -> list[tuple[str, str, str, str]]:
        """Every marker row (table, run_id, shard_id, marker), unchecked (for repair)."""
        import polars as pl

        frame = self._markers(pl.lit(True)).filter(pl.col("marker").is_not_null())
        return sorted(frame.select("tbl", "run_id", "shard_id", "marker").iter_rows())

    def declarations(self, key: Key) -> list[tuple[str, str]]:
        """[(table, marker)] of every table whose shard `key` needs a marker."""
        import polars as pl

        frame = self._markers((pl.col("run_id") == key[0]) & (pl.col("shard_id") == key[1]))
        rows = sorted(frame.filter(pl.col("marker").is_not_null()).select("tbl", "marker").iter_rows())
        for table, marker in rows:
            _check_marker(self.path, table, *key, marker)
        return rows


def _file_row(table: str, r: FileRecord, recorded_at: float, seq: int) -> dict[str, Any]:
    stamp = _stamp_row(r.verified, r.verified_at_ns)
    return {
        "tbl": table, "path": r.path, "size": r.size, "sha256": r.sha256,
        "shards": json.dumps([[*k, n] for k, n in zip(r.keys, r.rows or [None] * len(r.keys), strict=True)]),
        "version": r.version, "source": r.source, "recorded_at": recorded_at,
        **dict(zip(("v_size", "v_mtime_ns", "v_ctime_ns", "v_ino", "v_at_ns"), stamp, strict=True)),
        "seq": seq, "deleted": False,
    }


def _file_record(row: dict[str, Any]) -> FileRecord:
    held = json.loads(row["shards"])
    stamp = Stamp(row["v_size"], row["v_mtime_ns"], row["v_ctime_ns"], row["v_ino"]) if row["v_size"] is not None else None
    return FileRecord(row["path"], row["size"], row["sha256"], tuple((k[0], k[1]) for k in held),
                      tuple(k[2] if len(k) > 2 else None for k in held), row["version"], row["source"], stamp,
                      row["v_at_ns"])


def _first_line(exc: BaseException | None) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
