"""Independent model jobs (ablation arms, evaluation of several policies) in worker processes (Dagster-free).

Why processes, not threads: torch with 2 intra-op threads on a shared 2-core box was many times slower than
with 1 (bench/RESULTS_threads.md), while two single-threaded processes on two cores do not wait on each other.
So `runtime.workers: auto` runs usable_cores // threads jobs at once, fewer when memory is short
(`MEMORY_PER_WORKER_GIB` per training job: a GRPO run of the embedded 135M policy peaked at 6.8 GiB RSS;
EVAL_MEMORY_GIB per evaluation job, which only samples).

Workers are spawned (no fork of a process holding torch or DuckDB state), die with their parent (Linux
PR_SET_PDEATHSIG, so a `kill -9` of `pivot run` leaves no orphan training on), and are terminated when the
parent is interrupted; `pivot run`'s own children use die_with_parent (a clean stop first, then SIGKILL). A job's
log lines go to stderr with its name, and its exception reaches the caller.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from pivot_assets.core.hardware import resolve_threads, usable_cores

MEMORY_PER_WORKER_GIB = 8.0
EVAL_MEMORY_GIB = 3.0


def available_memory_gib() -> float | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        return None
    return None


def resolve_workers(requested: int | str = "auto", threads: int | str = "auto", jobs: int | None = None,
                    memory_gib: float = MEMORY_PER_WORKER_GIB) -> int:
    """How many jobs run at once: an explicit number, or usable cores // threads, capped by the memory
    available (`memory_gib` per job) and by the number of jobs."""
    if requested != "auto":
        n = int(requested)
    else:
        n = max(1, usable_cores() // resolve_threads(threads))
        memory = available_memory_gib()
        if memory is not None:
            n = min(n, max(1, int(memory // memory_gib)))
    return max(1, min(n, jobs)) if jobs else max(1, n)


def _set_parent_death_signal(signum: int) -> None:
    """Linux PR_SET_PDEATHSIG: the kernel sends `signum` to this process when its parent dies (elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signum)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass


def die_with_parent(parent_pid: int, signum: int = signal.SIGTERM, grace_s: float | None = None) -> None:
    """This process gets `signum` when `parent_pid`, its parent, dies (at once if it is already gone), so a
    `kill -9` of the parent leaves no child working on. With `grace_s`, a watchdog thread SIGKILLs it when it is
    still alive that long after the parent went: a process inside a long C call (a torch op) runs no Python
    signal handler until the call returns. Linux only (prctl); elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    _set_parent_death_signal(signum)
    if grace_s is not None:
        threading.Thread(target=_kill_when_orphaned, args=(parent_pid, grace_s), daemon=True,
                         name="die-with-parent").start()
    if os.getppid() != parent_pid:  # it died before the prctl: no signal will come
        os.kill(os.getpid(), signum)


def _kill_when_orphaned(parent_pid: int, grace_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.2)
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)


def child_pids(pid: int | None = None) -> list[int]:
    """The live children of a process (this one by default), from /proc (Linux; elsewhere empty)."""
    return sorted(p for p, parent in _parents().items() if parent == (os.getpid() if pid is None else pid))


def _parents() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split() if entry.isdigit() else ["Z"]
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            out[int(entry)] = int(fields[1])
    return out


# A reaper: a separate small process that waits on a pipe from its owner and SIGKILLs the owner's watched children
# (and their descendants) when the pipe breaks, i.e. when the owner is gone however it went. Self-contained: it
# runs in a fresh interpreter. Processes are named by (pid, start time), so a reused pid is never killed.
_REAPER = r"""
import os, signal, sys
def start(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]
watched = {int(p): start(int(p)) for p in sys.argv[1:]}
if sys.stdin.buffer.read(1):
    sys.exit(0)
tree = {}
for entry in os.listdir("/proc"):
    try:
        with open(f"/proc/{entry}/stat") as f:
            tree.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    except (OSError, IndexError, ValueError):
        pass
todo = [p for p, s in watched.items() if s is not None and start(p) == s]
while todo:
    pid = todo.pop()
    todo += tree.get(pid, [])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


def reap_with_this_process(pids: Sequence[int]) -> Callable[[], None]:
    """SIGKILL `pids` and their descendants when this process dies, however it dies (kill -9 included): for children
    that do not watch their parent (vLLM's engine core outlived a killed `pivot run`, with its 2.7 GB worker).
    Returns `dismiss`: ends the reaper without killing anything (call it once those children were stopped).
    Linux only; elsewhere a no-op."""
    import subprocess

    if not pids or not sys.platform.startswith("linux"):
        return lambda: None
    read, write = os.pipe()
    # its own session: a kill of this process's group leaves the reaper to finish the job
    reaper = subprocess.Popen([sys.executable, "-c", _REAPER, *map(str, pids)], stdin=read, start_new_session=True)
    os.close(read)

    def dismiss() -> None:
        try:
            os.write(write, b"x")
            os.close(write)
        except OSError:
            pass
        reaper.wait()

    return dismiss


def process_token(pid: int | None = None) -> str | None:
    """`host:pid:start` naming one process for good (a pid is reused, its start time in clock ticks since boot
    is not): what a run records, so a later process can tell that run's process is gone. None off Linux."""
    start = _start_ticks(os.getpid() if pid is None else pid)
    return None if start is None else f"{socket.gethostname()}:{os.getpid() if pid is None else pid}:{start}"


def process_gone(token: str) -> bool:
    """True only when `token` names a process of this host that no longer runs (another host: unknown, False)."""
    host, pid, start = token.rsplit(":", 2)
    return host == socket.gethostname() and _start_ticks(int(pid)) != start


def process_started_at(pid: int | None = None) -> float | None:
    """When a process (this one by default) started, in epoch seconds (Linux /proc; None elsewhere)."""
    ticks = _start_ticks(os.getpid() if pid is None else pid)
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration):
        return None
    return None if ticks is None else boot + int(ticks) / os.sysconf("SC_CLK_TCK")


def _start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]  # state, then field 22 (starttime) of proc(5)


def _die_with_parent() -> None:
    """Worker initializer: SIGKILL this process when its parent dies (Linux only; elsewhere a no-op)."""
    _set_parent_death_signal(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; a Ctrl-C reaches the whole group


def run_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], workers: int) -> list[Any]:
    """[fn(*job) for job in jobs], `workers` at a time in spawned processes (in this process when 1).

    Results keep the order of `jobs`. The first failure cancels the jobs not started, terminates the running
    ones and is raised; so is an interrupt (KeyboardInterrupt, what SIGTERM becomes in `pivot run`).
    """
    if workers <= 1 or len(jobs) <= 1:
        return [fn(*job) for job in jobs]
    pool = cf.ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_die_with_parent)
    try:
        futures = [pool.submit(fn, *job) for job in jobs]
        results = [f.result() for f in futures]
    except BaseException:
        _terminate(pool)
        raise
    pool.shutdown(wait=True)
    return results


def _terminate(pool: cf.ProcessPoolExecutor) -> None:
    """Stop every worker now: a running job (minutes of training) is not waited for."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
