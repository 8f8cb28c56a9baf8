"""Crash scenarios shared by the local and the object-store tests (the same crash, two storages)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field


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


# How often the kill helpers look for their event: the run goes on between two looks, so a short interval keeps
# what it writes after the event small (the predicates are a glob or a small query: cheap at this rate).
POLL_S = 0.02


def wait_for(condition: Callable[[], bool], *, timeout_s: float, proc: subprocess.Popen | None = None,
             poll_s: float = POLL_S) -> bool:
    """Poll `condition()` until it holds (True), or `proc` has ended or `timeout_s` passed (False): waiting for an
    event, not for a time. The timeout only keeps a broken run from hanging the test."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if (proc is not None and proc.poll() is not None) or time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


@dataclass
class Killed:
    """What a kill helper did: `mid_run` is True when the event came while the run was still going and the kill
    landed then (False: it ended by itself, or never showed the event); `at_kill` is what the caller's `at_kill()`
    returned with the run's processes frozen at that moment; `descendants` the processes alive at the kill."""

    mid_run: bool
    at_kill: object = None
    descendants: list = field(default_factory=list)


def _freeze(proc: subprocess.Popen) -> bool:
    """SIGSTOP the run's process group (it was started in its own session): nothing of it moves until the kill,
    so what `at_kill()` sees is what the kill leaves. False when the run has ended."""
    if proc.poll() is not None:
        return False
    try:
        os.killpg(proc.pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    return True


def kill_run_after_first_part(argv: list[str], has_part: Callable[[], bool], *, cwd=None, env: dict | None = None,
                              timeout_s: float = 300, at_kill: Callable[[], object] | None = None) -> Killed:
    """Start `pivot run ...` (argv) in its own session, and kill -9 the supervisor and its worker as soon as
    `has_part()` says a first part is on disk. Returns Killed(mid_run=False) when the run ended by itself first
    (or never wrote a part within `timeout_s`): the caller asserts `mid_run`, the order of the events it needs."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    seen = wait_for(has_part, timeout_s=timeout_s, proc=proc)
    frozen = seen and _freeze(proc)
    killed = Killed(mid_run=frozen, at_kill=at_kill() if frozen and at_kill else None)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the supervisor and its worker: kill -9 of everything
    except ProcessLookupError:
        pass  # it had already finished: mid_run says so
    proc.wait()
    return killed


def kill_parent_mid_run(argv: list[str], ready: Callable[[], bool], *, cwd=None, env: dict | None = None,
                        timeout_s: float = 300, at_kill: Callable[[], object] | None = None) -> Killed:
    """Start `pivot run ...` (argv) in its own session and, once `ready()` says the run is under way, kill -9 the
    parent process ONLY: its children (the worker, shard runs) get no signal from us that ends them and must notice
    by themselves. The run is frozen (SIGSTOP) between the event and the kill, so `descendants` (every process of it
    alive at the kill) and `at_kill()` are exact; the children are let go on (SIGCONT) once the parent is dead."""
    import psutil

    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    seen = wait_for(ready, timeout_s=timeout_s, proc=proc)
    if not (seen and _freeze(proc)):  # it ended by itself, or was never ready within timeout_s: no kill mid-run
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return Killed(mid_run=False)
    descendants = psutil.Process(proc.pid).children(recursive=True)
    value = at_kill() if at_kill else None
    proc.kill()  # the parent only
    proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGCONT)  # the group outlives its leader while its children live
    except ProcessLookupError:
        pass
    return Killed(mid_run=True, at_kill=value, descendants=descendants)


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
