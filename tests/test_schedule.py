"""Schedules that fire by themselves: `dataengine schedule generate --cron "* * * * *"` serves a
tiny generate deployment on a real `prefect server start`, and a flow run that the server's
scheduler created (never one started by hand) completes in the serving process; stopping the
serving process pauses the schedule. Also `schedule list`'s table at 80 columns."""

from __future__ import annotations

import io
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from prefect_server import BIN, ROOT, prefect_server, stop_group, tiny_config

NAME = "every-minute"
REGISTER_S = 120  # the serving process imports torch and the flow before it registers
SCHEDULER_S = 30  # Prefect's scheduler schedules a just-registered deployment within ~5 s
RUN_S = 150  # from the run's scheduled time to COMPLETED (poll 2 s, a tiny model, one shard)


def render(rows) -> list[str]:
    from rich.console import Console

    from flows.schedule import schedule_table

    out = io.StringIO()
    Console(file=out, width=80).print(schedule_table(rows))
    return [line.rstrip() for line in out.getvalue().splitlines()]


def row(**kw):
    base = {"name": "hourly", "id": "x", "cron": "0 * * * *", "paused": False, "method": "mcts",
            "suites": "arithmetic", "tasks": 32, "next_run": None, "ready": True, "pool": None}
    return {**base, **kw}


def test_schedule_table_fits_80_columns_with_headers():
    lines = render([
        row(next_run="2026-11-23T12:00:00+02:00"),
        row(name="a-very-long-schedule-name-for-nightly-runs", cron="0 2 * * 1-5",
            suites="arithmetic,notool,calendar,units", tasks=1000, ready=False),
        row(name="stopped", paused=True, next_run="2026-11-23T12:00:00+00:00"),
    ])
    assert lines[0].split() == ["name", "cron", "suites", "tasks", "next", "run", "(UTC)", "state"]
    assert all(len(line) <= 80 for line in lines), lines
    hourly, long, stopped = lines[1:]
    assert hourly.split() == ["hourly", "0", "*", "*", "*", "*", "arithmetic", "32", "2026-11-23", "10:00", "ready"]
    assert long.startswith("a-very-long-s…") and "…" in long.split()[6]  # suites cut too
    assert long.split()[-4:] == ["none", "yet", "not", "served"] and " 1000 " in long
    assert stopped.split()[-2:] == ["-", "paused"]


@pytest.fixture
def server(tmp_path_factory):
    with prefect_server(tmp_path_factory.mktemp("prefect-schedule")) as info:
        yield info


def wait_for(what: str, timeout: float, probe, *, alive: subprocess.Popen, logs) -> object:
    """probe() until it returns something truthy; fail naming `what` (with the logs' tails) after
    `timeout` s or when the serving process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        if alive.poll() is not None:
            pytest.fail(f"the serving process exited ({alive.returncode}) while waiting for {what}\n{logs()}")
        time.sleep(2.0)
    pytest.fail(f"{what}: not within {timeout:.0f} s\n{logs()}")


@pytest.mark.slow
def test_cron_schedule_fires_a_run_the_scheduler_made(server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.exceptions import ObjectNotFound
    from typer.testing import CliRunner

    from dataengine.cli import app
    from flows import schedule
    from storage import Store

    store = tmp_path / "store"
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config(store).model_dump(mode="json")))
    serve_log = tmp_path / "serve.log"

    def logs() -> str:
        server_log = server["log"].read_text()
        errors = [line for line in server_log.splitlines() if "Error" in line or "ERROR" in line]
        return (f"--- serve log (tail)\n{serve_log.read_text()[-3000:]}\n"
                f"--- server log errors\n" + "\n".join(errors[-20:]))

    def deployment():
        with get_client(sync_client=True) as client:
            try:
                return client.read_deployment_by_name(f"generate/{NAME}")
            except ObjectNotFound:
                return None

    def runs():
        with get_client(sync_client=True) as client:
            return client.read_flow_runs(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[NAME])))

    env = {**server["env"], "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    with open(serve_log, "w") as log:
        serving = subprocess.Popen([str(BIN / "dataengine"), "schedule", "generate", "--name", NAME,
                                    "--cron", "* * * * *", "--config", str(config)],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for("the serving process registers the deployment", REGISTER_S, deployment, alive=serving, logs=logs)
        registered = datetime.now(UTC)
        made = wait_for("the scheduler creates a run of the cron deployment", SCHEDULER_S,
                        lambda: [r for r in runs() if r.auto_scheduled], alive=serving, logs=logs)
        first = min(made, key=lambda r: r.expected_start_time)
        assert first.expected_start_time <= registered + timedelta(seconds=61), first.expected_start_time
        budget = (first.expected_start_time - datetime.now(UTC)).total_seconds() + RUN_S

        def first_final():
            with get_client(sync_client=True) as client:
                run = client.read_flow_run(first.id)
            return run if run.state.is_final() else None

        done = wait_for(f"scheduled run {first.name} (due {first.expected_start_time:%H:%M:%S}) finishes",
                        budget, first_final, alive=serving, logs=logs)
        assert done.state.is_completed(), f"{done.state}\n{logs()}"
        assert all(r.auto_scheduled for r in runs()), "a run of the deployment was not made by the scheduler"

        listed = CliRunner().invoke(app, ["schedule", "list"], env={"COLUMNS": "80"})
        assert listed.exit_code == 0, listed.output
        header, line = listed.output.splitlines()[:2]
        assert header.split()[:4] == ["name", "cron", "suites", "tasks"]
        assert line.split()[:8] == [NAME, "*", "*", "*", "*", "*", "arithmetic", "2"] and line.split()[-1] == "ready"
    finally:
        stop_group(serving, 60)
    slot = f"schedule/{NAME}/{done.expected_start_time.astimezone(UTC):%Y%m%dT%H%M}"
    assert slot in Store(store).runs().collect()["run_id"].to_list()
    [listed_row] = schedule.list_schedules()
    assert listed_row["paused"], "stopping the serving process should pause the schedule"
    schedule.delete_schedule(NAME)
