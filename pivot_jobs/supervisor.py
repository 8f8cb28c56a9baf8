"""Process supervision for `pivot run` (Dagster-free): the work runs in a child process the supervisor stops.

A long torch op holds the interpreter, so a signal handler in the working process would run only when the op
returns. `pivot run` therefore works in a child and supervises it: on SIGTERM or Ctrl-C the child is asked to
stop (SIGTERM: Dagster marks the run failed, parts already written stay), and killed if it has not stopped after
STOP_GRACE_S. Every part is written to a temp file and renamed, so a kill leaves no half-written part; the
supervisor's `after_kill` then removes the temp files and marks the run canceled, and a rerun resumes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Callable

SUPERVISED = "PIVOT_SUPERVISED"  # set in the child that does the work of `pivot run`
RUN_ID = "PIVOT_RUN_ID"  # the Dagster run id the supervisor chose for that child
PARENT_PID = "PIVOT_PARENT_PID"  # set in a child of `pivot run` (the worker, a shard run): it dies with that parent
# After SIGTERM, how long the child may take to stop cleanly before SIGKILL ($PIVOT_STOP_GRACE_S overrides).
STOP_GRACE_S = float(os.environ.get("PIVOT_STOP_GRACE_S", "3"))
# A child whose parent died stops cleanly on SIGTERM; one still alive this long after is SIGKILLed (long enough
# for the worker to stop its own shard runs first, each within STOP_GRACE_S).
ORPHAN_GRACE_S = 2 * STOP_GRACE_S + 2
CHILD = [sys.executable, "-m", "pivot_jobs.cli"]  # the command line of a worker: `pivot` in this interpreter


def is_supervised() -> bool:
    return os.environ.get(SUPERVISED) == "1"


_STOPS: list[str] = []  # the stop signals this process took (raise_interrupt)


def raise_interrupt(signum, frame):
    # The stop may land inside SQLAlchemy's pool closing a connection, which logs the interrupt with its traceback
    # before re-raising it: once stopping, the pool's own error lines are noise (one "interrupted" line says it).
    import logging

    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    _STOPS.append(signal.Signals(signum).name)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def stop_requested() -> bool:
    """Whether this process took a stop signal: a step that failed after it failed because of it (a DuckDB query
    the signal landed in raises its own "Query interrupted", not Dagster's interrupt)."""
    return bool(_STOPS)


def become_worker() -> None:
    """In the supervised child: SIGTERM raises KeyboardInterrupt (a clean stop), never dropped in a callback."""
    signal.signal(signal.SIGTERM, raise_interrupt)
    redeliver_swallowed_interrupts()


def redeliver_swallowed_interrupts() -> None:
    """Python prints and drops an exception raised in a garbage-collector callback (a weakref finalizer of
    SQLAlchemy's, say), a stop signal's included. When a stop is dropped that way, it is sent again from a thread
    a moment later, so that its handler runs in the main code (were it dropped again, this hook sends it again)."""
    import threading

    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not _is_interrupt(unraisable.exc_value):
            previous(unraisable)  # a real error in a callback is still printed; a dropped stop is handled here
            return
        # to the main thread itself: a signal the process takes in another thread would wait for a blocking call
        # of the main thread to return
        threading.Timer(0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGTERM)).start()

    sys.unraisablehook = hook


def _is_interrupt(error: BaseException | None) -> bool:
    if isinstance(error, KeyboardInterrupt):
        return True
    dagster_errors = sys.modules.get("dagster._core.errors")  # Dagster raises its own, not a KeyboardInterrupt
    return dagster_errors is not None and isinstance(error, dagster_errors.DagsterExecutionInterruptedError)


def supervise(argv: list[str], after_kill: Callable[[str], None]) -> int:
    """Run `pivot argv` in a supervised child; on SIGTERM/SIGINT stop it (see the module doc). `after_kill(run_id)`
    cleans up after a child that had to be killed."""
    run_id = str(uuid.uuid4())
    env = {**os.environ, SUPERVISED: "1", RUN_ID: run_id, PARENT_PID: str(os.getpid())}
    child = subprocess.Popen([*CHILD, *argv], env=env)
    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = stop["signal"] or signum

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    while child.poll() is None:
        if stop["signal"] is not None:
            return _stop_child(child, stop["signal"], run_id, after_kill)
        time.sleep(0.1)
    return child.returncode


def _stop_child(child: subprocess.Popen, signum: int, run_id: str, after_kill: Callable[[str], None]) -> int:
    name = signal.Signals(signum).name
    try:
        child.send_signal(signal.SIGTERM)
        child.wait(STOP_GRACE_S)
        how = "stopped"
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        how = "killed"
        try:
            after_kill(run_id)
        except Exception as e:  # the interrupt itself must still be reported
            print(f"warning: cleanup after interrupt incomplete: {str(e).splitlines()[0] if str(e) else e!r}",
                  file=sys.stderr)
    print(f"interrupted ({name}): run {run_id} {how}; parts written so far are kept, `pivot run` resumes",
          file=sys.stderr)
    return 128 + int(signum)


def stop_children(children: list[tuple[subprocess.Popen, str]]) -> list[str]:
    """SIGTERM every (process, run id), SIGKILL those still going after STOP_GRACE_S; the run ids killed."""
    for proc, _ in children:
        proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    killed = []
    for proc, run_id in children:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed.append(run_id)
    return killed


def die_with_parent() -> None:
    """In a child of `pivot run` (the worker, a shard run): SIGTERM (a clean stop) when that parent dies, SIGKILL
    ORPHAN_GRACE_S later if still alive. Read once, so this process's own children get their own parent pid."""
    parent = os.environ.pop(PARENT_PID, None)
    if parent:
        from pivot_assets.core.parallel import die_with_parent as watch

        watch(int(parent), signal.SIGTERM, grace_s=ORPHAN_GRACE_S)


def exit_now(rc: int) -> None:
    """End the supervised child without tearing down its modules (freeing Dagster's, pandas' and Great
    Expectations' objects one by one costs over a second a run). Exit handlers still run, streams are flushed."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(rc)
