"""Schedules: Prefect deployments of the generate flow with a cron schedule, and a process that
serves them (flow.to_deployment + prefect.serve).

Schedules need a long-lived Prefect API with its scheduler service, i.e. a `prefect server
start` (or Prefect Cloud) and PREFECT_API_URL pointing at it: the embedded ephemeral API runs no
scheduler, so every function here refuses to work without PREFECT_API_URL and says so.

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


def create_schedule(name: str, cron: str, config: EngineConfig, **options: Any) -> str:
    """Register the deployment (without serving it); returns its id."""
    require_server()
    return str(deployment_for(name, cron, config, **options).apply())


def serve(deployments: list[Any]) -> None:
    """Serve deployments in this process until interrupted (runs start here when due)."""
    from prefect import serve as prefect_serve

    require_server()
    prefect_serve(*deployments, print_starting_message=True)


def _client() -> Any:
    from prefect.client.orchestration import get_client

    require_server()
    return get_client(sync_client=True)


def list_schedules() -> list[dict[str, Any]]:
    """Every dataengine deployment: name, id, crons, paused, suites, method, next run."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterTags

    with _client() as client:
        deployments = client.read_deployments(deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(all_=[TAG])))
        out = []
        for d in deployments:
            params = d.parameters or {}
            crons = [getattr(s.schedule, "cron", str(s.schedule)) for s in (d.schedules or [])]
            out.append({
                "name": d.name,
                "id": str(d.id),
                "cron": ", ".join(crons),
                "paused": bool(d.paused),
                "method": params.get("method", "mcts"),
                "suites": ",".join((params.get("config") or {}).get("suites", [])),
            })
    return sorted(out, key=lambda r: r["name"])


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
    """RunnerDeployments rebuilt from the server's dataengine deployments (same name, cron,
    parameters and paused state), for `serve`."""
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
                name=d.name, schedules=[s.schedule for s in d.schedules or []], paused=bool(d.paused),
                entrypoint_type=EntrypointType.MODULE_PATH,
                parameters=d.parameters or {}, tags=list(d.tags or [TAG]), description=d.description))
    return out
