"""Store integrity: checksums of every data file, committed-only reads of multi-table shards
(with a real SIGKILL between a shard's commits), repair, and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from dataengine.cli import app
from dataengine.derive import DeriveOptions, derive
from dataengine.search.run import ShardOutput, write_shard
from dataengine.types import Message, Task, ToolSpec
from storage import CorruptFileError, Store, StoreError, integrity
from storage.queries import success_rate

ROOT = Path(__file__).resolve().parents[1]
RUN = "gen-1"
ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
MUL = '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'
OPTIONS = DeriveOptions(margin=0.2, replay_min_samples=1)


def shard_output(index: int) -> ShardOutput:
    """Shard `shard-<index>` of one task: a tree whose step pairs, trajectory pairs and SFT
    rows are known (root; add Q .9 -> answers 5 (solved) and 6; multiply Q .2 -> 6)."""
    task_id = f"t{index}"
    task = Task(id=task_id, suite="arith", toolbox="arith", messages=[Message(role="user", content="What is 2 plus 3?")],
                tools=[ToolSpec(name="add", description="Add two numbers."),
                       ToolSpec(name="multiply", description="Multiply two numbers.")])
    m0 = [{"role": "user", "content": "What is 2 plus 3?"}]
    m1 = m0 + [{"role": "assistant", "content": ADD}, {"role": "tool", "name": "add", "content": "5"}]
    m2 = m0 + [{"role": "assistant", "content": MUL}, {"role": "tool", "name": "multiply", "content": "6"}]
    m4, m5, m6 = (m + [{"role": "assistant", "content": a}] for m, a in ((m1, "5"), (m1, "6"), (m2, "6")))

    def node(i, parent, text, q, visits, messages, *, terminal=False, success=None):
        return {"task_id": task_id, "suite": "arith", "tree_id": f"tree-{index}", "node_id": i, "parent_id": parent,
                "depth": 0 if parent is None else (1 if parent == 0 else 2), "action_text": text,
                "action_key": text, "q": q, "visits": visits, "logprob": -1.0, "terminal": terminal,
                "success": success, "env_hash": "e0", "messages_json": json.dumps(messages)}

    def traj(tid, node_ids, messages, success, reward):
        return {"task_id": task_id, "suite": "arith", "split": "train", "tree_id": f"tree-{index}", "traj_id": f"{tid}-{index}",
                "node_ids": node_ids, "source": "mcts", "messages_json": json.dumps(messages), "reward": reward,
                "success": success, "num_steps": sum(m["role"] == "assistant" for m in messages)}

    nodes = [node(0, None, None, 0.5, 10, m0), node(1, 0, ADD, 0.9, 5, m1), node(2, 0, MUL, 0.2, 3, m2),
             node(4, 1, "5", 1.0, 4, m4, terminal=True, success=True), node(5, 1, "6", 0.0, 1, m5, terminal=True, success=False),
             node(6, 2, "6", 0.0, 2, m6, terminal=True, success=False)]
    trajs = [traj("A", [0, 1, 4], m4, True, 1.0), traj("B", [0, 1, 5], m5, False, 0.05), traj("C", [0, 2, 6], m6, False, 0.0)]
    tasks = [{"task_id": task_id, "suite": "arith", "split": "train", "task_json": task.model_dump_json()}]
    return ShardOutput(shard_id=f"shard-{index}", tasks=tasks, nodes=nodes, trajectories=trajs)


# The child writes one shard with the real write_shard; with a table name it SIGKILLs itself
# right before appending to that table (the commits before it are done).
CHILD = """
import json, os, signal, sys
from dataengine.search.run import ShardOutput, write_shard
from storage import Store
root, run_id, rows_file, kill_before = sys.argv[1:5]
if kill_before:
    original = Store.append
    def append(self, table, rows, **kw):
        if table == kill_before:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, table, rows, **kw)
    Store.append = append
write_shard(Store(root), ShardOutput(**json.loads(open(rows_file).read())), run_id)
"""


def write_in_child(root: Path, index: int, kill_before: str = "") -> int:
    out = shard_output(index)
    rows_file = root.parent / f"shard-{index}.json"
    rows_file.write_text(json.dumps({"shard_id": out.shard_id, "tasks": out.tasks, "nodes": out.nodes,
                                     "trajectories": out.trajectories}))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(root), RUN, str(rows_file), kill_before], check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
    return proc.returncode


def derived_tasks(store: Store) -> dict[str, set[str]]:
    """{table: task_ids} of the derived rows, checking every row carries its tools."""
    out = {}
    for table in ("pairs", "sft", "replay"):
        frame = store.scan(table).collect()
        assert frame["tools_json"].null_count() == 0, table
        assert all(json.loads(t) for t in frame["tools_json"]), table
        out[table] = set(frame["task_id"])
    return out


@pytest.mark.parametrize("kill_before", ["tasks", pytest.param("trajectories", marks=pytest.mark.slow)])
def test_kill_between_shard_commits_hides_the_shard_until_rerun(tmp_path, kill_before):
    store = Store(tmp_path / "store")
    write_shard(store, shard_output(0), RUN)
    assert write_in_child(store.root, 1, kill_before=kill_before) == -signal.SIGKILL
    # The killed shard's first commit(s) are on disk, but no reader sees them.
    raw = store.scan("nodes", committed=False).collect()
    assert set(raw["shard_id"]) == {"shard-0", "shard-1"}
    assert set(store.nodes().collect()["shard_id"]) == {"shard-0"}
    assert set(store.trajectories().collect()["task_id"]) == {"t0"}
    assert store.pending_shards("nodes") == [(RUN, "shard-1")]
    assert store.committed_shards("tasks", RUN) == {"shard-0"}  # so a rerun redoes shard-1
    assert success_rate(store).collect()["episodes"].to_list() == [3]
    assert store.sql("SELECT count(*) AS n FROM nodes").collect()["n"].item() == 6
    assert store.sql("SELECT count(*) AS n FROM nodes", committed=False).collect()["n"].item() == 12

    results = {r.kind: r.rows for r in derive(store, run_ids=[RUN], options=OPTIONS)}
    assert results["step-pairs"] == 2 and results["sft"] == 1
    assert derived_tasks(store) == {"pairs": {"t0"}, "sft": {"t0"}, "replay": {"t0"}}

    # The rerun writes the whole shard; derive then builds from both, every row with its tools.
    write_shard(store, shard_output(1), RUN)
    assert store.pending_shards("nodes") == [] and store.pending_shards("trajectories") == []
    results = {r.kind: r.rows for r in derive(store, run_ids=[RUN], options=OPTIONS)}
    assert results["step-pairs"] == 4 and results["sft"] == 2
    assert derived_tasks(store) == {"pairs": {"t0", "t1"}, "sft": {"t0", "t1"}, "replay": {"t0", "t1"}}


def test_derive_names_a_run_whose_shards_are_all_half_written(tmp_path):
    store = Store(tmp_path)
    out = shard_output(0)
    store.append("nodes", out.nodes, run_id=RUN, shard_id=out.shard_id, marker="tasks")
    store.append("trajectories", out.trajectories, run_id=RUN, shard_id=out.shard_id, marker="tasks")
    with pytest.raises(ValueError, match="without their tasks commit marker.*shard 'shard-0'"):
        derive(store, run_ids=[RUN], options=OPTIONS)


def test_tables_written_without_a_marker_are_visible(tmp_path):
    """Rescore runs (trajectories only), evaluations and derived tables need no marker."""
    store = Store(tmp_path)
    out = shard_output(0)
    store.append("trajectories", out.trajectories, run_id=f"{RUN}/rescore", shard_id=out.shard_id)
    store.append("pairs", [{"pair_id": "p", "task_id": "t0"}], run_id=RUN, shard_id="derive/step-pairs")
    assert store.trajectories().collect().height == 3 and store.pairs().collect().height == 1
    # A shard rewritten without a marker no longer waits for one.
    store.append("nodes", out.nodes, run_id=RUN, shard_id="s", marker="tasks")
    assert store.nodes().collect().height == 0
    store.append("nodes", out.nodes, run_id=RUN, shard_id="s")
    assert store.nodes().collect().height == 6
    with pytest.raises(ValueError, match="marker of table 'nodes'"):
        store.append("nodes", out.nodes, run_id=RUN, shard_id="s", marker="nodes")


def damage(path: Path, pos: int, width: int) -> bytes:
    """Change `width` bytes at `pos` (each to a different value); return the original bytes."""
    raw = path.read_bytes()
    changed = bytearray(raw)
    for i in range(pos, min(pos + width, len(raw))):
        changed[i] ^= 0xFF if width == 1 else (0x5A + i) % 255 + 1
    path.write_bytes(bytes(changed))
    return raw


def shard_file(store: Store, table: str, shard_id: str) -> Path:
    (path,) = [store.table_path(table) / rel for rel, rec in store.manifest.records(table).items()
               if (RUN, shard_id) in rec.keys and (store.table_path(table) / rel).exists()]
    return path


def test_every_one_and_16_byte_change_in_three_tables_is_found(tmp_path):
    store = Store(tmp_path)
    write_shard(store, shard_output(0), RUN)
    found = 0
    for table in ("nodes", "trajectories", "tasks"):
        path = shard_file(store, table, "shard-0")
        size = path.stat().st_size
        # Header, footer (length and magic), and 40 positions spread over the data pages.
        positions = sorted({0, 3, 4, 8, size - 1, size - 4, size - 8, size - 16, size // 2}
                           | {size * k // 40 for k in range(40)})
        for pos in positions:
            for width in (1, 16):
                original = damage(path, pos, width)
                problems = store.verify(table, full=True)
                assert [(p.path, p.kind) for p in problems] == [(path.name, "checksum")], (table, pos, width)
                with pytest.raises(CorruptFileError, match=path.name):
                    store.scan(table)
                path.write_bytes(original)
                found += 1
        assert store.verify(table, full=True) == []
    assert found >= 3 * 2 * 40
    assert store.nodes().collect().height == 6


def test_reads_hash_a_file_once_and_again_when_it_changes(tmp_path, monkeypatch):
    store = Store(tmp_path)
    store.append("tasks", shard_output(0).tasks, run_id=RUN, shard_id="shard-0")
    hashed = []
    real = integrity.sha256_file
    # Data files only: the log entries are checked (and counted) by test_attacks.py.
    monkeypatch.setattr(integrity, "sha256_file", lambda p: ("_delta_log" in str(p) or hashed.append(p)) and real(p)
                        or real(p))
    time.sleep(1.1)  # past the racy window: a file modified within 1 s of its check is re-hashed
    store.tasks().collect()
    store.tasks().collect()
    assert len(hashed) == 1
    # Damage that restores the old mtime still changes the inode's ctime: found on read.
    path = shard_file(store, "tasks", "shard-0")
    st = path.stat()
    damage(path, st.st_size // 2, 1)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(CorruptFileError, match=f"{path.name}.*sha256"):
        store.tasks()
    assert len(hashed) == 2


def test_repair_drops_the_damaged_shard_and_the_rerun_regenerates_it(tmp_path):
    store = Store(tmp_path)
    for index in (0, 1):
        write_shard(store, shard_output(index), RUN)
    before = {r.kind: r.rows for r in derive(store, run_ids=[RUN], options=OPTIONS)}
    path = shard_file(store, "nodes", "shard-1")
    damage(path, 100, 16)
    with pytest.raises(CorruptFileError, match=f"{path.name}.*shard 'shard-1'.*store repair"):
        derive(store, run_ids=[RUN], options=OPTIONS)

    versions = store.table_versions()
    plan = store.repair(dry_run=True)
    assert store.table_versions() == versions  # a dry run changes nothing
    lines = plan.lines(store.root)
    assert lines[0].startswith("damaged: table 'nodes'") and path.name in lines[0]
    assert "would drop 1 row(s) of run 'gen-1' shard 'shard-1' from table 'tasks' (its commit marker)" in lines
    assert "would drop 6 row(s) of run 'gen-1' shard 'shard-1' from table 'nodes' (damaged file " + path.name + ")" in lines
    assert any(line.startswith("would drop 3 row(s) of run 'gen-1' shard 'shard-1' from table 'trajectories'") for line in lines)
    assert lines[-1] == "rerun run(s) 'gen-1' to regenerate the dropped shard(s)"

    done = store.repair()
    assert [line.removeprefix("would ") for line in lines] == done.lines(store.root)
    for table in ("nodes", "trajectories", "tasks"):
        assert store.verify(table, full=True) == []
        assert set(store.scan(table, committed=False).collect()["shard_id"]) == {"shard-0"}
    assert store.repair().lines(store.root) == [
        "nothing to repair: every data file is present, matches its checksum and decodes"]
    # The generate run's resume test (tasks rows) now redoes shard-1.
    assert store.committed_shards("tasks", RUN) == {"shard-0"}
    write_shard(store, shard_output(1), RUN)
    assert {r.kind: r.rows for r in derive(store, run_ids=[RUN], options=OPTIONS)} == before


def test_compacted_files_keep_checksums_and_repair_drops_all_their_shards(tmp_path):
    store = Store(tmp_path)
    for index in range(3):
        write_shard(store, shard_output(index), RUN)
    store.compact("nodes")
    (record,) = [r for p, r in store.manifest.records("nodes").items() if r.source == "compact"]
    assert sorted(record.keys) == [(RUN, f"shard-{i}") for i in range(3)]
    # Rewriting one shard after compaction records the rewritten files with their own keys.
    write_shard(store, shard_output(1), RUN)
    assert store.verify("nodes", full=True) == []
    active = {r["path"] for r in store.data_files("nodes").to_pylist()}
    keys = sorted(k for p, r in store.manifest.records("nodes").items() if p in active for k in r.keys)
    assert keys == [(RUN, f"shard-{i}") for i in range(3)]
    records = store.manifest.records("nodes")
    shared = max(active, key=lambda p: len(records[p].keys))
    held = sorted(records[shared].keys)
    assert len(held) >= 2
    damage(store.table_path("nodes") / shared, 50, 1)
    lines = store.repair().lines(store.root)
    dropped = {line.split(" from table ")[0] + " " + line.split(" from table ")[1].split(" ")[0]
               for line in lines if line.startswith("drop ")}
    expected = {f"drop {n} row(s) of run 'gen-1' shard '{s}' '{t}'"
                for _, s in held for t, n in (("nodes", 6), ("trajectories", 3), ("tasks", 1))}
    assert dropped == expected
    for table in ("nodes", "trajectories", "tasks"):
        assert set(store.scan(table, committed=False).collect()["shard_id"]) == {f"shard-{i}" for i in range(3)} - {
            s for _, s in held}


def test_files_without_a_checksum_are_refused_until_adopted(tmp_path):
    store = Store(tmp_path)
    write_shard(store, shard_output(0), RUN)
    store.manifest.path.unlink()  # as in a store written before checksums were recorded
    old = Store(tmp_path, record_grace_s=0, create=False)  # a reader: a writer would heal at its start
    with pytest.raises(CorruptFileError, match="no recorded checksum.*store repair --adopt"):
        old.nodes()
    # Younger than the grace: may be in flight (a reader; a writer's Store would heal them).
    assert Store(tmp_path, create=False).nodes().collect().height == 6
    assert {p.kind for p in old.verify("nodes", full=True)} == {"unrecorded"}
    report = old.repair(dry_run=True)
    assert [p.kind for p in report.unrecorded] == ["unrecorded"] * 3
    report = old.repair(adopt=True)
    # Their commits are checked against the log and recorded (healed), log entries too.
    assert not report.adopted and all(line.startswith("heal: ") for line in report.lines(old.root))
    assert sum("1 data file(s)" in line for line in report.healed) == 3
    assert old.nodes().collect().height == 6 and old.verify("nodes", full=True) == []
    path = shard_file(old, "nodes", "shard-0")
    damage(path, 20, 1)
    with pytest.raises(CorruptFileError, match="sha256"):
        old.nodes()


def test_a_read_error_after_the_check_names_the_file(tmp_path):
    store = Store(tmp_path)
    write_shard(store, shard_output(0), RUN)
    frame = store.nodes().select(pl.all())
    path = shard_file(store, "nodes", "shard-0")
    path.write_bytes(path.read_bytes()[:200] + bytes(path.stat().st_size - 200))
    with pytest.raises(CorruptFileError, match=f"{path.name}.*sha256.*store repair") as info:
        store.collect(frame, tables=["nodes"])
    assert "\n" not in str(info.value)


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_cli_damaged_or_missing_store_gives_one_line_errors(tmp_path):
    store = Store(tmp_path / "store")
    write_shard(store, shard_output(0), RUN)
    derive(store, run_ids=[RUN], options=OPTIONS)
    runner = CliRunner()
    at = ["--store", str(store.root)]
    assert runner.invoke(app, ["store", "check", "--full", *at]).exit_code == 0
    nodes, pairs = shard_file(store, "nodes", "shard-0"), shard_file(store, "pairs", "derive/step-pairs")
    damage(nodes, 60, 16)
    damage(pairs, 60, 1)

    result = runner.invoke(app, ["store", "check", "--full", *at])
    assert result.exit_code == 1
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 2 and nodes.name in errors[0] and pairs.name in errors[1]
    assert "tasks: ok" in result.stdout
    result = runner.invoke(app, ["query", "SELECT count(*) FROM nodes", *at])
    assert result.exit_code == 1 and nodes.name in one_line(result) and "store repair" in one_line(result)
    result = runner.invoke(app, ["export", "pairs", "--out", str(tmp_path / "p.parquet"), *at])
    assert result.exit_code == 1 and pairs.name in one_line(result)
    with pytest.raises(StoreError, match=nodes.name):
        derive(store, run_ids=[RUN], options=OPTIONS)
    result = runner.invoke(app, ["derive", "all", "--run", RUN, *at])
    assert result.exit_code == 1 and nodes.name in one_line(result) and "store repair" in one_line(result)

    result = runner.invoke(app, ["store", "repair", "--dry-run", *at])
    assert result.exit_code == 0 and "would drop 6 row(s) of run 'gen-1' shard 'shard-0' from table 'nodes'" in result.stdout
    result = runner.invoke(app, ["store", "repair", *at])
    assert result.exit_code == 0 and "drop 2 row(s) of run 'gen-1' shard 'derive/step-pairs' from table 'pairs'" in result.stdout
    assert runner.invoke(app, ["store", "check", "--full", *at]).exit_code == 0

    missing = ["--store", str(tmp_path / "nowhere")]
    for args in (["query", "SELECT 1"], ["export", "pairs", "--out", str(tmp_path / "q.parquet")], ["store", "check"],
                 ["store", "repair"]):
        result = runner.invoke(app, [*args, *missing])
        assert result.exit_code == 1 and "no store at" in one_line(result), args


def test_each_marker_is_read_at_its_own_version(tmp_path):
    """Trajectories written under two markers (generate shards: tasks; evaluation shards:
    evals) whose tables are at different versions: derive and export read each marker at its
    own version (`make demo` once failed here: the tasks version was used to open evals)."""
    store = Store(tmp_path / "store")
    write_shard(store, shard_output(0), RUN)
    write_shard(store, shard_output(1), RUN)
    store.append("trajectories", [{"task_id": "e0", "traj_id": "e0/0", "success": True}], run_id="eval", shard_id="e",
                 marker="evals")
    store.append("evals", [{"model_id": "m", "suite": "s", "metric": "greedy_success", "value": 1.0, "n": 1}],
                 run_id="eval", shard_id="e")
    assert store.version("tasks") > store.version("evals")
    versions = {"tasks": store.version("tasks"), "evals": store.version("evals")}
    rows = store.committed("trajectories", marker_versions=versions).collect()
    assert {"t0", "t1", "e0"} <= set(rows["task_id"])
    assert store.committed("trajectories", marker_versions={"tasks": 0}).collect().height < rows.height
    results = {r.kind: r.rows for r in derive(store, run_ids=[RUN], options=OPTIONS)}
    assert results["step-pairs"] == 4
