"""Flows and schedules against a real `prefect server start` on a free localhost port: a tiny
generate flow runs there, a cron schedule is created, listed, paused, resumed, served (a run
triggered now completes in the serving process) and deleted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"prefect server at {url} not healthy after {timeout} s")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`prefect server start` on a free port with a private PREFECT_HOME; PREFECT_API_URL set."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_HOME,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )

    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false", "PREFECT_API_URL": url}
    log = open(home / "server.log", "w")  # noqa: SIM115 - the server writes it until teardown
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(url, proc)
        with temporary_settings({PREFECT_API_URL: url, PREFECT_HOME: str(home), PREFECT_SERVER_ANALYTICS_ENABLED: False}):
            yield {"url": url, "env": env, "home": home}
    finally:
        from flows.runtime import drain_concurrency_services

        drain_concurrency_services()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def tiny_config(store):
    from dataengine.config import EngineConfig

    return EngineConfig.model_validate({
        "store": str(store), "suites": ["arithmetic"], "num_tasks": 2, "shard_size": 2, "sandbox": {"workers": 1},
        "policy": {"model": "tiny", "device": "cpu", "max_new_tokens": 8},
        "search": {"num_simulations": 2, "num_actions": 2, "max_depth": 2, "value": "zero"},
    })


def test_flow_runs_on_the_server_with_its_artifact(server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from flows.generate import run_generate

    result = run_generate(tiny_config(tmp_path / "store"), run_id="on-server")
    assert [s["trees"] for s in result["shards"]] == [2]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["generate mcts"])))
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
        os.killpg(serving.pid, signal.SIGTERM)
        serving.wait(60)
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
