"""Crash scenarios shared by the local and the object-store tests (the same crash, two storages)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable


def fail_mid_table_write(wh) -> None:
    """Rewrite table `t` of `wh` and raise before the writer closes: the old table must stay whole."""
    import pyarrow as pa
    import pytest

    with pytest.raises(RuntimeError):
        with wh.table_writer("t", pa.schema([("x", pa.int64())])) as w:
            w.write_table(pa.table({"x": [9]}))
            raise RuntimeError("crash mid-write")


def kill_mid_table_write(root: str, env: dict | None = None) -> None:
    """In a child process, open table `t` of the warehouse at `root` for writing, write rows, then kill -9 itself
    before the writer closes: what a crash in the middle of a table rewrite leaves behind."""
    code = (
        "import os, pyarrow as pa; from pivot_assets.core.warehouse import Warehouse\n"
        f"wh = Warehouse({root!r})\n"
        "with wh.table_writer('t', pa.schema([('x', pa.int64())])) as w:\n"
        "    w.write_table(pa.table({'x': list(range(1000))}))\n"
        "    os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env)
    assert proc.returncode == -9


def kill_run_after_first_part(argv: list[str], has_part: Callable[[], bool], *, cwd=None, env: dict | None = None,
                              timeout_s: float = 300) -> None:
    """Start `pivot run ...` (argv) in its own session, and kill -9 the supervisor and its worker as soon as
    `has_part()` says a first part is on disk (or the run ended by itself: the caller's count says so)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline and not has_part() and proc.poll() is None:
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the supervisor and its worker: kill -9 of everything
    except ProcessLookupError:
        pass  # it had already finished: the caller's assertion says so
    proc.wait()


def kill_parent_mid_run(argv: list[str], ready: Callable[[], bool], *, cwd=None, env: dict | None = None,
                        timeout_s: float = 300) -> list:
    """Start `pivot run ...` (argv) in its own session and, once `ready()` says the run is under way, kill -9 the
    parent process ONLY: its children (the worker, shard runs) get no signal from us and must notice by themselves.
    Returns the psutil.Process of every descendant alive at the kill (empty if the run ended first)."""
    import psutil

    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline and not ready() and proc.poll() is None:
        time.sleep(0.2)
    descendants = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return descendants


def still_alive(processes: list, within_s: float) -> list:
    """The processes still running `within_s` seconds from now (each killed after the wait, so a failing test leaves
    none behind: they were started by the test's own `pivot run`). A zombie has exited: it only waits for its new
    parent (init, once `pivot run` was killed) to reap it, which this machine's init does when it gets to it."""
    import psutil

    deadline = time.monotonic() + within_s
    while True:
        alive = [p for p in processes if _running(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return alive


def _running(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
