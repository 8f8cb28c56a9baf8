"""A real OpenAI-compatible model server for tests: `transformers serve` (transformers' serving extra) on a free
127.0.0.1 port, serving a local HF model dir on the CPU. Started and stopped by the tests that need one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

TRANSFORMERS_CLI = Path(sys.executable).parent / "transformers"
STARTUP_LIMIT_S = 180


@dataclass(frozen=True)
class Served:
    base_url: str  # http://127.0.0.1:PORT/v1
    model: str  # the model name the server answers to (the model dir)
    startup_s: float


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return resp.status == 200
    except OSError:
        return False


@contextmanager
def transformers_serve(model_dir: Path, log: Path) -> Iterator[Served]:
    """Serve `model_dir` until the block ends; skips when the serving extra is missing, fails when it never
    becomes healthy (with the end of its log)."""
    for module in ("fastapi", "uvicorn"):
        pytest.importorskip(module, reason="transformers serve needs the serving extra: pip install 'transformers[serving]'")
    if not TRANSFORMERS_CLI.exists():
        pytest.skip(f"no transformers CLI at {TRANSFORMERS_CLI}")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(TRANSFORMERS_CLI), "serve", str(model_dir), "--host", "127.0.0.1",
                                 "--port", str(port), "--device", "cpu", "--dtype", "float32"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while not _healthy(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve not healthy after {STARTUP_LIMIT_S} s: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield Served(f"http://127.0.0.1:{port}/v1", str(model_dir), time.perf_counter() - t0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
