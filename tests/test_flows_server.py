"""Flows and schedules against a real `prefect server start` on a free localhost port: a tiny
generate flow runs there, a cron schedule is created, listed, paused, resumed, served (a run
triggered now completes in the serving process) and deleted."""

from __future__ import annotations

import subprocess

import pytest
from prefect_server import BIN, ROOT, prefect_server, stop_group, tiny_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`prefect server start` on a free port with a private PREFECT_HOME; PREFECT_API_URL set."""
    with prefect_server(tmp_path_factory.mktemp("prefect-server")) as info:
        yield info


def test_flow_runs_on_the_server_with_its_artifact(server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    from flows.generate import run_generate

    result = run_generate(tiny_config(tmp_path / "store"), run_id="on-server")
    assert [s["trees"] for s in result["shards"]] == [2]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["generate"])))
        assert runs and all(r.state.is_completed() for r in runs)
        artifact = client.read_latest_artifacts()
        assert any(a.key == "generate-on-server" for a in artifact)


def test_schedule_create_list_pause_serve_delete(server, tmp_path):
    from prefect.deployments import run_deployment

    from flows import schedule
    from storage import Store

    store = tmp_path / "store"
    schedule.create_schedule("hourly-test", "0 * * * *", tiny_config(store))
    rows = {r["name"]: r for r in schedule.list_schedules()}
    assert rows["hourly-test"]["cron"] == "0 * * * *" and not rows["hourly-test"]["paused"]
    schedule.pause_schedule("hourly-test")
    assert schedule.list_schedules()[0]["paused"]
    schedule.resume_schedule("hourly-test")
    assert not schedule.list_schedules()[0]["paused"]
    with pytest.raises(schedule.ScheduleError, match="no schedule named 'nope'.*hourly-test"):
        schedule.pause_schedule("nope")

    # Serve it from the CLI in another process; a run requested now is executed there.
    env = {**server["env"], "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    with open(tmp_path / "serve.log", "w") as log:
        serving = subprocess.Popen([str(BIN / "dataengine"), "schedule", "serve", "hourly-test"], cwd=ROOT, env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        run = run_deployment("generate/hourly-test", timeout=300)
        log = (tmp_path / "serve.log").read_text()
        assert run.state.is_completed(), f"{run.state}\n{log[-3000:]}"
    finally:
        stop_group(serving, 60)
    runs = Store(store).runs().collect()["run_id"].to_list()
    assert any(r.startswith("schedule/hourly-test/") for r in runs)
    schedule.delete_schedule("hourly-test")
    assert schedule.list_schedules() == []


def test_schedule_commands_need_a_server(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from typer.testing import CliRunner

    from dataengine.cli import app

    with temporary_settings({PREFECT_API_URL: None}):
        result = CliRunner().invoke(app, ["schedule", "list"])
    assert result.exit_code == 2 and "prefect server start" in result.output
