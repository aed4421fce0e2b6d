"""Test helpers: a real `prefect server start` on a free localhost port with a private
PREFECT_HOME (PREFECT_API_URL set while it runs), stopping a process group, and a tiny config."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def default_sigint() -> None:
    """preexec_fn: the child handles SIGINT even when this process ignores it (a library loaded
    by an earlier test can set SIG_IGN, which children inherit; Python then installs no
    KeyboardInterrupt handler and stop_group's SIGINT does nothing)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGINT the process group started with start_new_session (a Prefect worker ignores a lone
    SIGTERM while a run is in flight), then SIGKILL it after `timeout` s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def prefect_server(home: Path) -> Iterator[dict[str, Any]]:
    """Yields {url, env, home, log}: env is os.environ plus the server's settings, for subprocesses."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_HOME,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false", "PREFECT_API_URL": url}
    log_path = home / "server.log"
    log = open(log_path, "w")  # noqa: SIM115 - the server writes it until teardown
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(url, proc)
        with temporary_settings({PREFECT_API_URL: url, PREFECT_HOME: str(home), PREFECT_SERVER_ANALYTICS_ENABLED: False}):
            yield {"url": url, "env": env, "home": home, "log": log_path}
    finally:
        from flows.runtime import drain_concurrency_services

        drain_concurrency_services()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def tiny_config(store: Path) -> Any:
    """An EngineConfig that searches 2 arithmetic tasks with the tiny random model (one shard)."""
    from dataengine.config import EngineConfig

    return EngineConfig.model_validate({
        "store": str(store), "suites": ["arithmetic"], "num_tasks": 2, "shard_size": 2, "sandbox": {"workers": 1},
        "policy": {"model": "tiny", "device": "cpu", "max_new_tokens": 8},
        "search": {"num_simulations": 2, "num_actions": 2, "max_depth": 2, "value": "zero"},
    })
