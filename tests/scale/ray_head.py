"""A single-node Ray head on 127.0.0.1 for the tests: every port chosen free at run time, its own temp dir, started
with `ray start --head --block` (so the process we started owns every Ray process, and stopping it stops them:
never `ray stop`, which would stop every Ray on the machine)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_ports

VENV_BIN = Path(sys.executable).parent


@dataclass
class RayHead:
    proc: subprocess.Popen
    dashboard: str  # http://127.0.0.1:PORT, the job server
    gcs: str
    temp_dir: str
    start_s: float

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
            try:  # measured: it had not exited after 30 s in any test run; the group kill below ends it
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        try:  # anything left in the process group we created (workers), by its group id
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def start_ray_head(num_cpus: int = 2, timeout: float = 180, env: dict[str, str] | None = None,
                   nice: int = 0, venv_on_path: bool = True, without: tuple[str, ...] = ()) -> RayHead:
    """`nice`: the niceness of the head and every worker it starts (0: the Ray tests are the suite's critical path,
    so they do not yield to the tests beside them).
    `env`: added to the head's environment, which every Ray worker and job driver on it inherits (a job's
    runtime_env, by contrast, is visible to anyone who can list the cluster's jobs). `venv_on_path` False starts
    this venv's `ray` with the venv off PATH (a job's `python` is then another one); `without`: variables removed."""
    for attempt in range(3):
        try:
            return _start_ray_head(num_cpus, timeout, env, nice, venv_on_path, without)
        except RayPortTaken:  # a port found free was taken by another process before Ray bound it: pick again
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class RayPortTaken(RuntimeError):
    pass


def _start_ray_head(num_cpus: int, timeout: float, env: dict[str, str] | None, nice: int, venv_on_path: bool,
                    without: tuple[str, ...]) -> RayHead:
    block = free_ports(9 + 40, consecutive=True)  # 9 components, then the 40 worker ports (Ray wants a range)
    gcs, dash, client, mgr, obj, agent_listen, agent_grpc, metrics, rtenv = block[:9]
    workers = block[9]
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != VENV_BIN]
    env = {**{k: v for k, v in os.environ.items() if k not in without and (venv_on_path or k != "VIRTUAL_ENV")}, **(env or {}),
           "PATH": os.pathsep.join([str(VENV_BIN)] * venv_on_path + path), "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [str(VENV_BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           f"--port={gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--include-dashboard=true",
           f"--ray-client-server-port={client}", f"--node-manager-port={mgr}", f"--object-manager-port={obj}",
           f"--dashboard-agent-listen-port={agent_listen}", f"--dashboard-agent-grpc-port={agent_grpc}",
           f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={rtenv}",
           f"--min-worker-port={workers}", f"--max-worker-port={workers + 39}",
           f"--num-cpus={num_cpus}", "--num-gpus=0", "--object-store-memory=100000000", f"--temp-dir={temp_dir}",
           "--disable-usage-stats"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(["nice", "-n", str(nice), *cmd], env=env, start_new_session=True,
                            stdout=open(Path(temp_dir) / "head.log", "w"), stderr=subprocess.STDOUT)
    head = RayHead(proc, f"http://127.0.0.1:{dash}", f"127.0.0.1:{gcs}", temp_dir, 0.0)
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            log = (Path(temp_dir) / "head.log").read_text()
            taken = "used by other components" in log or "address already in use" in log.lower()
            raise (RayPortTaken if taken else RuntimeError)(f"ray head exited: {log[-2000:]}")
        try:
            with urllib.request.urlopen(f"{head.dashboard}/api/jobs/", timeout=2) as r:  # the job server, not only a port
                if r.status == 200 and isinstance(json.loads(r.read()), list):
                    head.start_s = time.perf_counter() - t0
                    return head
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    head.stop()
    raise RuntimeError(f"ray head did not answer on {head.dashboard} within {timeout} s")
