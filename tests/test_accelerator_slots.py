"""The accelerator slot of a process that stopped without releasing it comes back on the embedded
API (flows.runtime.reclaim_dead_slots); a live holder keeps its slot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("prefect_api")

ROOT = Path(__file__).resolve().parents[1]


def active_slots() -> int:
    from prefect.client.orchestration import get_client

    from flows.runtime import ACCELERATOR

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(ACCELERATOR).active_slots


@pytest.mark.timeout(300)  # without the fix the flow waits for the slot forever
def test_slot_held_by_no_lease_is_given_back_and_a_flow_then_runs():
    """A slot counted in the database with no lease behind it (a killed process from before
    leases were kept on disk: the case that hung `make demo`) is reset, and a flow that needs
    the slot then runs instead of waiting forever."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows.runtime import ACCELERATOR, accelerator_slot, ensure_accelerator_limit

    ensure_accelerator_limit(1)
    with get_client(sync_client=True) as client:
        client.increment_concurrency_slots(names=[ACCELERATOR], slots=1, mode="concurrency")
    assert active_slots() == 1

    @flow
    def needs_the_slot() -> str:
        ensure_accelerator_limit(1)
        with accelerator_slot():
            return "ran"

    assert needs_the_slot() == "ran"
    assert active_slots() == 0


def test_live_lease_keeps_its_slot():
    from prefect.client.orchestration import get_client

    from flows.runtime import ACCELERATOR, ensure_accelerator_limit, reclaim_dead_slots

    ensure_accelerator_limit(1)
    with get_client(sync_client=True) as client:
        lease = client.increment_concurrency_slots_with_lease(
            names=[ACCELERATOR], slots=1, mode="concurrency", lease_duration=300).json()["lease_id"]
        assert reclaim_dead_slots(client) == 0
        assert active_slots() == 1
        client.release_concurrency_slots_with_lease(lease)
    assert active_slots() == 0


@pytest.mark.slow
def test_killed_holder_slot_comes_back_when_its_lease_expires():
    """A real holder process (another client of the same API, 60 s lease, Prefect's minimum) is
    SIGKILLed while it holds the slot: the slot stays taken while the lease runs, then the next
    ensure_accelerator_limit gives it back."""
    from prefect.client.orchestration import get_client
    from prefect.server.api.server import SubprocessASGIServer

    from flows.runtime import ACCELERATOR, ensure_accelerator_limit, reclaim_dead_slots

    ensure_accelerator_limit(1)
    (server,) = SubprocessASGIServer._instances.values()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import time\nfrom prefect.concurrency.sync import concurrency\n"
         f"with concurrency({ACCELERATOR!r}, occupy=1, lease_duration=60):\n"
         "    print('held', flush=True)\n    time.sleep(600)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PREFECT_API_URL": server.api_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    try:
        assert holder.stdout.readline().strip() == "held"
        taken = time.monotonic()
        with get_client(sync_client=True) as client:
            assert reclaim_dead_slots(client) == 0  # alive: its lease is live
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        with get_client(sync_client=True) as client:
            assert reclaim_dead_slots(client) == 0  # dead, but its lease has not run out yet
        assert active_slots() == 1
        time.sleep(max(0.0, 62 - (time.monotonic() - taken)))
        ensure_accelerator_limit(1)
        assert active_slots() == 0
    finally:
        holder.kill()
        holder.wait(10)


@pytest.mark.timeout(120)
def test_waiting_for_a_taken_slot_names_its_holder_and_proceeds_when_released(caplog):
    import contextvars
    import threading

    from prefect import flow

    from flows.runtime import accelerator_slot, ensure_accelerator_limit

    ensure_accelerator_limit(1)
    release, holding = threading.Event(), threading.Event()

    @flow(flow_run_name="slot-holder")
    def holds_the_slot() -> None:
        with accelerator_slot():
            holding.set()
            release.wait(60)

    @flow(flow_run_name="slot-waiter")
    def needs_the_slot() -> str:
        with accelerator_slot(note_every_s=1.0):
            return "ran"

    result: list[str] = []
    # Each thread in a copy of this context: the module's private PREFECT_HOME, as Prefect's task runner does.
    holder = threading.Thread(target=contextvars.copy_context().run, args=(holds_the_slot,))
    waiter = threading.Thread(target=contextvars.copy_context().run, args=(lambda: result.append(needs_the_slot()),))
    with caplog.at_level("INFO", logger="flows.runtime"):
        holder.start()
        assert holding.wait(60)
        waiter.start()
        deadline = time.monotonic() + 60
        while "held by" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "slot-waiter has waited" in caplog.text
        assert "held by: flow run 'slot-holder'" in caplog.text
        assert not result  # still waiting: the live holder keeps its slot
        release.set()
        holder.join(60)
        waiter.join(60)
    assert result == ["ran"]
    assert active_slots() == 0
