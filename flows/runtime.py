"""How flows run: the task runner (threads or Ray), retries of transient errors with backoff,
and the accelerator concurrency limit. The per-process policy and sandbox a worker reuses are
the stage layer's (dataengine.stages.resources.shared_resources).

Embedded default: no PREFECT_API_URL set, so Prefect starts its local ephemeral API on first use
(a SQLite database under PREFECT_HOME); nothing is started by hand. Point PREFECT_API_URL at a
`prefect server start` to see the same runs in a long-lived UI.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dataengine.config import RuntimeConfig
from dataengine.stages.resources import release_resources  # noqa: F401 - flows' public cleanup
from flows import FILE_LEASES

__all__ = ["RuntimeConfig"]  # re-exported: flows take it as `runtime`

# Global concurrency limit held while a task uses the model (GPU, or the CPU cores on a laptop).
ACCELERATOR = "dataengine-accelerator"


def transient(exc: BaseException | None) -> bool:
    """Whether an error is worth retrying: lost store commit races, timeouts, broken
    connections or workers, and GPU out-of-memory; never bad input (ValueError, KeyError, ...)."""
    from storage import RetryableStoreError

    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (RetryableStoreError, TimeoutError, ConnectionError, BrokenPipeError, EOFError)):
            return True
        if type(exc).__name__ in ("OutOfMemoryError", "RayActorError", "WorkerCrashedError", "ObjectLostError"):
            return True
        exc = exc.__cause__ or getattr(exc, "cause", None)
        seen += 1
    return False


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry_condition_fn: retry the failed task run only when its error is transient."""
    try:
        state.result(raise_on_failure=True)
    except BaseException as exc:  # noqa: BLE001 - the state holds whatever the task raised
        return transient(exc)
    return False


def backoff(runtime: RuntimeConfig) -> list[float]:
    """Retry delays: retry_delay_s, then doubling (Prefect adds jitter)."""
    return [runtime.retry_delay_s * 2**i for i in range(runtime.retries)]


def shard_options(runtime: RuntimeConfig) -> dict[str, Any]:
    """Task options of a shard task: retries with exponential backoff on transient errors."""
    return {
        "retries": runtime.retries,
        "retry_delay_seconds": backoff(runtime) or 0,
        "retry_jitter_factor": 0.2,
        "retry_condition_fn": retry_if_transient,
    }


def make_task_runner(runtime: RuntimeConfig) -> Any:
    """ThreadPoolTaskRunner, or prefect-ray's RayTaskRunner (a local Ray when no address)."""
    if runtime.task_runner == "thread":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=runtime.workers)
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as exc:
        raise RuntimeError("task_runner 'ray' needs the distributed extra: pip install 'dataengine[distributed]'") from exc
    init: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if runtime.ray_address is None and runtime.ray_num_cpus is not None:
        init["num_cpus"] = runtime.ray_num_cpus
    # Workers import dataengine/flows/storage from the repository, like the driver does.
    init["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (_repo_root(), os.environ.get("PYTHONPATH")) if p),
                                        "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}}
    return RayTaskRunner(address=runtime.ray_address, init_kwargs=init)


def ray_options(runtime: RuntimeConfig) -> dict[str, Any]:
    """Ray options of one shard task: its GPUs (one each, so each GPU worker holds one backend),
    custom resources, SPREAD scheduling and task retries, as set in `runtime`."""
    options: dict[str, Any] = {}
    if runtime.gpus_per_shard:
        options["num_gpus"] = runtime.gpus_per_shard
    if runtime.shard_resources:
        options["resources"] = dict(runtime.shard_resources)
    if runtime.ray_spread:
        options["scheduling_strategy"] = "SPREAD"
    if runtime.ray_max_retries is not None:
        options["max_retries"] = runtime.ray_max_retries
    return options


def submit_shards(task: Any, runtime: RuntimeConfig, calls: list[tuple[Any, ...]]) -> list[Any]:
    """The Prefect shard executor: `task` submitted once per argument tuple of `calls` on the
    flow's task runner (threads or Ray), with `shard_options(runtime)` and, on Ray,
    `ray_options(runtime)`; the results in the order of `calls`."""
    shard_task = task.with_options(**shard_options(runtime))
    if runtime.task_runner == "ray" and ray_options(runtime):
        from prefect_ray.context import remote_options

        with remote_options(**ray_options(runtime)):
            futures = [shard_task.submit(*args) for args in calls]
    else:
        futures = [shard_task.submit(*args) for args in calls]
    return [f.result() for f in futures]


def node_info() -> dict[str, Any]:
    """Where the caller runs: {hostname, pid, ray_node_id} (the Ray node id inside a Ray task or
    driver, else None)."""
    info: dict[str, Any] = {"hostname": socket.gethostname(), "pid": os.getpid(), "ray_node_id": None}
    try:
        import ray
    except ImportError:
        return info
    if ray.is_initialized():
        info["ray_node_id"] = ray.get_runtime_context().get_node_id()
    return info


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------- accelerator limit


def ensure_accelerator_limit(slots: int) -> None:
    """Create (or resize) the global concurrency limit ACCELERATOR on the current Prefect API and
    give back the slots of holders that died (reclaim_dead_slots)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(ACCELERATOR, slots)
        reclaim_dead_slots(client)


def reclaim_dead_slots(client: Any) -> int:
    """Give back ACCELERATOR slots that no live lease holds; returns how many.

    A process killed while it holds a slot never releases it. A `prefect server` revokes the
    expired lease (its repossessor service), but the embedded API runs no services and is gone
    with its process, while the slot count stays in PREFECT_HOME's database: every later run
    would wait forever. So on the embedded API, whose leases live on disk under PREFECT_HOME
    (flows/__init__.py sets Prefect's file lease storage), expired leases are released through
    the API, and slots held by no lease at all (taken before leases were kept on disk) are reset.
    A holder renews its lease while it runs, so a live one is never reclaimed.
    """
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.utilities.asyncutils import run_coro_as_sync

    storage = _lease_storage()
    if storage is None:
        return 0
    limit = client.read_global_concurrency_limit_by_name(ACCELERATOR)
    before = limit.active_slots
    for lease_id in run_coro_as_sync(storage.read_expired_lease_ids(limit=10_000)):
        client.release_concurrency_slots_with_lease(lease_id)
    live = sum(meta.slots for meta in _live_leases(storage, limit.id))
    if client.read_global_concurrency_limit_by_name(ACCELERATOR).active_slots > live:
        client.update_global_concurrency_limit(ACCELERATOR, GlobalConcurrencyLimitUpdate(active_slots=live))
    freed = before - live
    if freed > 0:
        logging.getLogger(__name__).warning(
            "gave back %d %s slot(s) held by a process that stopped without releasing them", freed, ACCELERATOR)
    return max(freed, 0)


@contextmanager
def accelerator_slot(note_every_s: float = 60.0) -> Iterator[None]:
    """Hold one ACCELERATOR slot, in the name of the task or flow run that asks. While all are
    taken it waits; every `note_every_s` it logs who holds them and gives back the slots of
    holders that died meanwhile (reclaim_dead_slots). Outside a Prefect run: no-op."""
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.context import FlowRunContext, TaskRunContext

    ctx = TaskRunContext.get() or FlowRunContext.get()
    if ctx is None:  # called as a plain function
        yield
        return
    from prefect.concurrency.sync import concurrency

    kind, run = ("task_run", ctx.task_run) if isinstance(ctx, TaskRunContext) else ("flow_run", ctx.flow_run)
    holder = ConcurrencyLeaseHolder(type=kind, id=run.id)
    acquired = threading.Event()
    # In this context's copy: the thread must see the same Prefect settings (PREFECT_HOME, API).
    notes = threading.Thread(target=contextvars.copy_context().run, args=(_note_waits, acquired, note_every_s, run.name),
                             daemon=True)
    notes.start()
    try:
        with concurrency(ACCELERATOR, occupy=1, strict=False, holder=holder):
            acquired.set()
            yield
    finally:
        acquired.set()


def _note_waits(acquired: threading.Event, every_s: float, waiter: str) -> None:
    """Until `acquired` is set: every `every_s`, give back dead holders' slots and log who holds
    the slots (a shard queued behind its own run's shards is normal; a slot held for hours is not)."""
    log = logging.getLogger(__name__)
    waited = 0.0
    while not acquired.wait(every_s):
        waited += every_s
        try:
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                reclaim_dead_slots(client)
                holders = slot_holders(client)
        except Exception as err:  # noqa: BLE001 - a note must never break the run that waits
            holders = [f"unknown ({type(err).__name__}: {err})"]
        log.info("%s has waited %.0f s for a %s slot, held by: %s (Concurrency in the Prefect UI; "
                 "runtime.accelerator_slots sets how many)", waiter, waited, ACCELERATOR,
                 ", ".join(holders) or "other runs")


def slot_holders(client: Any) -> list[str]:
    """Names of the task and flow runs that hold ACCELERATOR slots now; [] where the leases
    can't be read (a `prefect server`, whose leases are not on this disk)."""
    storage = _lease_storage()
    if storage is None:
        return []
    names = []
    for meta in _live_leases(storage, client.read_global_concurrency_limit_by_name(ACCELERATOR).id):
        if meta.holder is None:
            names.append("a holder without a name")
            continue
        try:
            read = client.read_task_run if meta.holder.type == "task_run" else client.read_flow_run
            names.append(f"{meta.holder.type.replace('_', ' ')} '{read(meta.holder.id).name}'")
        except Exception:  # noqa: BLE001 - ObjectNotFound: a deleted run still named by its lease
            names.append(f"{meta.holder.type.replace('_', ' ')} {meta.holder.id}")
    return names


def _lease_storage() -> Any:
    """Prefect's file lease storage under PREFECT_HOME when the embedded API keeps its leases
    there (flows/__init__.py sets it); None otherwise."""
    from prefect.server.concurrency.lease_storage.filesystem import ConcurrencyLeaseStorage
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url is not None or settings.server.concurrency.lease_storage != FILE_LEASES:
        return None
    return ConcurrencyLeaseStorage(settings.home / "concurrency_leases")


def _live_leases(storage: Any, limit_id: Any) -> list[Any]:
    """The metadata (slots, holder) of the unexpired leases on the limit `limit_id`."""
    from prefect.utilities.asyncutils import run_coro_as_sync

    out = []
    for lease_id in run_coro_as_sync(storage.read_active_lease_ids(limit=10_000)):
        lease = run_coro_as_sync(storage.read_lease(lease_id))
        if lease is not None and limit_id in lease.resource_ids and lease.metadata is not None:
            out.append(lease.metadata)
    return out


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) from free-form parts."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:100] or "dataengine"


@contextmanager
def private_prefect_home(path: str | os.PathLike[str]) -> Iterator[None]:
    """Run flows against a private ephemeral API whose database lives under `path` (tests,
    throwaway demos); the temporary server started inside is stopped on exit."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import (
        PREFECT_HOME,
        PREFECT_LOGGING_TO_API_ENABLED,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    os.makedirs(path, exist_ok=True)
    with temporary_settings({PREFECT_HOME: str(path), PREFECT_SERVER_ANALYTICS_ENABLED: False,
                             PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 180,
                             PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE: FILE_LEASES,
                             # Logs stay local: a log shipped after the server stops would fail noisily.
                             PREFECT_LOGGING_TO_API_ENABLED: False}):
        try:
            yield
        finally:
            drain_concurrency_services()
            for server in list(SubprocessASGIServer._instances.values()):
                server.stop()


def drain_concurrency_services(timeout_s: float = 30.0) -> None:
    """Stop Prefect's per-process concurrency-slot services.

    They are singletons that keep an API client bound to the server they first talked to; after
    that server stops (a private ephemeral API, a test server) the next flow in the same process
    would get ConnectError on slot acquisition. A drained service is recreated on next use.
    """
    from prefect.concurrency.services import (
        ConcurrencySlotAcquisitionService,
        ConcurrencySlotAcquisitionWithLeaseService,
    )

    for service in (ConcurrencySlotAcquisitionWithLeaseService, ConcurrencySlotAcquisitionService):
        service.drain_all(timeout=timeout_s)
