"""The store's sidecar manifest: `<root>/_manifest.sqlite` (stdlib sqlite3).

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
its own connection, so the object is safe to share across threads and forks.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

from storage.errors import StoreError

MANIFEST_FILE = "_manifest.sqlite"
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
            out.setdefault(marker, set()).add((run_id, shard_id))
        return out

    def declarations(self, key: Key) -> list[tuple[str, str]]:
        """[(table, marker)] of every table whose shard `key` needs a marker."""
        with self._db(write=False) as db:
            if db is None:
                return []
            return db.execute(
                "SELECT tbl, marker FROM markers WHERE run_id = ? AND shard_id = ? ORDER BY tbl", key
            ).fetchall()


def _stamp_row(stamp: Stamp | None, at_ns: int | None) -> tuple:
    if stamp is None:
        return (None, None, None, None, None)
    return (stamp.size, stamp.mtime_ns, stamp.ctime_ns, stamp.ino, at_ns)
