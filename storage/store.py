"""The trajectory store: one Delta Lake table of Parquet files per table in `schemas.TABLES`.

Layout under the store root (a local folder, or `s3://bucket/path` in S3-compatible object
storage: `storage.location`)::

    <root>/_store.json          {"format": "dataengine-store", "schema_version": 1}
    <root>/<table>/_delta_log/  the Delta transaction log (versions, time travel)
    <root>/<table>/*.parquet    data files

Writes: `Store.append(table, rows, run_id=..., shard_id=...)` is one Delta commit that replaces
exactly the rows of that (run_id, shard_id) (an overwrite with a predicate), so a retried shard
leaves one copy and a writer killed before its commit leaves nothing visible. Concurrent commits
that conflict are retried with backoff, then refused with `RetryableStoreError`.

Integrity (docs/store.md): every data file and Delta log entry the store commits has its
sha256 recorded in the manifest (`storage.manifest`: SQLite locally, Delta tables in a bucket); reads check sizes always and hashes of files not verified
since they last changed; `verify`/`check` and `repair` (storage.integrity) find and drop damaged
shards. A shard written across several tables declares a marker table (`append(...,
marker="tasks")`): its rows stay invisible to reads until the marker has rows of that shard.

Reads: every table is a Polars LazyFrame (`pl.scan_delta`), at the latest or any past version,
holding committed shards only unless `committed=False`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from storage.errors import (
    CorruptFileError,
    MissingTableError,
    NewerSchemaError,
    RetryableStoreError,
    SchemaMismatchError,
    StoreError,
    StoreNotFoundError,
)
from storage.location import ObjectPath, delta_options, store_root
from storage.manifest import CHECKPOINTS, Key, open_manifest
from storage.schemas import SCHEMA_VERSION, TABLES, TableSpec, table_spec

STORE_FILE = "_store.json"
STORE_FORMAT = "dataengine-store"
KEY_COLUMNS = ("run_id", "shard_id")

Rows = list[dict[str, Any]] | pa.Table | pl.DataFrame | pa.RecordBatchReader


def _with_spec_columns(frame: pl.LazyFrame, spec: TableSpec) -> pl.LazyFrame:
    """Columns of the spec that files written before they existed lack, as typed nulls."""
    have = set(frame.collect_schema().names())
    missing = [c for c in spec.columns if c.name not in have]
    if not missing:
        return frame
    dtypes = pl.from_arrow(pa.schema([c.field() for c in missing]).empty_table()).schema
    return frame.with_columns(pl.lit(None, dtype=dtypes[c.name]).alias(c.name) for c in missing)


def _sql_literal(value: str) -> str:
    """A SQL string literal for a Delta predicate (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def _is_conflict(exc: Exception) -> bool:
    """Whether a deltalake error is a lost commit race (safe to retry) rather than bad input."""
    from deltalake.exceptions import CommitFailedError

    if isinstance(exc, CommitFailedError):
        return True
    text = str(exc).lower()
    return any(w in text for w in ("conflict", "concurrent", "version already exists", "already exists"))


def git_version(cwd: str | Path | None = None) -> str | None:
    """The git sha of the working tree at `cwd` (suffix -dirty when it has changes), or None."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], check=False, cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            check=False, cwd=cwd, capture_output=True, text=True, timeout=10,
        )
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


class Store:
    """A store root holding the Delta tables `runs, tasks, nodes, trajectories, pairs, sft,
    replay, evals, models`.

    Args:
      root: the store folder (created with its `_store.json` on first append when `create`), or
        `s3://bucket/path` (the bucket must exist).
      storage_options: for an s3:// root, deltalake's option names (AWS_ENDPOINT_URL, ...) over
        the AWS variables of the environment (`storage.location.storage_options`).
      create: allow creating the store; with False a missing store is an error at once. A
        store opened with create (a writer) heals half-recorded commits at once (`heal`).
      max_retries: commit attempts before `RetryableStoreError` when writers conflict.
      check_files: on scan, check that each data file exists with the size the Delta log
        records, and that files changed since their last verification still match their
        recorded sha256, so a damaged file is named before Polars reads it.
      record_grace_s: a data file with no recorded checksum that is older than this is an
        error on read (a writer records its files right after its commit; younger files may
        be in flight). `store repair --adopt` records them.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        create: bool = True,
        max_retries: int = 12,
        check_files: bool = True,
        target_file_size: int | None = None,
        record_grace_s: float = 600.0,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.root: Path | ObjectPath = store_root(root, storage_options)
        # deltalake's storage_options of every table of an s3:// store; None for a local one.
        self.storage_options = delta_options(self.root)
        self.manifest = open_manifest(self.root)
        self.record_grace_s = record_grace_s
        if max_retries < 1:
            raise ValueError(f"max_retries must be >= 1, got {max_retries}")
        self.max_retries = max_retries
        self.check_files = check_files
        self.target_file_size = target_file_size
        # Tables this instance has created or checked for a newer schema version.
        self._checked: set[str] = set()
        # Local stores checksum their Delta log (integrity.log_problems); `repair` turns the
        # check off while it works on a damaged entry.
        self.logs_recorded = self.storage_options is None
        self.check_log = self.logs_recorded
        self._log_seen: dict[str, dict] = {}  # {table: {log file: stamp}} found intact by this instance
        self._healed = False  # the first append heals every table's half-recorded commits
        if isinstance(self.root, ObjectPath) and not self.root.bucket_exists():
            raise StoreNotFoundError(
                f"bucket {self.root.bucket!r} of store {self.root} does not exist at {self.root.store.endpoint}; "
                "create it first (or check AWS_ENDPOINT_URL and the credentials)"
            )
        if self.root.exists() and not self.root.is_dir():
            raise StoreNotFoundError(f"store path {self.root} is a file, not a store folder")
        meta = self.root / STORE_FILE
        if meta.exists():
            self._check_store_file(meta)
        elif not create:
            raise StoreNotFoundError(
                f"no store at {self.root} (no {STORE_FILE}); write to it with Store(path).append "
                "or pass the right --store path"
            )
        elif self.root.exists() and any(p.name in TABLES for p in self.root.iterdir()):
            raise StoreNotFoundError(
                f"{self.root} holds tables but no {STORE_FILE}; it was not written by this store"
            )
        if create and meta.exists():
            # A writer starts by completing the commits a killed writer left half-recorded.
            self._healed = True
            try:
                self.heal()
            except StoreError:
                pass  # a damaged log or manifest: the first read names it

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # ---- store metadata -------------------------------------------------------------------

    def _check_store_file(self, meta: Path) -> None:
        try:
            info = json.loads(meta.read_text())
            version = int(info["schema_version"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"store metadata {meta} is unreadable: {exc}") from exc
        if version > SCHEMA_VERSION:
            raise NewerSchemaError(
                f"store {self.root} was written with schema version {version}; this code reads "
                f"up to {SCHEMA_VERSION}: upgrade dataengine to read it"
            )

    def _ensure_store_file(self) -> None:
        meta = self.root / STORE_FILE
        if meta.exists():
            return
        if isinstance(self.root, ObjectPath):
            # One PUT is atomic; concurrent first writers all write the same content.
            meta.write_text(json.dumps({"format": STORE_FORMAT, "schema_version": SCHEMA_VERSION}))
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{STORE_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"format": STORE_FORMAT, "schema_version": SCHEMA_VERSION}))
        # Atomic rename: concurrent first writers all write the same content.
        os.replace(tmp, meta)

    @property
    def schema_version(self) -> int:
        return SCHEMA_VERSION

    # ---- tables ---------------------------------------------------------------------------

    def table_path(self, table: str) -> Path | ObjectPath:
        table_spec(table)
        return self.root / table

    def has_table(self, table: str) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(str(self.table_path(table)), storage_options=self.storage_options)

    def tables(self) -> list[str]:
        """Names of the tables that have been written, in schema order."""
        if not self.root.is_dir():
            return []
        return [name for name in TABLES if self.has_table(name)]

    def _delta(self, table: str, version: int | None = None):
        """The DeltaTable of `table`, checked for existence and schema version."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        path = self.table_path(table)
        if not self.root.is_dir():
            raise StoreNotFoundError(f"no store at {self.root}")
        if not DeltaTable.is_deltatable(str(path), storage_options=self.storage_options):
            have = ", ".join(self.tables()) or "none"
            raise MissingTableError(
                f"table {table!r} does not exist in store {self.root} (tables written: {have})"
            )
        if self.check_log and self.check_files:
            from storage.integrity import log_problems

            # Before Delta reads the log: a damaged statistic would make it skip files silently.
            problems = log_problems(self, table, full=False, seen=self._log_seen.setdefault(table, {}))
            if problems:
                raise CorruptFileError(problems[0].message(self.root))
        try:
            dt = DeltaTable(str(path), version=version, storage_options=self.storage_options)
        except DeltaError as exc:
            raise StoreError(f"table {table!r} in {self.root}: cannot open version {version}: {exc}") from exc
        self._check_table_version(table, dt)
        return dt

    def _check_table_version(self, table: str, dt) -> None:
        try:
            version = int(json.loads(dt.metadata().description or "{}").get("schema_version", 0))
        except (ValueError, AttributeError):
            version = 0
        if version > SCHEMA_VERSION:
            raise NewerSchemaError(
                f"table {table!r} in {self.root} has schema version {version}; this code reads up "
                f"to {SCHEMA_VERSION}: upgrade dataengine to read it"
            )

    def _create_table(self, spec: TableSpec) -> None:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        path = str(self.table_path(spec.name))
        if DeltaTable.is_deltatable(path, storage_options=self.storage_options):
            return
        try:
            DeltaTable.create(
                path,
                schema=spec.schema,
                mode="ignore",
                name=spec.name,
                description=json.dumps({"schema_version": SCHEMA_VERSION}),
                storage_options=self.storage_options,
                # In a bucket each log entry is a request: checkpoint often (manifest.CHECKPOINTS).
                configuration=CHECKPOINTS if self.storage_options is not None else None,
            )
        except DeltaError:
            # Another process created it between the check and ours: fine if it exists now.
            if not DeltaTable.is_deltatable(path, storage_options=self.storage_options):
                raise

    def version(self, table: str) -> int:
        """The latest Delta version of `table`."""
        return self._delta(table).version()

    def table_versions(self) -> dict[str, int]:
        """{table: latest Delta version} for every written table: the lineage key of a read."""
        return {name: self.version(name) for name in self.tables()}

    # ---- writing --------------------------------------------------------------------------

    def to_arrow(self, table: str, rows: Rows, *, run_id: str, shard_id: str) -> pa.Table:
        """`rows` as an Arrow table with exactly `table`'s schema.

        Missing nullable columns become nulls, `run_id`/`shard_id` are filled, null `created_at`
        becomes now. Unknown columns, missing required columns, nulls in required columns,
        values that do not convert, and rows whose run_id/shard_id differ from the arguments
        raise `SchemaMismatchError` naming the columns.
        """
        spec = table_spec(table)
        if not isinstance(run_id, str) or not run_id or not isinstance(shard_id, str) or not shard_id:
            raise SchemaMismatchError(f"table {table!r}: run_id and shard_id must be non-empty strings")
        if isinstance(rows, pl.DataFrame):
            rows = rows.to_arrow()
        if isinstance(rows, pa.Table):
            present = list(rows.column_names)
            n = rows.num_rows
            get = lambda name: rows.column(name)
        elif isinstance(rows, (list, tuple)) and not rows:
            return spec.schema.empty_table()
        elif isinstance(rows, (list, tuple)):
            if any(not isinstance(r, dict) for r in rows):
                raise SchemaMismatchError(f"table {table!r}: rows must be dicts, a pyarrow Table or a polars DataFrame")
            present = list(dict.fromkeys(k for r in rows for k in r))
            n = len(rows)
            get = lambda name: [r.get(name) for r in rows]
        else:
            raise SchemaMismatchError(
                f"table {table!r}: rows must be a list of dicts, a pyarrow Table or a polars "
                f"DataFrame, not {type(rows).__name__}"
            )
        unknown = [c for c in present if c not in spec.column_names]
        if unknown:
            raise SchemaMismatchError(
                f"table {table!r} has no column(s) {', '.join(unknown)}; its columns are "
                f"{', '.join(spec.column_names)}"
            )
        missing = [c for c in spec.required if c not in present and c not in KEY_COLUMNS]
        if missing:
            raise SchemaMismatchError(f"table {table!r}: required column(s) missing: {', '.join(missing)}")

        arrays = []
        now = datetime.now(UTC)
        for col in spec.columns:
            if col.name in KEY_COLUMNS:
                want = run_id if col.name == "run_id" else shard_id
                if col.name in present:
                    values = pa.array(get(col.name)) if not isinstance(rows, pa.Table) else get(col.name)
                    bad = pa.compute.any(pa.compute.not_equal(values.cast(pa.string()), want)).as_py()
                    if bad or values.null_count:
                        raise SchemaMismatchError(
                            f"table {table!r}: column {col.name} holds values other than {want!r}; "
                            "one append writes one (run_id, shard_id)"
                        )
                arrays.append(pa.array([want] * n, type=col.type))
                continue
            if col.name not in present:
                if col.name == "created_at":
                    arrays.append(pa.array([now] * n, type=col.type))
                else:
                    arrays.append(pa.nulls(n, type=col.type))
                continue
            try:
                values = get(col.name)
                array = values.cast(col.type) if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, type=col.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
                raise SchemaMismatchError(
                    f"table {table!r}: column {col.name} does not convert to {col.type}: {exc}"
                ) from exc
            if col.name == "created_at" and array.null_count:
                array = pa.compute.fill_null(array, pa.scalar(now, type=col.type))
            if not col.nullable and array.null_count:
                raise SchemaMismatchError(f"table {table!r}: required column {col.name} has {array.null_count} null(s)")
            arrays.append(array)
        arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
        return pa.Table.from_arrays(arrays, schema=spec.schema)

    def append(self, table: str, rows: Rows, *, run_id: str, shard_id: str, marker: str | None = None) -> int:
        """Write `rows` as shard (run_id, shard_id) of `table` in one commit; return the version.

        `rows`: a list of dicts, a pyarrow Table, a polars DataFrame, or a pyarrow
        RecordBatchReader (streamed; a stream cannot be retried after a lost commit race).
        Writing the same shard again replaces it (one copy). A conflict with concurrent writers
        is retried up to `max_retries` times with jittered backoff, then `RetryableStoreError`.
        `marker`: another table whose rows of (run_id, shard_id) mark this shard committed
        (write the marker table last); until then reads leave the shard out. The sha256 of
        every data file the commit adds is recorded in the manifest.
        """
        from deltalake import CommitProperties, DeltaTable, write_deltalake
        from deltalake.exceptions import DeltaError

        spec = table_spec(table)
        if marker is not None and (marker == table or marker not in TABLES):
            raise ValueError(f"marker of table {table!r} must be another store table, not {marker!r}")
        if isinstance(rows, pa.RecordBatchReader):
            # A stream is converted batch by batch, so a large shard need not fit in memory.
            batches = (
                b
                for batch in rows
                for b in self.to_arrow(table, pa.Table.from_batches([batch]), run_id=run_id, shard_id=shard_id).to_batches()
            )
            data = pa.RecordBatchReader.from_batches(spec.schema, batches)
        else:
            data = self.to_arrow(table, rows, run_id=run_id, shard_id=shard_id)
        self._ensure_store_file()
        path = str(self.table_path(table))
        if not self._healed:
            self._healed = True
            self.heal()
        if table not in self._checked:
            self._create_table(spec)
            self._check_table_version(table, DeltaTable(path, storage_options=self.storage_options))
            self._checked.add(table)
            self.heal([table])  # records the creating commit
        if marker is not None:
            # Declared before the commit: a writer killed after it leaves an invisible shard.
            self.manifest.declare(table, run_id, shard_id, marker)
        predicate = f"run_id = {_sql_literal(run_id)} AND shard_id = {_sql_literal(shard_id)}"
        token = uuid.uuid4().hex
        commit = CommitProperties(
            custom_metadata={
                "dataengine.run_id": run_id,
                "dataengine.shard_id": shard_id,
                "dataengine.schema_version": str(SCHEMA_VERSION),
                "dataengine.commit": token,
                # Lets `repair` rebuild a damaged manifest marker row from the log.
                **({"dataengine.marker": marker} if marker is not None else {}),
            }
        )
        delay = 0.05
        # A stream is consumed by the first attempt: retrying it would write an empty shard.
        attempts = 1 if isinstance(rows, pa.RecordBatchReader) else self.max_retries
        for _ in range(attempts):
            try:
                dt = DeltaTable(path, storage_options=self.storage_options)
                read_version = dt.version()
                write_deltalake(
                    dt, data, mode="overwrite", predicate=predicate, commit_properties=commit,
                    target_file_size=self.target_file_size,
                    # Columns added to a spec since the table was created join its schema.
                    schema_mode="merge",
                )
                version = self._record_commit(table, dt, token, read_version)
                if marker is None:
                    self.manifest.undeclare_if_present(table, run_id, shard_id)
                return version
            except DeltaError as exc:
                if not _is_conflict(exc):
                    raise StoreError(f"append to table {table!r} in {self.root} failed: {exc}") from exc
                last = exc
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)
        raise RetryableStoreError(
            f"append of shard ({run_id}, {shard_id}) to table {table!r} in {self.root} lost "
            f"{attempts} commit race(s) with concurrent writers; retry it ({last})"
        )

    def _record_commit(self, table: str, dt, token: str, read_version: int, *, source: str = "commit") -> int:
        """Record the sha256 and shard keys of the files the commit tagged `token` added;
        return its version."""
        from storage.integrity import commit_adds, file_keys, file_record

        version, adds = commit_adds(self.table_path(table), token, dt.version(), read_version)
        base = self.table_path(table)
        records = [
            file_record(base, row["path"], row["size_bytes"], file_keys(base, row), version=version, source=source)
            for row in adds
        ]
        self.manifest.record(table, records)
        if self.logs_recorded:
            from storage.integrity import record_log

            record_log(self, table, [version], source=source)
        return version

    def heal(self, tables: list[str] | None = None) -> list[str]:
        """Complete the records of commits whose writer was killed between the commit and its
        checksums (`integrity.heal`: each added file must decode and hold what its log entry
        states); one line per log entry recorded. Every writer does this at its first append."""
        from storage.integrity import heal

        if not self.logs_recorded:
            return []
        lines = []
        for table in tables or self.tables():
            lines += heal(self, table)
        return lines

    def committed_shards(self, table: str, run_id: str) -> set[str]:
        """shard_ids of `run_id` that have rows in `table` (a resumed run skips them)."""
        if not self.has_table(table):
            return set()
        frame = self.scan(table).filter(pl.col("run_id") == run_id).select("shard_id").unique().collect()
        return set(frame["shard_id"].to_list())

    def record_run(
        self,
        run_id: str,
        *,
        kind: str,
        config: dict[str, Any] | None = None,
        model_id: str | None = None,
        checkpoint_hash: str | None = None,
        verifier_versions: dict[str, str] | None = None,
        seed: int | None = None,
        source_versions: dict[str, int] | None = None,
        code_version: str | None = None,
        shard_id: str = "run",
    ) -> int:
        """Append the lineage row of a run to `runs` (code_version defaults to the git sha)."""
        row = {
            "kind": kind,
            "config_json": json.dumps(config or {}, sort_keys=True, default=str),
            "code_version": code_version if code_version is not None else git_version(),
            "model_id": model_id,
            "checkpoint_hash": checkpoint_hash,
            "verifier_versions_json": json.dumps(verifier_versions or {}, sort_keys=True),
            "seed": seed,
            "source_versions_json": json.dumps(source_versions or {}, sort_keys=True),
        }
        return self.append("runs", [row], run_id=run_id, shard_id=shard_id)

    # ---- reading --------------------------------------------------------------------------

    def data_files(self, table: str, version: int | None = None) -> pa.Table:
        """The active data files of `table`: columns path (relative), size_bytes, num_records,
        modification_time and the min/max run_id and shard_id from the Delta file statistics."""
        dt = self._delta(table, version)
        return _data_files(dt)

    def verify(self, table: str, version: int | None = None, *, full: bool = False) -> list:
        """Every problem of `table`'s data files (at `version`), as `integrity.FileProblem`s.

        Each file must exist with the size the Delta log records and match its recorded
        sha256 (re-hashed only when it changed since its last verification, unless `full`).
        With `full`, every file is hashed and decoded with Polars' Parquet reader, and files
        with no recorded checksum are listed too.
        """
        from storage.integrity import log_problems, verify_files

        logged = log_problems(self, table, full=full) if self.logs_recorded and self.has_table(table) else []
        if any(p.kind == "log" for p in logged):
            return logged  # the file list below comes from the damaged log
        checking, self.check_log = self.check_log, False
        try:
            dt = self._delta(table, version)
        finally:
            self.check_log = checking
        return logged + verify_files(self, table, _data_files(dt), full=full)

    def check(self, table: str, version: int | None = None, *, full: bool = False) -> None:
        """Raise `CorruptFileError` naming the first damaged data file of `table` (see `verify`)."""
        problems = self.verify(table, version, full=full)
        if problems:
            raise CorruptFileError(problems[0].message(self.root))

    def scan(self, table: str, version: int | None = None, *, committed: bool = True,
             marker_versions: Mapping[str, int] | None = None) -> pl.LazyFrame:
        """`table` as a Polars LazyFrame, at the latest or the given Delta `version`.

        committed: leave out shards declared with a marker table that has no rows of them
        (each marker table read at its version in `marker_versions`, default latest; a table's
        shards may be declared with several markers, e.g. trajectories with tasks and evals);
        False reads every row.
        """
        from storage.integrity import verify_files

        dt = self._delta(table, version)
        if self.check_files:
            problems = verify_files(self, table, _data_files(dt), full=False)
            if problems:
                raise CorruptFileError(problems[0].message(self.root))
        frame = _with_spec_columns(pl.scan_delta(dt), table_spec(table))
        if committed:
            pending = self.pending_shards(table, marker_versions)
            if pending:
                frame = frame.filter(~_key_filter(pending))
        return frame

    def committed(self, table: str, version: int | None = None, *,
                  marker_versions: Mapping[str, int] | None = None) -> pl.LazyFrame:
        """The rows of committed shards of `table` (what `scan` returns by default): use it
        where the intent should be explicit (derive, exports)."""
        return self.scan(table, version, committed=True, marker_versions=marker_versions)

    def pending_shards(self, table: str, marker_versions: Mapping[str, int] | None = None) -> list[Key]:
        """Sorted (run_id, shard_id) shards of `table` declared with a marker table that has no
        rows of them (each marker at its version in `marker_versions`, default latest): written
        by a writer that did not finish the shard."""
        declared = self.manifest.declared(table)
        pending: set[Key] = set()
        for marker, keys in declared.items():
            if not self.has_table(marker):
                pending |= keys
                continue
            runs = sorted({r for r, _ in keys})
            have = (
                self.scan(marker, (marker_versions or {}).get(marker), committed=False)
                .filter(pl.col("run_id").is_in(runs))
                .select("run_id", "shard_id").unique()
            )
            done = set(self.collect(have, tables=[marker]).iter_rows())
            pending |= keys - done
        return sorted(pending)

    def collect(self, frame: pl.LazyFrame, *, tables: list[str], versions: dict[str, int] | None = None) -> pl.DataFrame:
        """`frame.collect()`, with a Polars read error turned into a one-line `StoreError`
        naming the damaged file of `tables` when a full check finds one."""
        try:
            return frame.collect()
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit, StoreError)):
                raise
            raise self.read_error(exc, tables, versions) from exc

    def read_error(self, exc: BaseException, tables: list[str], versions: dict[str, int] | None = None) -> StoreError:
        """The StoreError explaining a failed read of `tables`: the first damaged file a full
        check of them finds, else the first line of `exc` and what to run."""
        for name in tables:
            if not self.has_table(name):
                continue
            try:
                problems = self.verify(name, (versions or {}).get(name), full=True)
            except StoreError as err:
                return err
            damaged = [p for p in problems if p.kind != "unrecorded"]
            if damaged:
                return CorruptFileError(damaged[0].message(self.root))
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return StoreError(
            f"reading table(s) {', '.join(tables)} in {self.root} failed: {first}; run "
            f"`dataengine store check --full --store {self.root}`"
        )

    def repair(self, tables: list[str] | None = None, *, dry_run: bool = False, adopt: bool = False):
        """Drop every shard that has a damaged data file, with its marker rows and the rows of
        the tables declared with the same marker, so rerunning its run regenerates it; with
        `adopt`, record the checksums of files that have none after decoding them. Returns an
        `integrity.RepairReport` (its `lines()` say exactly what was, or would be, done)."""
        from storage.integrity import repair

        return repair(self, tables, dry_run=dry_run, adopt=adopt)

    def read(self, table: str, version: int | None = None, *, committed: bool = True,
             marker_versions: Mapping[str, int] | None = None) -> pl.LazyFrame:
        """Same as `scan`: the table at a version, for exact rebuilds from recorded versions."""
        return self.scan(table, version, committed=committed, marker_versions=marker_versions)

    def empty(self, table: str) -> pl.LazyFrame:
        """An empty LazyFrame with `table`'s schema (for a table not written yet)."""
        return pl.from_arrow(table_spec(table).schema.empty_table()).lazy()

    def scan_or_empty(self, table: str, version: int | None = None, *, committed: bool = True) -> pl.LazyFrame:
        return self.scan(table, version, committed=committed) if self.has_table(table) else self.empty(table)

    def runs(self, version: int | None = None) -> pl.LazyFrame:
        return self.scan("runs", version)

    def tasks(self, version: int | None = None) -> pl.LazyFrame:
        return self.scan("tasks", version)

    def nodes(self, version: int | None = None) -> pl.LazyFrame:
        return self.scan("nodes", version)

    def trajectories(self, version: int | None = None) -> pl.LazyFrame:
        return self.scan("trajectories", version)

    def pairs(self, version: int | None = None) -> pl.LazyFrame:
        return self.scan("pairs", version)

    def sft(self, version: int | None = None) -> pl.LazyFrame:
        return self.scan("sft", version)

    def replay(self, version: int | None = None) -> pl.LazyFrame:
        return self.scan("replay", version)

    def evals(self, version: int | None = None) -> pl.LazyFrame:
        return self.scan("evals", version)

    def models(self, version: int | None = None) -> pl.LazyFrame:
        return self.scan("models", version)

    def sql(self, query: str, *, versions: dict[str, int] | None = None, committed: bool = True) -> pl.LazyFrame:
        """Run SQL over every written table (registered by name) through Polars' SQLContext.

        Tables hold committed shards only unless `committed=False`. A table whose files are
        damaged is left out (the rest stays queryable); naming it in the query then fails with
        the reason.
        """
        ctx = pl.SQLContext()
        broken: dict[str, str] = {}
        versions = versions or {}
        for name in self.tables():
            try:
                ctx.register(name, self.scan(name, versions.get(name), committed=committed,
                                             marker_versions=versions))
            except StoreError as exc:
                broken[name] = str(exc)
        try:
            frame = ctx.execute(query, eager=False)
            # Resolving the schema checks table and column names now, not at collect time.
            frame.collect_schema()
            return frame
        except Exception as exc:
            for name, reason in broken.items():
                if name in query:
                    raise StoreError(f"query names table {name!r}, which is unreadable: {reason}") from exc
            written = self.tables()
            missing = [t for t in TABLES if t not in written and t in query]
            hint = f" (tables not written yet: {', '.join(missing)})" if missing else ""
            raise StoreError(f"query failed: {exc}{hint}; tables written: {', '.join(written) or 'none'}") from exc

    def compact(self, table: str, *, target_size: int | None = None) -> dict[str, Any]:
        """Merge small data files (one per shard) into larger ones in one commit; rows and
        shard replacement semantics are unchanged. Returns Delta's optimize metrics."""
        from deltalake import CommitProperties
        from deltalake.exceptions import DeltaError

        # Compaction reads every file: refuse to copy a damaged one into a new, recorded file.
        self.check(table)
        dt = self._delta(table)
        token = uuid.uuid4().hex
        read_version = dt.version()
        try:
            metrics = dt.optimize.compact(
                target_size=target_size, commit_properties=CommitProperties(custom_metadata={"dataengine.commit": token})
            )
        except DeltaError as exc:
            if _is_conflict(exc):
                raise RetryableStoreError(f"compaction of table {table!r} conflicted with a writer; retry it") from exc
            raise StoreError(f"compaction of table {table!r} in {self.root} failed: {exc}") from exc
        if metrics.get("numFilesAdded", 0):
            self._record_commit(table, self._delta(table), token, read_version, source="compact")
        return metrics

    def vacuum(self, table: str, *, retention_hours: int = 1, dry_run: bool = False) -> list[str]:
        """Delete data files no version references and older than `retention_hours` (files
        left by killed writers, or replaced shards); return their paths. Versions older than
        the retention can no longer be read afterwards."""
        dt = self._delta(table)
        deleted = dt.vacuum(
            retention_hours=int(retention_hours), dry_run=dry_run, enforce_retention_duration=False, full=True
        )
        if not dry_run:
            self.manifest.forget(table, deleted)
            self.heal([table])  # records the log entries vacuum wrote (they add no files)
        return deleted

    def manifest_problems(self) -> list[str]:
        """One line per damaged manifest marker row (`store repair` rewrites them)."""
        from storage.manifest import _check_marker

        out = []
        for tbl, run_id, shard_id, marker in self.manifest.marker_rows():
            try:
                _check_marker(self.manifest.path, tbl, run_id, shard_id, marker)
            except StoreError as exc:
                out.append(str(exc))
        return out

    def history(self, table: str) -> list[dict[str, Any]]:
        """The Delta commit history of `table`, newest first."""
        return self._delta(table).history()

    def iter_tables(self) -> Iterable[tuple[str, pl.LazyFrame]]:
        for name in self.tables():
            yield name, self.scan(name)


def _data_files(dt) -> pa.Table:
    actions = pa.table(dt.get_add_actions(flatten=True))
    keep = [c for c in ("path", "size_bytes", "num_records", "modification_time", "min.run_id", "max.run_id",
                        "min.shard_id", "max.shard_id") if c in actions.column_names]
    return actions.select(keep)


def _key_filter(keys: list[Key]) -> pl.Expr:
    """True for rows whose (run_id, shard_id) is one of `keys`."""
    by_run: dict[str, list[str]] = {}
    for run_id, shard_id in keys:
        by_run.setdefault(run_id, []).append(shard_id)
    return pl.any_horizontal(
        [(pl.col("run_id") == run_id) & pl.col("shard_id").is_in(shards) for run_id, shards in by_run.items()]
    )
