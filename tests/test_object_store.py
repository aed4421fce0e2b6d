"""The store on S3-compatible object storage: a moto server on 127.0.0.1 (started here, in its
own process), the store at s3://bucket/path with the AWS variables pointing at it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from test_derive import RUN, task_row, tree_nodes, tree_trajectories
from typer.testing import CliRunner

from storage import CorruptFileError, Store, StoreError, StoreNotFoundError

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "dataengine-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server with bucket BUCKET; the AWS variables point at it for the module."""
    import boto3

    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log.open("w"), stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": endpoint,
           "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            client = boto3.client("s3")
            client.create_bucket(Bucket=BUCKET)
            yield client
    finally:
        server.terminate()
        server.wait(timeout=30)


def _nodes(tree: str, n: int) -> list[dict]:
    return [{"task_id": "t", "tree_id": tree, "node_id": j} for j in range(n)]


def _keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_s3_store_round_trip_time_travel_and_markers(s3):
    store = Store(f"s3://{BUCKET}/rt")
    assert str(store.root) == f"s3://{BUCKET}/rt" and store.storage_options["AWS_ALLOW_HTTP"] == "true"
    v0 = store.append("nodes", _nodes("a", 3), run_id="r", shard_id="0", marker="tasks")
    # Declared with a marker and no tasks rows yet: invisible.
    assert store.nodes().collect().height == 0 and store.pending_shards("nodes") == [("r", "0")]
    store.append("tasks", [{"task_id": "t"}], run_id="r", shard_id="0")
    assert store.nodes().collect()["tree_id"].to_list() == ["a"] * 3
    # The same shard again replaces it; the first version stays readable.
    store.append("nodes", _nodes("b", 2), run_id="r", shard_id="0", marker="tasks")
    assert store.nodes().collect()["tree_id"].to_list() == ["b"] * 2
    assert store.nodes(v0).collect()["tree_id"].to_list() == ["a"] * 3
    assert store.committed_shards("tasks", "r") == {"0"}
    assert store.sql("SELECT count(*) AS n FROM nodes").collect()["n"].to_list() == [2]
    # A CLI option typed as Path folds "s3://" into "s3:/"; the store reads it back as the bucket.
    assert Store(Path(f"s3://{BUCKET}/rt"), create=False).tables() == ["tasks", "nodes"]
    # The manifest is two Delta tables in the bucket, not a SQLite file.
    keys = _keys(s3, "rt/")
    assert any(k.startswith("rt/_manifest/files/_delta_log/") for k in keys)
    assert any(k.startswith("rt/_manifest/markers/_delta_log/") for k in keys)
    assert not any("sqlite" in k for k in keys)
    assert store.verify("nodes", full=True) == [] and store.verify("tasks", full=True) == []


def test_s3_checksums_catch_damage_and_repair_drops_the_shard(s3):
    store = Store(f"s3://{BUCKET}/damage")
    for shard in ("0", "1"):
        store.append("nodes", _nodes(shard, 3), run_id="r", shard_id=shard, marker="tasks")
        store.append("tasks", [{"task_id": "t"}], run_id="r", shard_id=shard)
    records = store.manifest.records("nodes")
    (rel,) = [p for p, r in records.items() if r.keys == (("r", "1"),)]
    key = f"damage/nodes/{rel}"
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    # Same size, one byte changed in the middle: only the checksum can tell.
    middle = len(body) // 2
    s3.put_object(Bucket=BUCKET, Key=key, Body=body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1:])
    with pytest.raises(CorruptFileError, match=rf"s3://{BUCKET}/damage/nodes/{rel}.*run 'r' shard '1'.*sha256"):
        store.nodes().collect()
    report = store.repair()
    assert any("drop 3 row(s) of run 'r' shard '1' from table 'nodes'" in line for line in report.lines(store.root))
    assert store.nodes().collect()["tree_id"].to_list() == ["0"] * 3
    assert store.committed_shards("tasks", "r") == {"0"}
    s3.delete_object(Bucket=BUCKET, Key=f"damage/nodes/{next(p for p, r in records.items() if r.keys == (('r', '0'),))}")
    with pytest.raises(CorruptFileError, match="is missing"):
        store.nodes().collect()


def test_s3_roots_that_cannot_work_are_one_line_errors(s3):
    with pytest.raises(StoreNotFoundError, match="bucket 'no-such-bucket' .* does not exist at http://127.0.0.1"):
        Store("s3://no-such-bucket/x")
    with pytest.raises(StoreNotFoundError, match=f"no store at s3://{BUCKET}/empty"):
        Store(f"s3://{BUCKET}/empty", create=False)
    with pytest.raises(StoreError, match="gs:// is not supported"):
        Store("gs://bucket/x")
    with pytest.raises(StoreError, match="names no bucket"):
        Store("s3:///x")


WRITER = """
import sys
from storage import Store
root, who, shards = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = Store(root)
for i in range(shards):
    rows = [dict(task_id="t", tree_id=who, node_id=j) for j in range(3)]
    # A shard of its own (committed by its marker), then a shard the other writer writes too.
    store.append("nodes", rows, run_id="r", shard_id=f"{who}-{i}", marker="tasks")
    store.append("tasks", [dict(task_id="t")], run_id="r", shard_id=f"{who}-{i}")
    store.append("nodes", rows, run_id="r", shard_id=f"s{i}")
"""


def test_two_concurrent_writers_on_s3_lose_and_double_nothing(s3):
    # The server refuses a second create of one key: what Delta's commits rely on.
    s3.put_object(Bucket=BUCKET, Key="probe", Body=b"1")
    with pytest.raises(s3.exceptions.ClientError, match="PreconditionFailed"):
        s3.put_object(Bucket=BUCKET, Key="probe", Body=b"2", IfNoneMatch="*")
    root = f"s3://{BUCKET}/concurrent"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, root, who, "4"], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for who in "ab"]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    store = Store(root, create=False)
    counts = (store.nodes().collect().group_by("shard_id").agg(n=pl.len(), trees=pl.col("tree_id").n_unique())
              .sort("shard_id"))
    own = counts.filter(pl.col("shard_id").str.contains("-"))
    shared = counts.filter(~pl.col("shard_id").str.contains("-"))
    assert own["shard_id"].to_list() == [f"{w}-{i}" for w in "ab" for i in range(4)] and own["n"].to_list() == [3] * 8
    assert shared["shard_id"].to_list() == [f"s{i}" for i in range(4)]
    assert shared["n"].to_list() == [3] * 4 and shared["trees"].to_list() == [1] * 4
    assert store.committed_shards("tasks", "r") == {f"{w}-{i}" for w in "ab" for i in range(4)}
    assert store.pending_shards("nodes") == []
    # Both writers' manifest rows landed: every active data file has its checksum, and matches it.
    assert store.verify("nodes", full=True) == [] and store.verify("tasks", full=True) == []
    assert len(store.manifest.declared("nodes")["tasks"]) == 8


@pytest.mark.slow
def test_generate_derive_export_query_on_s3(s3, tmp_path):
    from dataengine.cli import app

    root = f"s3://{BUCKET}/cli"
    runner = CliRunner()
    gen = runner.invoke(app, ["generate", "--suite", "arithmetic", "--tasks", "2", "--model", "tiny", "--sims", "2",
                              "--k", "2", "--max-new-tokens", "4", "--device", "cpu", "--value", "zero",
                              "--store", root, "--no-progress", "--run-id", "gen"])
    assert gen.exit_code == 0, gen.output
    store = Store(root, create=False)
    assert store.committed_shards("tasks", "gen") and store.nodes().filter(pl.col("run_id") == "gen").collect().height
    again = runner.invoke(app, ["generate", "--suite", "arithmetic", "--tasks", "2", "--model", "tiny", "--sims", "2",
                                "--k", "2", "--max-new-tokens", "4", "--device", "cpu", "--value", "zero",
                                "--store", root, "--no-progress", "--run-id", "gen"])
    assert again.exit_code == 0 and "already committed" in again.output
    # A hand-built tree with a success and failures, so derive has pairs to make.
    store.append("nodes", tree_nodes(), run_id=RUN, shard_id="s0", marker="tasks")
    store.append("trajectories", tree_trajectories(), run_id=RUN, shard_id="s0", marker="tasks")
    store.append("tasks", [task_row()], run_id=RUN, shard_id="s0")
    for run in ("gen", RUN):
        derived = runner.invoke(app, ["derive", "all", "--store", root, "--run", run, "--rule", "margin", "--margin", "0.8"])
        assert derived.exit_code == 0, derived.output
    lines = [json.loads(line) for line in derived.output.splitlines()]
    # Result lines carry "kind"; the pair audit's lines ("audit") follow them.
    rows = {line["kind"]: line["rows"] for line in lines if "kind" in line}
    assert [line["audit"] for line in lines if "kind" not in line] == ["step-pairs"] * (len(lines) - len(rows))
    assert rows["step-pairs"] == 1 and rows["trajectory-pairs"] == 2 and rows["sft"] == 1
    out = tmp_path / "pairs.parquet"
    exported = runner.invoke(app, ["export", "pairs", "--store", root, "--out", str(out), "--run-id", RUN])
    assert exported.exit_code == 0, exported.output
    assert pl.read_parquet(out).height == 3
    query = runner.invoke(app, ["query", "--store", root, "--format", "json",
                                "SELECT run_id, count(*) AS n FROM trajectories GROUP BY run_id ORDER BY run_id"])
    assert query.exit_code == 0, query.output
    assert [r["run_id"] for r in json.loads(query.output)] == ["gen", RUN]
    assert store.verify("pairs", full=True) == []


def test_local_store_keeps_its_sqlite_manifest(tmp_path):
    store = Store(tmp_path / "s")
    store.append("nodes", _nodes("a", 2), run_id="r", shard_id="0", marker="tasks")
    assert (tmp_path / "s" / "_manifest.sqlite").is_file() and not (tmp_path / "s" / "_manifest").exists()
    assert store.storage_options is None and store.manifest.declared("nodes") == {"tasks": {("r", "0")}}


def test_storage_options_come_from_the_aws_variables_then_the_store(monkeypatch):
    from storage.location import ObjectPath, storage_options, store_root

    for key in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert storage_options() == {"AWS_ACCESS_KEY_ID": "env-key", "AWS_SECRET_ACCESS_KEY": "env-secret",
                                 "AWS_ENDPOINT_URL": "http://10.0.0.1:9000", "AWS_REGION": "eu-west-1",
                                 "AWS_ALLOW_HTTP": "true"}
    # Options given to the store win (any case); an https endpoint needs no AWS_ALLOW_HTTP.
    given = storage_options({"aws_endpoint_url": "https://minio.example", "AWS_REGION": "us-east-2"})
    assert given["AWS_ENDPOINT_URL"] == "https://minio.example" and given["AWS_REGION"] == "us-east-2"
    assert "AWS_ALLOW_HTTP" not in given and given["AWS_ACCESS_KEY_ID"] == "env-key"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://10.0.0.2:9000")
    assert storage_options()["AWS_ENDPOINT_URL"] == "http://10.0.0.2:9000"
    root = store_root(Path("s3://bucket/a/b/"))
    assert isinstance(root, ObjectPath) and (root.bucket, root.key, str(root / "nodes")) == (
        "bucket", "a/b", "s3://bucket/a/b/nodes")
    assert store_root("runs/store") == Path("runs/store") and store_root("file:///tmp/s") == Path("/tmp/s")
