"""`dataengine demo --quick`: gold table, the whole pipeline on the tiny model, the report."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def test_quick_demo_end_to_end(tmp_path):
    from dataengine.cli import app
    from storage import Store

    result = CliRunner().invoke(app, ["demo", "--quick", "--tasks", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for text in ("gold", "before (tiny)", "store:", "datasets:", "checkpoint:", "report:", "dataengine query"):
        assert text in result.output
    assert (tmp_path / "report" / "report.html").exists()
    store = Store(tmp_path / "store")
    runs = set(store.runs().collect()["run_id"].to_list())
    assert {"demo", "demo/r0/eval", "demo/r1", "demo/r1/eval"} <= runs
    assert store.committed_shards("tasks", "demo/r1")
    # The store answers questions about the run, as the demo's last line suggests.
    frame = store.sql("SELECT run_id, count(*) AS n FROM trajectories GROUP BY run_id ORDER BY run_id").collect()
    assert "demo/r1" in frame["run_id"].to_list()
