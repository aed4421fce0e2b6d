"""Task files: JSONL and Parquet round trips, and bad files named by line/row and field."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataengine.suites import TaskFileError, generate_suite, load_tasks, save_tasks


@pytest.fixture(scope="module")
def tasks():
    return generate_suite("arithmetic", n_train=6, n_heldout=3, seed=1)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip(tmp_path, tasks, suffix):
    path = save_tasks(tasks, tmp_path / "sub" / f"tasks{suffix}")
    assert path.exists()
    assert load_tasks(path) == tasks


def test_round_trip_keeps_stateful_tasks(tmp_path):
    shop = generate_suite("shop", n_train=3, n_heldout=1, seed=0)
    for suffix in (".jsonl", ".parquet"):
        assert load_tasks(save_tasks(shop, tmp_path / f"shop{suffix}")) == shop


def test_parquet_has_filter_columns(tmp_path, tasks):
    path = save_tasks(tasks, tmp_path / "t.parquet")
    table = pq.read_table(path)
    assert table.column_names == ["id", "suite", "split", "toolbox", "task"]
    assert table.column("split").to_pylist() == [t.split for t in tasks]


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_missing_field_names_line_and_field(tmp_path, tasks):
    rows = [json.loads(t.model_dump_json()) for t in tasks[:3]]
    del rows[1]["toolbox"]
    path = _write_lines(tmp_path / "t.jsonl", [json.dumps(r) for r in rows])
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    assert err.value.line == 2 and err.value.field == "toolbox"
    assert "t.jsonl" in str(err.value) and "line 2" in str(err.value) and "toolbox" in str(err.value)


def test_jsonl_wrong_type_names_nested_field(tmp_path, tasks):
    rows = [json.loads(t.model_dump_json()) for t in tasks[:2]]
    rows[0]["gold"]["calls"][0]["name"] = 5
    path = _write_lines(tmp_path / "t.jsonl", ["", json.dumps(rows[0]), json.dumps(rows[1])])
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    assert err.value.line == 2  # the blank first line still counts
    assert err.value.field == "gold.calls.0.name"


def test_jsonl_invalid_json_names_line(tmp_path, tasks):
    path = _write_lines(tmp_path / "t.jsonl", [tasks[0].model_dump_json(), '{"id": "x",'])
    with pytest.raises(TaskFileError, match=r"line 2: invalid JSON") as err:
        load_tasks(path)
    assert err.value.line == 2


def test_jsonl_non_object_line(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", ["[1, 2]"])
    with pytest.raises(TaskFileError, match="expected a JSON object"):
        load_tasks(path)


def test_extra_field_is_rejected(tmp_path, tasks):
    row = json.loads(tasks[0].model_dump_json())
    row["answer"] = "42"
    path = _write_lines(tmp_path / "t.jsonl", [json.dumps(row)])
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    assert err.value.field == "answer"


def test_duplicate_ids_are_rejected(tmp_path, tasks):
    path = _write_lines(tmp_path / "t.jsonl", [tasks[0].model_dump_json(), tasks[0].model_dump_json()])
    with pytest.raises(TaskFileError, match="duplicate task id") as err:
        load_tasks(path)
    assert err.value.line == 2


def test_parquet_bad_row_names_row_and_field(tmp_path, tasks):
    rows = [json.loads(t.model_dump_json()) for t in tasks[:3]]
    rows[2]["split"] = "validation"
    table = pa.table({"id": [r["id"] for r in rows], "task": [json.dumps(r) for r in rows]})
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(TaskFileError) as err:
        load_tasks(tmp_path / "t.parquet")
    assert err.value.row == 2 and err.value.field == "split"


def test_parquet_missing_task_column(tmp_path):
    pq.write_table(pa.table({"id": ["a"]}), tmp_path / "t.parquet")
    with pytest.raises(TaskFileError, match="missing column 'task'"):
        load_tasks(tmp_path / "t.parquet")


def test_parquet_not_parquet(tmp_path):
    (tmp_path / "t.parquet").write_text("not parquet")
    with pytest.raises(TaskFileError, match="not a readable Parquet file"):
        load_tasks(tmp_path / "t.parquet")


def test_unknown_suffix_and_missing_file(tmp_path, tasks):
    with pytest.raises(TaskFileError, match="unknown task file suffix '.csv'"):
        save_tasks(tasks, tmp_path / "t.csv")
    with pytest.raises(TaskFileError, match="unknown task file suffix"):
        load_tasks(tmp_path / "t.json")
    with pytest.raises(TaskFileError, match="task file not found") as err:
        load_tasks(tmp_path / "nope.jsonl")
    assert "nope.jsonl" in str(err.value)


def test_save_rejects_non_tasks(tmp_path):
    with pytest.raises(TypeError, match="item 0 is a dict"):
        save_tasks([{"id": "x"}], tmp_path / "t.jsonl")


def test_unknown_toolbox_fails_at_load(tmp_path, tasks):
    """A task naming a toolbox nobody registered is refused when the file is read (before a
    model loads or a run is recorded), naming the line and the field."""
    from typer.testing import CliRunner

    from dataengine.cli import app

    path = tmp_path / "t.jsonl"
    rows = [json.loads(t.model_dump_json()) for t in tasks[:2]]
    rows[1]["toolbox"] = "nosuchbox"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TaskFileError, match=r"line 2.*toolbox.*nosuchbox"):
        load_tasks(path)
    out = CliRunner().invoke(app, ["generate", "--task-file", str(path), "--model", "tiny", "--store",
                                   str(tmp_path / "s"), "--no-progress"])
    assert out.exit_code == 2 and "nosuchbox" in out.output and "Traceback" not in out.output
    assert not (tmp_path / "s" / "runs").exists()
