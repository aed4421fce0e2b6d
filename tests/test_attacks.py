"""The attack suite: writers killed at each file event of a shard, bit flips in the Delta log
and the manifest, hostile tools that try to change later calls, killed exports and bad input.
Each case asserts what the store, the sandbox or the CLI must do about it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from test_store_integrity import RUN, shard_output
from typer.testing import CliRunner

from dataengine.cli import app
from dataengine.search.run import write_shard
from dataengine.tools.sandbox import Sandbox
from dataengine.types import ToolCall
from storage import CorruptFileError, Store, StoreError

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

# ----------------------------------------------------------------- killed writers

# Runs in a fresh interpreter: SIGKILLs itself at one file event of writing shard-0, the
# way an operator's kill -9 or the OOM killer would.
WRITER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from test_store_integrity import RUN, shard_output
    from dataengine.search.run import write_shard
    import storage.manifest as manifest
    import storage.store as store_module
    from storage import Store

    point, table = sys.argv[1], sys.argv[2]
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    if point == "declare":  # before the shard's data commit of `table`
        real_declare = manifest.Manifest.declare
        def declare(self, tbl, *args):
            if tbl == table:
                die()
            return real_declare(self, tbl, *args)
        manifest.Manifest.declare = declare
    elif point == "commit":  # data file written, commit not made
        import deltalake
        real_write = deltalake.write_deltalake
        def write(target, data, **kw):
            if str(getattr(target, "table_uri", target)).rstrip("/").endswith("/" + table):
                die()
            return real_write(target, data, **kw)
        store_module.__dict__.setdefault("_", None)
        deltalake.write_deltalake = write
    else:  # "record": committed, checksums not recorded; "log": files recorded, log entry not
        real_record = manifest.Manifest.record
        name = table if point == "record" else table + "/_delta_log"
        def record(self, tbl, records):
            records = list(records)
            if tbl == name and records and records[0].version is not None and records[0].version > 0:
                die()
            return real_record(self, tbl, records)
        manifest.Manifest.record = record
    write_shard(Store(sys.argv[3]), shard_output(0), RUN)
""").format(tests=str(TESTS))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _resume(root: Path) -> None:
    """What a rerun of generate does: a writer starts, and writes the shards not committed."""
    store = Store(root)
    store.record_run(RUN, kind="generate", shard_id="resume")
    if "shard-0" not in store.committed_shards("tasks", RUN):
        write_shard(store, shard_output(0), RUN)


def _check_full(root: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["store", "check", "--full", "--store", str(root)])
    return result.exit_code, result.output + (result.stderr or "")


def _rows(root: Path) -> dict[str, list]:
    store = Store(root, create=False)
    out = {}
    for table in ("tasks", "nodes", "trajectories"):
        frame = store.scan(table).select(pl.exclude("created_at")).collect()
        out[table] = sorted(map(repr, frame.rows()))
    return out


def _kill_and_resume(tmp_path: Path, point: str, table: str) -> None:
    root = tmp_path / f"{point}-{table}"
    Store(root).record_run(RUN, kind="generate")
    proc = subprocess.run([sys.executable, "-c", WRITER, point, table, str(root)], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    _resume(root)
    code, output = _check_full(root)
    assert code == 0, output
    clean = tmp_path / "clean"
    if not clean.exists():
        write_shard(Store(clean), shard_output(0), RUN)
    assert _rows(root) == _rows(clean)


def test_kill_between_the_marker_commit_and_its_checksums_is_healed_by_the_rerun(tmp_path):
    _kill_and_resume(tmp_path, "record", "tasks")


@pytest.mark.slow
@pytest.mark.parametrize("point", ["declare", "commit", "record", "log"])
@pytest.mark.parametrize("table", ["nodes", "trajectories", "tasks"])
def test_kill_at_each_file_event_of_a_shard_then_rerun_checks_clean(tmp_path, point, table):
    _kill_and_resume(tmp_path, point, table)


def test_half_recorded_commit_found_much_later_is_healed_by_a_writer(tmp_path):
    # The kill above, found after the grace for in-flight files: reads name it, a writer heals it.
    root = tmp_path / "store"
    Store(root).record_run(RUN, kind="generate")
    proc = subprocess.run([sys.executable, "-c", WRITER, "record", "tasks", str(root)], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    with pytest.raises(CorruptFileError, match="no recorded checksum"):
        Store(root, create=False, record_grace_s=0).tasks()
    Store(root, record_grace_s=0)  # a writer starts
    assert Store(root, create=False, record_grace_s=0).tasks().collect().height == 1


# ----------------------------------------------------------------- Delta log bit flips


def _flip_stat(log: Path, side: str, column: str, xor: int) -> None:
    """Flip bits of the last character of the `side` ("minValues"/"maxValues") statistic of
    `column` in the add action of Delta log entry `log` (inside its JSON-encoded stats)."""
    raw = bytearray(log.read_bytes())
    start = raw.index(side.encode())
    key = f'\\"{column}\\":'.encode()
    at = raw.index(key, start) + len(key)
    if raw[at:at + 2] == b'\\"':  # a string value: its last character before the closing quote
        at = raw.index(b'\\"', at + 2) - 1
    raw[at] ^= xor
    log.write_bytes(bytes(raw))


def _two_shards(root: Path) -> Store:
    store = Store(root)
    for index in (0, 1):
        write_shard(store, shard_output(index), RUN)
    return store


def _log(root: Path, table: str, version: int) -> Path:
    return root / table / "_delta_log" / f"{version:020d}.json"


@pytest.mark.parametrize(("side", "column", "xor", "query"), [
    ("minValues", "run_id", 0x02, pl.col("run_id") == RUN),  # "gen-1" -> "gen-3": the file looks out of range
    ("maxValues", "depth", 0x02, pl.col("depth") >= 1),  # 2 -> 0
])
def test_a_flipped_statistic_in_the_delta_log_is_found_before_a_read(tmp_path, side, column, xor, query):
    store = _two_shards(tmp_path)
    expected = store.nodes().filter(query).collect().height
    _flip_stat(_log(tmp_path, "nodes", 1), side, column, xor)
    code, output = _check_full(tmp_path)
    assert code == 1 and "Delta log entry" in output and "00000000000000000001.json" in output, output
    with pytest.raises(CorruptFileError, match="Delta log entry .*00000000000000000001.json.*store repair"):
        Store(tmp_path, create=False).nodes().filter(query).collect()
    # Repair drops the shard the damaged entry added; the rerun regenerates it.
    lines = Store(tmp_path, create=False).repair().lines(tmp_path)
    assert any("drop" in line and "shard-0" in line for line in lines), lines
    write_shard(Store(tmp_path), shard_output(0), RUN)
    assert _check_full(tmp_path)[0] == 0
    assert Store(tmp_path, create=False).nodes().filter(query).collect().height == expected


# ----------------------------------------------------------------- manifest damage


def test_a_damaged_manifest_marker_row_is_a_one_line_error_that_repair_fixes(tmp_path):
    store = _two_shards(tmp_path)
    before = store.nodes().collect().height
    with sqlite3.connect(store.manifest.path) as db:
        db.execute("UPDATE markers SET marker = 'tasjs' WHERE rowid = (SELECT min(rowid) FROM markers)")
    runner = CliRunner()
    at = ["--store", str(tmp_path)]
    for args in (["store", "check", *at], ["store", "info", *at], ["query", "SELECT count(*) FROM nodes", *at]):
        result = runner.invoke(app, args)
        text = result.output + (result.stderr or "")
        assert result.exit_code != 0 or "tasjs" in text, (args, text)
        assert not isinstance(result.exception, KeyError) and "Traceback" not in text, (args, text)
        assert "tasjs" in text and "store repair" in text, (args, text)
    with pytest.raises(StoreError, match="tasjs.*store repair"):
        Store(tmp_path, create=False).nodes().collect()
    result = runner.invoke(app, ["store", "repair", *at])
    assert result.exit_code == 0 and "fix manifest marker row" in result.output and "from the Delta log" in result.output
    assert runner.invoke(app, ["store", "check", "--full", *at]).exit_code == 0
    assert Store(tmp_path, create=False).nodes().collect().height == before


# ----------------------------------------------------------------- hostile tools

def _call(sb: Sandbox, name: str, **arguments):
    result, _ = sb.call("attacks", ToolCall(name=name, arguments=arguments))
    assert result.status == "ok", result
    return result.output


@pytest.fixture(scope="module")
def attacked():
    with Sandbox(workers=1, timeout_s=20.0, modules=["attack_tools"]) as sb:
        yield sb


@pytest.mark.parametrize(("attack", "check", "arguments", "expected"), [
    ("patch_encoder", "echo", {"text": "hello"}, "hello"),
    ("replace_add", "add", {"a": 2, "b": 3}, 5),
    ("set_umask", "read_umask", {}, None),
    ("limit_digits", "big_number", {}, 1001),
    ("warnings_as_errors", "warn_and_answer", {}, 42),
])
def test_a_hostile_call_cannot_change_a_later_calls_result(attacked, attack, check, arguments, expected):
    before = _call(attacked, check, **arguments)
    assert expected is None or before == expected
    attacked.call("attacks", ToolCall(name=attack, arguments={}))  # its own result may be garbled
    for _ in range(2):
        assert _call(attacked, check, **arguments) == before


def test_a_module_level_cache_does_not_make_results_depend_on_earlier_calls(attacked):
    assert [_call(attacked, "cached_count") for _ in range(3)] == [1, 1, 1]


# ----------------------------------------------------------------- exports


def _exportable(root: Path) -> Store:
    from test_store_integrity import OPTIONS

    from dataengine.derive import derive

    store = _two_shards(root)
    derive(store, run_ids=[RUN], options=OPTIONS)
    return store


EXPORTER = textwrap.dedent("""
    import os, signal, sys
    import storage.atomic as atomic
    from storage import Store
    from dataengine.derive.export import export

    real_rename = os.rename
    def rename(a, b):
        real_rename(a, b)
        os.kill(os.getpid(), signal.SIGKILL)  # between the renames of a folder swap
    os.rename = rename
    real_exchange = atomic.exchange
    def exchange(a, b):
        done = real_exchange(a, b)
        os.kill(os.getpid(), signal.SIGKILL)  # right after the swap
        return done
    atomic.exchange = exchange
    export(Store(sys.argv[1], create=False), "pairs", sys.argv[2], format="jsonl")
""")


def test_a_killed_folder_export_leaves_a_complete_export_and_the_next_one_cleans_up(tmp_path):
    from dataengine.derive.export import export
    from storage.export import load_exported

    store = _exportable(tmp_path / "store")
    out = tmp_path / "exports" / "pairs"
    export(store, "pairs", out, format="jsonl")
    rows = len(load_exported(out, "jsonl"))
    proc = subprocess.run([sys.executable, "-c", EXPORTER, str(tmp_path / "store"), str(out)], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert len(load_exported(out, "jsonl")) == rows  # old or new, never nothing
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    assert left, "the killed export left no temporary entry: the kill came too late to test cleanup"
    export(store, "pairs", out, format="jsonl")
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []


def test_file_and_folder_exports_get_the_modes_of_ordinary_files(tmp_path):
    from dataengine.derive.export import export

    store = _exportable(tmp_path / "store")
    mask = os.umask(0o022)
    try:
        folder = export(store, "pairs", tmp_path / "hf", format="hf").path
        single = export(store, "pairs", tmp_path / "pairs.parquet", format="parquet").path
    finally:
        os.umask(mask)
    assert stat.S_IMODE(Path(folder).stat().st_mode) == 0o755
    assert stat.S_IMODE(Path(single).stat().st_mode) == 0o644
    assert {stat.S_IMODE(p.stat().st_mode) for p in Path(folder).rglob("*") if p.is_file()} == {0o644}


# ----------------------------------------------------------------- bad input


def _one_line_error(result) -> str:
    text = (result.stderr or result.output).strip()
    assert result.exit_code != 0 and not isinstance(result.exception, (KeyError, FileExistsError)), text
    assert "Traceback" not in text and len(text.splitlines()) == 1 and text.startswith("error:"), text
    return text


def test_generate_into_a_plain_file_is_a_one_line_error(tmp_path):
    plain = tmp_path / "F"
    plain.write_text("not a store")
    result = CliRunner().invoke(app, ["generate", "--model", "tiny", "--tasks", "1", "--sims", "2",
                                      "--store", str(plain)])
    assert "is a file" in _one_line_error(result)


def test_export_under_a_plain_file_is_a_one_line_error(tmp_path):
    _exportable(tmp_path / "store")
    plain = tmp_path / "F"
    plain.write_text("not a folder")
    result = CliRunner().invoke(app, ["export", "pairs", "--out", str(plain / "x.parquet"),
                                      "--store", str(tmp_path / "store")])
    assert "is a file" in _one_line_error(result)


def test_a_bad_config_field_is_refused_even_where_a_flag_overrides_it(tmp_path):
    config = tmp_path / "search.yaml"
    config.write_text(json.dumps({"search": {"num_simulations": "many"}}))
    result = CliRunner().invoke(app, ["generate", "--config", str(config), "--sims", "2", "--model", "tiny",
                                      "--tasks", "1", "--store", str(tmp_path / "store")])
    text = (result.stderr or result.output)
    assert result.exit_code == 2 and "search.num_simulations" in text and "many" in text, text
