"""Schedules that fire by themselves, on a real `prefect server start`: a cron "* * * * *"
deployment of a tiny generate config, served by `dataengine schedule generate` or registered on
a work pool (`--pool`) and run by `prefect worker start`; each test waits for a flow run that the
server's scheduler created (nothing starts one by hand) to complete. Stopping the serving
process pauses the schedule. Also `schedule list`'s table at 80 columns."""

from __future__ import annotations

import io
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from prefect_server import BIN, ROOT, default_sigint, prefect_server, stop_group, tiny_config

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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with prefect_server(tmp_path_factory.mktemp("prefect-schedule")) as info:
        yield info


def wait_for(what: str, timeout: float, probe, *, alive: subprocess.Popen, logs) -> object:
    """probe() until it returns something truthy; fail naming `what` (with the logs' tails) after
    `timeout` s or when the process `alive` (serving or worker) exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        if alive.poll() is not None:
            pytest.fail(f"the serving/worker process exited ({alive.returncode}) while waiting for {what}\n{logs()}")
        time.sleep(2.0)
    pytest.fail(f"{what}: not within {timeout:.0f} s\n{logs()}")


def tiny_yaml(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path / "store").model_dump(mode="json")))
    return path


def log_tails(server, process_log):
    def logs() -> str:
        errors = [line for line in server["log"].read_text().splitlines() if "Error" in line or "ERROR" in line]
        return (f"--- {process_log.name} (tail)\n{process_log.read_text()[-3000:]}\n"
                "--- server log errors\n" + "\n".join(errors[-20:]))
    return logs


def scheduled_run_completes(name: str, alive: subprocess.Popen, logs) -> object:
    """Wait for deployment generate/`name`, for the scheduler to create its runs, then for the
    earliest to finish; returns that run (COMPLETED, else the test fails). Every run of the
    deployment must be auto_scheduled."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.exceptions import ObjectNotFound

    def deployment():
        with get_client(sync_client=True) as client:
            try:
                return client.read_deployment_by_name(f"generate/{name}")
            except ObjectNotFound:
                return None

    def runs():
        with get_client(sync_client=True) as client:
            return client.read_flow_runs(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])))

    wait_for(f"deployment generate/{name} is registered", REGISTER_S, deployment, alive=alive, logs=logs)
    made = wait_for(f"the scheduler creates a run of generate/{name}", SCHEDULER_S,
                    lambda: [r for r in runs() if r.auto_scheduled], alive=alive, logs=logs)
    first = min(made, key=lambda r: r.expected_start_time)
    # "* * * * *": the first run is the next minute after the scheduler made it.
    assert first.expected_start_time <= first.created + timedelta(seconds=60), (first.created, first.expected_start_time)

    def first_final():
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(first.id)
        return run if run.state.is_final() else None

    budget = (first.expected_start_time - datetime.now(UTC)).total_seconds() + RUN_S
    done = wait_for(f"scheduled run {first.name} (due {first.expected_start_time:%H:%M:%S}) finishes",
                    budget, first_final, alive=alive, logs=logs)
    assert done.state.is_completed(), f"{done.state}\n{logs()}"
    assert all(r.auto_scheduled for r in runs()), "a run of the deployment was not made by the scheduler"
    return done


def slot_run_id(name: str, run) -> str:
    return f"schedule/{name}/{run.expected_start_time.astimezone(UTC):%Y%m%dT%H%M}"


@pytest.mark.slow
def test_cron_schedule_fires_a_run_the_scheduler_made(server, tmp_path):
    from typer.testing import CliRunner

    from dataengine.cli import app
    from flows import schedule
    from storage import Store

    name = "every-minute"
    serve_log = tmp_path / "serve.log"
    env = {**server["env"], "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    with open(serve_log, "w") as log:
        serving = subprocess.Popen([str(BIN / "dataengine"), "schedule", "generate", "--name", name,
                                    "--cron", "* * * * *", "--config", str(tiny_yaml(tmp_path))],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=default_sigint)
    try:
        done = scheduled_run_completes(name, serving, log_tails(server, serve_log))
        listed = CliRunner().invoke(app, ["schedule", "list"], env={"COLUMNS": "80"})
        assert listed.exit_code == 0, listed.output
        header, line = listed.output.splitlines()[:2]
        assert header.split()[:4] == ["name", "cron", "suites", "tasks"]
        assert line.split()[:8] == [name, "*", "*", "*", "*", "*", "arithmetic", "2"] and line.split()[-1] == "ready"
    finally:
        stop_group(serving, 60)
    assert slot_run_id(name, done) in Store(tmp_path / "store").runs().collect()["run_id"].to_list()
    [row] = [r for r in schedule.list_schedules() if r["name"] == name]
    assert row["paused"], "stopping the serving process should pause the schedule"
    schedule.delete_schedule(name)


@pytest.mark.slow
def test_cron_schedule_on_a_work_pool_runs_in_a_worker(server, tmp_path):
    from typer.testing import CliRunner

    from dataengine.cli import app
    from flows import schedule
    from storage import Store

    name, pool = "pooled", "local-test"
    config = tiny_yaml(tmp_path)
    register = ["schedule", "generate", "--name", name, "--cron", "* * * * *", "--config", str(config), "--pool", pool]
    missing = CliRunner().invoke(app, register)
    assert missing.exit_code == 2 and f"prefect work-pool create {pool} --type process" in missing.output
    created = subprocess.run([str(BIN / "prefect"), "work-pool", "create", pool, "--type", "process"],
                             check=False, env=server["env"], capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stdout + created.stderr
    registered = CliRunner().invoke(app, register)
    assert registered.exit_code == 0 and f"prefect worker start --pool {pool}" in registered.output, registered.output

    worker_log = tmp_path / "worker.log"
    env = {**server["env"], "PREFECT_WORKER_QUERY_SECONDS": "2"}
    with open(worker_log, "w") as log:
        worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", pool], cwd=tmp_path, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=default_sigint)
    try:
        done = scheduled_run_completes(name, worker, log_tails(server, worker_log))
        schedule.pause_schedule(name)
    finally:
        stop_group(worker, 60)
    assert slot_run_id(name, done) in Store(tmp_path / "store").runs().collect()["run_id"].to_list()
    schedule.delete_schedule(name)
