"""`dataengine query`, `dataengine export` and `dataengine store ...`: the trajectory store."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from dataengine.commands.common import fail as _fail
from dataengine.commands.common import open_store as _open

DEFAULT_STORE = Path(os.environ.get("DATAENGINE_STORE", "runs/store"))
STORE_HELP = "Store root folder (default: $DATAENGINE_STORE or runs/store)."


class QueryFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


class ExportKind(str, Enum):
    pairs = "pairs"
    sft = "sft"
    replay = "replay"


class ExportFormat(str, Enum):
    parquet = "parquet"
    jsonl = "jsonl"
    hf = "hf"


class DedupMode(str, Enum):
    none = "none"
    exact = "exact"
    near = "near"


def _read_failure(opened, exc: BaseException, tables: list[str], versions: dict[str, int] | None = None) -> None:
    """Exit with the one-line StoreError explaining a failed read (a damaged file if found)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc
    _fail(str(opened.read_error(exc, tables, versions)))


def register(app: typer.Typer) -> None:
    @app.command("query")
    def query_command(
        sql: Annotated[str, typer.Argument(help='SQL over the store tables, e.g. "SELECT suite, avg(reward) FROM trajectories GROUP BY suite".')],
        store: Annotated[Path, typer.Option("--store", help=STORE_HELP)] = DEFAULT_STORE,
        format: Annotated[QueryFormat, typer.Option("--format", help="Output format.")] = QueryFormat.table,
        out: Annotated[Path | None, typer.Option("--out", help="Write to this file instead of stdout (required for parquet).")] = None,
        limit: Annotated[int, typer.Option("--max-rows", help="Rows shown by --format table.")] = 50,
        at: Annotated[list[str] | None, typer.Option("--at", help="TABLE=VERSION: read that table at a past Delta version (repeatable).")] = None,
        all_shards: Annotated[bool, typer.Option("--all-shards", help="Also rows of shards whose commit marker is missing (half-written).")] = False,
    ) -> None:
        """Run SQL (Polars SQLContext) with every written table registered by name (committed
        shards only, unless --all-shards)."""
        import polars as pl

        from storage import StoreError

        opened = _open(store)
        versions = {}
        for item in at or []:
            name, _, number = item.partition("=")
            if not number.isdigit():
                _fail(f"--at {item!r}: expected TABLE=VERSION, e.g. nodes=3")
            if name not in opened.tables():
                _fail(f"--at {item!r}: no table {name!r} in the store (tables: {', '.join(opened.tables()) or 'none'})")
            versions[name] = int(number)
        try:
            lazy = opened.sql(sql, versions=versions, committed=not all_shards)
        except StoreError as exc:
            _fail(str(exc))
        try:
            frame = lazy.collect()
        except StoreError as exc:
            _fail(str(exc))
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:
            _read_failure(opened, exc, [t for t in opened.tables() if t in sql], versions)
        if format is QueryFormat.parquet:
            if out is None:
                _fail("--format parquet needs --out PATH")
            frame.write_parquet(out)
        elif format is QueryFormat.csv:
            text = frame.write_csv()
            text = text if text.endswith("\n") else text + "\n"
            out.write_text(text) if out else sys.stdout.write(text)
        elif format is QueryFormat.json:
            text = json.dumps(frame.to_dicts(), default=str, indent=1) + "\n"
            out.write_text(text) if out else sys.stdout.write(text)
        else:
            with pl.Config(tbl_rows=limit, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=200):
                text = f"{frame}\n"
            out.write_text(text) if out else sys.stdout.write(text)

    @app.command("export")
    def export_command(
        kind: Annotated[ExportKind, typer.Argument(help="pairs (DPO), sft (SFT) or replay (GRPO prompts).")],
        out: Annotated[Path, typer.Option("--out", help="Output file (parquet, jsonl) or folder (hf).")],
        format: Annotated[ExportFormat, typer.Option("--format", help="parquet, jsonl or hf (datasets save_to_disk).")] = ExportFormat.parquet,
        store: Annotated[Path, typer.Option("--store", help=STORE_HELP)] = DEFAULT_STORE,
        run_id: Annotated[list[str] | None, typer.Option("--run-id", help="Keep rows of these runs (repeatable).")] = None,
        suite: Annotated[list[str] | None, typer.Option("--suite", help="Keep rows of these suites (repeatable).")] = None,
        task_id: Annotated[list[str] | None, typer.Option("--task-id", help="Keep rows of these tasks (repeatable).")] = None,
        row_kind: Annotated[list[str] | None, typer.Option("--kind", help="pairs: step|trajectory; sft: rs|recovery (repeatable).")] = None,
        min_margin: Annotated[float | None, typer.Option("--min-margin", help="pairs: margin >= this.")] = None,
        min_score: Annotated[float | None, typer.Option("--min-score", help="sft: score >= this.")] = None,
        min_p_success: Annotated[float | None, typer.Option("--min-p-success", help="replay: p_success >= this.")] = None,
        max_p_success: Annotated[float | None, typer.Option("--max-p-success", help="replay: p_success <= this.")] = None,
        where: Annotated[str | None, typer.Option("--where", help="SQL boolean expression over the source table.")] = None,
        limit: Annotated[int | None, typer.Option("--limit", min=0, help="At most this many rows before dedup.")] = None,
        version: Annotated[int | None, typer.Option("--version", help="Read this Delta version of the source table.")] = None,
        dedup: Annotated[DedupMode, typer.Option("--dedup", help="none, exact, or near (exact + embeddings).")] = DedupMode.exact,
        near_threshold: Annotated[float, typer.Option("--near-threshold", help="Cosine at which rows are near duplicates.")] = 0.95,
        embedder: Annotated[str, typer.Option("--embedder", help="ngram (no download) or st:<sentence-transformers model>.")] = "ngram",
        include_logprobs: Annotated[bool, typer.Option("--include-logprobs", help="pairs: add ref_chosen_logps/ref_rejected_logps from the behaviour log-probs.")] = False,
        balance_by: Annotated[str | None, typer.Option("--balance-by", help="Oversample rows so every value of this task metadata field (e.g. level) has as many rows as the most frequent; comma-separate keys to balance their combinations; pairs also take 'decision' (what the chosen reply does against the rejected one) and 'depth' (tool results in the prompt).")] = None,
        record_run_id: Annotated[str | None, typer.Option("--record-run-id", help="Also record the export as this run in the runs table.")] = None,
        decontaminate: Annotated[bool, typer.Option("--decontaminate/--no-decontaminate", help="Refuse rows whose user question matches a BFCL, tau2 or built-in held-out item, and count them.")] = True,
        decontam_threshold: Annotated[float, typer.Option("--decontam-threshold", min=0, max=1, help="Least similarity of a near-duplicate eval question (1: exact matches only).")] = 0.85,
    ) -> None:
        """Export pairs, sft or replay rows in the dataset format TRL reads, with lineage."""
        import polars as pl

        from dataengine.derive.export import export
        from storage import StoreError
        from storage.export import ExportFilters, lineage_path

        opened = _open(store)
        filters = ExportFilters(
            run_ids=run_id or None, suites=suite or None, task_ids=task_id or None, kinds=row_kind or None,
            min_margin=min_margin, min_score=min_score, min_p_success=min_p_success,
            max_p_success=max_p_success, where=where, limit=limit,
        )
        try:
            result = export(
                opened, kind.value, out, format=format.value, filters=filters,
                versions={kind.value: version} if version is not None else None,
                dedup=dedup.value, near_threshold=near_threshold, embedder=embedder,
                include_logprobs=include_logprobs, balance_by=balance_by, record_run_id=record_run_id,
                decontaminate=decontaminate, decontam_threshold=decontam_threshold,
            )
        except (StoreError, ValueError, KeyError, ImportError, NotADirectoryError) as exc:
            _fail(str(exc))
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:
            _read_failure(opened, exc, [kind.value], {kind.value: version} if version is not None else None)
        d = result.dedup
        if decontaminate:
            refused = result.decontaminated
            typer.echo(f"decontamination refused {sum(refused.values())} rows matching eval items "
                       f"({', '.join(f'{s} {n}' for s, n in refused.items())})")
        typer.echo(
            f"wrote {result.rows} {kind.value} rows to {out} ({format.value}); dedup removed "
            f"{d['exact_removed']} exact and {d['near_removed']} near duplicates of {d['rows_in']}; "
            f"source versions {result.source_versions}; lineage {lineage_path(out, format.value)}"
        )
        if result.balance:
            typer.echo(f"balanced by {balance_by}: rows per value before {result.balance['rows_before']}, "
                       f"{result.rows} after")

    store_app = typer.Typer(help="The trajectory store: tables, schemas, checks, rebuilds.", no_args_is_help=True)

    @store_app.command("info")
    def info_command(store: Annotated[Path, typer.Option("--store", help=STORE_HELP)] = DEFAULT_STORE) -> None:
        """Tables, Delta versions, row and file counts."""
        from rich.console import Console
        from rich.table import Table

        from storage import TABLES, StoreError

        opened = _open(store)
        table = Table("table", "version", "rows", "files", "status")
        for name in TABLES:
            if not opened.has_table(name):
                table.add_row(name, "-", "-", "-", "not written")
                continue
            try:
                files = opened.data_files(name)
                rows = sum(files.column("num_records").to_pylist()) if "num_records" in files.column_names else "?"
                opened.check(name)
                pending = opened.pending_shards(name)
                status = f"ok; {len(pending)} shard(s) lack their commit marker (hidden)" if pending else "ok"
                table.add_row(name, str(opened.version(name)), str(rows), str(files.num_rows), status)
            except StoreError as exc:
                table.add_row(name, "?", "?", "?", f"[red]{exc}[/red]")
        Console().print(f"store {opened.root} (schema version {opened.schema_version})")
        Console().print(table)

    @store_app.command("check")
    def check_command(
        store: Annotated[Path, typer.Option("--store", help=STORE_HELP)] = DEFAULT_STORE,
        full: Annotated[bool, typer.Option("--full", help="Hash and decode every data file, and list files without a checksum.")] = False,
    ) -> None:
        """Check every table's data files (present, logged size, recorded sha256; --full: every
        file hashed and decoded with Polars); exit 1 naming each damaged file, one per line."""
        from storage import StoreError

        opened = _open(store)
        bad = 0
        for name in opened.tables():
            try:
                problems = opened.verify(name, full=full)
                pending = opened.pending_shards(name)
            except StoreError as exc:
                bad += 1
                typer.echo(f"{name}: {exc}", err=True)
                continue
            for p in problems:
                typer.echo(f"{name}: {p.message(opened.root)}", err=True)
            bad += bool(problems)
            if pending:
                r, s_ = pending[0]
                typer.echo(f"{name}: {len(pending)} shard(s) written without their commit marker are hidden from reads "
                           f"(e.g. run {r!r} shard {s_!r}); rerun their run to complete them")
            if not problems:
                typer.echo(f"{name}: ok")
        if bad:
            raise typer.Exit(code=1)

    @store_app.command("repair")
    def repair_command(
        store: Annotated[Path, typer.Option("--store", help=STORE_HELP)] = DEFAULT_STORE,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be dropped or adopted.")] = False,
        adopt: Annotated[bool, typer.Option("--adopt", help="Record the checksums of files that have none, once they decode.")] = False,
        table: Annotated[list[str] | None, typer.Option("--table", help="Only these tables (repeatable).")] = None,
    ) -> None:
        """Drop every shard that has a damaged data file (with its commit-marker rows and the
        other tables' rows of that shard) so rerunning its run regenerates it; print each
        file and shard dropped. --adopt records checksums of files written without one."""
        from storage import TABLES, StoreError

        opened = _open(store)
        unknown = [t for t in table or [] if t not in TABLES]
        if unknown:
            _fail(f"unknown table(s) {', '.join(unknown)}; the store has tables: {', '.join(TABLES)}")
        try:
            report = opened.repair(table or None, dry_run=dry_run, adopt=adopt)
        except StoreError as exc:
            _fail(str(exc))
        for line in report.lines(opened.root):
            typer.echo(line)

    @store_app.command("schema")
    def schema_command(table: str | None = typer.Argument(None, help="One table (default: all).")) -> None:
        """Print the columns of the store tables and what they hold."""
        from storage.schemas import schema_doc, table_spec

        try:
            typer.echo(table_spec(table).doc() if table else schema_doc())
        except KeyError as exc:
            _fail(exc.args[0])

    @store_app.command("history")
    def history_command(
        table: Annotated[str, typer.Argument(help="Table name.")],
        store: Annotated[Path, typer.Option("--store", help=STORE_HELP)] = DEFAULT_STORE,
        limit: Annotated[int, typer.Option("--limit", min=1, help="Newest commits shown.")] = 20,
    ) -> None:
        """Delta commits of a table, newest first: version, time, operation, run and shard, rows."""
        from datetime import datetime

        from storage import StoreError

        opened = _open(store)
        try:
            commits = opened.history(table)[:limit]
        except (StoreError, KeyError) as exc:
            _fail(exc.args[0] if isinstance(exc, KeyError) else str(exc))
        for c in commits:
            when = datetime.fromtimestamp(c.get("timestamp", 0) / 1000, tz=UTC).isoformat(timespec="seconds")
            rows = (c.get("operationMetrics") or {}).get("num_added_rows", "-")
            typer.echo(f"{c.get('version')}\t{when}\t{c.get('operation')}\t{c.get('dataengine.run_id', '-')}"
                       f"\t{c.get('dataengine.shard_id', '-')}\t{rows}")

    @store_app.command("reexport")
    def reexport_command(
        lineage: Annotated[Path, typer.Argument(help="An export (parquet file or dataset folder) or its README.md: it holds the lineage.")],
        out: Annotated[Path, typer.Option("--out", help="Where to write the rebuilt export.")],
        store: Annotated[Path, typer.Option("--store", help=STORE_HELP)] = DEFAULT_STORE,
    ) -> None:
        """Rebuild an export exactly from its lineage (same table versions, filters, dedup)."""
        from dataengine.derive.export import reexport
        from storage import StoreError

        opened = _open(store)
        try:
            result = reexport(opened, lineage, out)
        except (StoreError, ValueError) as exc:
            _fail(str(exc))
        typer.echo(f"rebuilt {result.rows} rows to {out} from versions {result.source_versions}")

    @store_app.command("compact")
    def compact_command(
        store: Annotated[Path, typer.Option("--store", help=STORE_HELP)] = DEFAULT_STORE,
        table: Annotated[list[str] | None, typer.Option("--table", help="Only these tables (repeatable).")] = None,
    ) -> None:
        """Merge each table's small per-shard files into larger ones (one commit per table)."""
        from storage import StoreError

        opened = _open(store)
        for name in table or opened.tables():
            try:
                metrics = opened.compact(name)
            except (StoreError, KeyError) as exc:
                _fail(exc.args[0] if isinstance(exc, KeyError) else str(exc))
            typer.echo(f"{name}: {metrics.get('numFilesRemoved', 0)} files merged into {metrics.get('numFilesAdded', 0)}")

    @store_app.command("vacuum")
    def vacuum_command(
        store: Annotated[Path, typer.Option("--store", help=STORE_HELP)] = DEFAULT_STORE,
        retention_hours: Annotated[int, typer.Option("--retention-hours", min=0, help="Keep files younger than this.")] = 168,
        dry_run: Annotated[bool, typer.Option("--dry-run/--delete", help="List only (default) or delete.")] = True,
    ) -> None:
        """Remove data files no table version needs (killed writers, replaced shards)."""
        from storage import StoreError

        opened = _open(store)
        for name in opened.tables():
            try:
                files = opened.vacuum(name, retention_hours=retention_hours, dry_run=dry_run)
            except StoreError as exc:
                _fail(str(exc))
            typer.echo(f"{name}: {len(files)} file(s) {'to delete' if dry_run else 'deleted'}")

    app.add_typer(store_app, name="store")
