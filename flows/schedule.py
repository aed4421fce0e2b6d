"""Schedules: Prefect deployments of the generate flow with a cron schedule, and a process that
serves them (flow.to_deployment + prefect.serve).

Schedules need a long-lived Prefect API with its scheduler service, i.e. a `prefect server
start` (or Prefect Cloud) and PREFECT_API_URL pointing at it: the embedded ephemeral API runs no
scheduler, so every function here refuses to work without PREFECT_API_URL and says so. The
server's scheduler only creates the runs; something must execute them: a process serving the
deployment (`serve`, blocks) or, for a deployment registered on a work pool, a `prefect worker`.

A scheduled run without an explicit run id writes run `schedule/<name>/<YYYYmmddTHHMM>` (its
scheduled time) with the seed moved by that time, so each run searches fresh tasks; a retried
run of the same slot resumes its own shards.
"""

from __future__ import annotations

from typing import Any

from dataengine.config import EngineConfig
from flows.runtime import RuntimeConfig

FLOW_NAME = "generate"
TAG = "dataengine"


class ScheduleError(RuntimeError):
    """A schedule command that cannot work (no Prefect server, unknown schedule, ...)."""


def require_server() -> str:
    """PREFECT_API_URL, or ScheduleError telling how to start a server."""
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:
        raise ScheduleError(
            "schedules need a Prefect server with its scheduler (the embedded ephemeral API has none): run "
            "`prefect server start` in another shell, then `export PREFECT_API_URL=http://127.0.0.1:4200/api`"
        )
    return api


def deployment_for(name: str, cron: str, config: EngineConfig, *, method: str = "mcts", vary_seed: bool = True,
                   runtime: RuntimeConfig | None = None, paused: bool = False) -> Any:
    """A RunnerDeployment of the generate flow named `name` with a cron schedule."""
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    from flows.generate import generate_flow

    try:
        schedule = Cron(cron)
    except Exception as exc:  # croniter rejects the text
        raise ScheduleError(f"bad cron expression {cron!r}: {exc}") from exc
    return generate_flow.to_deployment(
        name=name,
        schedule=schedule,
        # A module path: a file path would put flows/ itself on sys.path, where its modules shadow others.
        entrypoint_type=EntrypointType.MODULE_PATH,
        paused=paused,
        tags=[TAG],
        parameters={"config": config.model_dump(mode="json"), "method": method, "vary_seed": vary_seed,
                    "runtime": (runtime or RuntimeConfig()).model_dump(mode="json")},
        description=f"dataengine generate ({method}) on {', '.join(config.suites)}, cron {cron!r}",
    )


def create_schedule(name: str, cron: str, config: EngineConfig, *, pool: str | None = None, **options: Any) -> str:
    """Register the deployment (without serving it), on work pool `pool` if given (a worker of
    that pool then runs it); returns its id."""
    require_server()
    deployment = deployment_for(name, cron, config, **options)
    if pool is None:
        return str(deployment.apply())
    from prefect.exceptions import ObjectNotFound

    with _client() as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            raise ScheduleError(f"no work pool named {pool!r}; create it with "
                                f"`prefect work-pool create {pool} --type process`") from None
    return str(deployment.apply(work_pool_name=pool))


def serve(deployments: list[Any]) -> None:
    """Serve deployments in this process until interrupted (runs start here when due). On
    Ctrl-C or SIGTERM Prefect pauses them, so no runs pile up as Late while nobody serves."""
    from prefect import serve as prefect_serve

    require_server()
    prefect_serve(*deployments, print_starting_message=True)


def _client() -> Any:
    from prefect.client.orchestration import get_client

    require_server()
    return get_client(sync_client=True)


def list_schedules() -> list[dict[str, Any]]:
    """Every dataengine deployment, by name: name, id, cron, paused, method, suites, tasks (per
    suite), next_run (ISO time of the earliest run the scheduler has created, or None), ready
    (a serving process or worker polled it within the last minute) and pool (work pool or None)."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterTags

    with _client() as client:
        deployments = client.read_deployments(deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(all_=[TAG])))
        out = []
        for d in deployments:
            params = d.parameters or {}
            config = params.get("config") or {}
            crons = [getattr(s.schedule, "cron", str(s.schedule)) for s in (d.schedules or [])]
            next_run = _next_run(client, d.id)
            out.append({
                "name": d.name,
                "id": str(d.id),
                "cron": ", ".join(crons),
                "paused": bool(d.paused),
                "method": params.get("method", "mcts"),
                "suites": ",".join(config.get("suites", [])),
                "tasks": config.get("num_tasks"),
                "next_run": next_run.isoformat() if next_run else None,
                "ready": str(getattr(d.status, "value", d.status)) == "READY",
                "pool": d.work_pool_name,
            })
    return sorted(out, key=lambda r: r["name"])


def _next_run(client: Any, deployment_id: Any) -> Any:
    """Expected start (datetime) of the deployment's earliest Scheduled run, or None."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    runs = client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=1)
    return runs[0].expected_start_time if runs else None


def schedule_table(rows: list[dict[str, Any]]) -> Any:
    """A rich Table of list_schedules() rows (name, cron, suites, tasks, next run in UTC, state)
    that fits 80 columns: long names and suite lists are cut with an ellipsis."""
    from datetime import UTC, datetime

    from rich.table import Table

    table = Table(box=None, pad_edge=False)  # widths + 2 spaces between columns: 80 at most
    table.add_column("name", max_width=14, overflow="ellipsis", no_wrap=True)
    table.add_column("cron", max_width=11, overflow="ellipsis", no_wrap=True)
    table.add_column("suites", max_width=14, overflow="ellipsis", no_wrap=True)
    table.add_column("tasks", justify="right", no_wrap=True)
    table.add_column("next run (UTC)", no_wrap=True)
    table.add_column("state", no_wrap=True)
    for r in rows:
        if r["paused"]:
            state, next_run = "paused", "-"
        else:
            state = "ready" if r["ready"] else "not served"
            when = r["next_run"] and datetime.fromisoformat(r["next_run"]).astimezone(UTC)
            next_run = when.strftime("%Y-%m-%d %H:%M") if when else "none yet"
        table.add_row(r["name"], r["cron"], r["suites"], str(r["tasks"] if r["tasks"] is not None else "-"),
                      next_run, state)
    return table


def _deployment(client: Any, name: str) -> Any:
    from prefect.exceptions import ObjectNotFound

    try:
        return client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
    except ObjectNotFound:
        known = ", ".join(r["name"] for r in list_schedules()) or "none"
        raise ScheduleError(f"no schedule named {name!r}; schedules: {known}") from None


def pause_schedule(name: str) -> None:
    with _client() as client:
        client.pause_deployment(_deployment(client, name).id)


def resume_schedule(name: str) -> None:
    with _client() as client:
        client.resume_deployment(_deployment(client, name).id)


def delete_schedule(name: str) -> None:
    with _client() as client:
        client.delete_deployment(_deployment(client, name).id)


def stored_deployments(names: list[str] | None = None) -> list[Any]:
    """RunnerDeployments rebuilt from the server's dataengine deployments (same name, cron and
    parameters), for `serve`. Serving makes them active: Prefect's serve pauses its deployments
    when it stops, so a stored paused state cannot tell a stopped server from a `pause`."""
    from prefect.types.entrypoint import EntrypointType

    from flows.generate import generate_flow

    with _client() as client:
        wanted = names or [r["name"] for r in list_schedules()]
        if not wanted:
            raise ScheduleError("no schedules to serve; create one with `dataengine schedule generate --cron ...`")
        out = []
        for name in wanted:
            d = _deployment(client, name)
            out.append(generate_flow.to_deployment(
                name=d.name, schedules=[s.schedule for s in d.schedules or []], paused=False,
                entrypoint_type=EntrypointType.MODULE_PATH,
                parameters=d.parameters or {}, tags=list(d.tags or [TAG]), description=d.description))
    return out
