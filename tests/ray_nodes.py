"""Test helpers: a Ray cluster of `ray start` nodes on this machine, each in a session of its
own (its processes can be killed or stopped as a whole without touching any other Ray here), and
a Prefect API every node reports to. Used by tests/test_ray_cluster.py and
benchmarks/bench_ray_cluster.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).parent / "ray"
# Process titles of a Ray node's own agents and of an idle worker: anything else "ray::" runs a task.
NOT_TASKS = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One `ray start --block` in a session of its own: every process of the node (raylet,
    agents, workers) has that session id, so the node can be killed or stopped as a whole
    without touching any other Ray on the machine (no `ray stop`, which stops them all)."""

    def __init__(self, name: str, args: list[str], cpus: int = 1) -> None:
        # Short: Ray's unix sockets live under it and socket paths are limited to 107 bytes.
        self.temp_dir = tempfile.mkdtemp(prefix=f"ray-{name}-", dir="/tmp")
        self.log = Path(self.temp_dir) / "ray-start.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
        ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port"]
        command = [str(RAY), "start", "--block", "--temp-dir", self.temp_dir, "--node-ip-address", "127.0.0.1",
                   "--num-cpus", str(cpus), "--object-store-memory", str(100 * 2**20), "--include-log-monitor", "false",
                   "--disable-usage-stats", *[a for p in ports for a in (p, str(free_port()))], *args]
        self.proc = subprocess.Popen(command, start_new_session=True, stdout=self.log.open("w"),
                                     stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def processes(self) -> list[psutil.Process]:
        """The live processes of the node's session (zombies have exited: not counted)."""
        out = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getsid(p.pid) == self.proc.pid and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def busy_task(self) -> str | None:
        """The title of a worker process of this node that is running a task, if any."""
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                name = p.name()
                if name.startswith("ray::") and name not in NOT_TASKS:
                    return name
        return None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    def stop(self) -> None:
        """SIGTERM the whole session, SIGKILL what is left after 10 s, remove the temp dir."""
        self.kill(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.kill(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        deadline = time.monotonic() + 10
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def alive_nodes(address: str) -> dict[str, str]:
    """{node id: 'head' | 'worker'} of the live nodes, by the custom resource each was started with."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return {n["NodeID"]: ("head" if "head" in n["Resources"] else "worker") for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()


def wait_for(check, what: str, timeout: float, nodes: list[Node]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1.0)
    logs = "\n".join(n.log.read_text()[-2000:] for n in nodes)
    raise TimeoutError(f"{what}: not within {timeout} s\n{logs}")


@contextlib.contextmanager
def api_for_all_nodes():
    """PREFECT_API_URL set to this process's temporary API, as a real cluster sets it to a Prefect
    server every node reaches: the setting travels with each task, so Ray workers report there
    instead of each starting a temporary API of its own."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()
    server.start()
    with temporary_settings({PREFECT_API_URL: server.api_url}):
        yield


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False



class Cluster:
    """A head node (custom resource {"head": 1}) and worker nodes ({"worker": 1}) started by
    `ray start --block`, each with its own temp dir and ports.

    address: the head's GCS address for `RuntimeConfig.ray_address`; nodes: [head, *workers];
    node_of: {"head": node id, "worker": node id of the last worker started}.
    """

    def __init__(self) -> None:
        self.address = ""
        self.nodes: list[Node] = []
        self.node_of: dict[str, str] = {}

    def start(self, workers: int, cpus: int) -> None:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.nodes.append(Node("head", ["--head", "--port", str(port), "--include-dashboard", "false",
                                        "--ray-client-server-port", str(free_port()),
                                        "--resources", json.dumps({"head": 1})], cpus))
        wait_for(lambda: port_open(port), "the head node's GCS listens", 120, self.nodes)
        for _ in range(workers):
            self.nodes.append(Node("worker", ["--address", self.address, "--resources", json.dumps({"worker": 1})],
                                   cpus))
        roles = wait_for(lambda: r if len(r := alive_nodes(self.address)) == 1 + workers else None,
                         f"{1 + workers} live nodes", 180, self.nodes)
        self.node_of = {role: node_id for node_id, role in roles.items()}

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


@contextlib.contextmanager
def cluster(workers: int = 1, cpus: int = 1) -> Iterator[Cluster]:
    """A started Cluster of one head and `workers` worker nodes with `cpus` CPUs each, stopped
    on exit however the block ends (also when it fails to start)."""
    c = Cluster()
    try:
        c.start(workers, cpus)
        yield c
    finally:
        c.stop()
