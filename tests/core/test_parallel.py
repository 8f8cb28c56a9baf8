"""core/parallel.py: independent jobs in spawned workers, results in order, failures and parents' deaths handled."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pivot_assets.core import parallel
from pivot_assets.core.parallel import resolve_workers, run_jobs


def square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def fail_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("job 2 failed")
    return x


def test_jobs_run_in_other_processes_and_keep_their_order():
    results = run_jobs(square_and_pid, [(i,) for i in range(5)], workers=2)
    assert [r[0] for r in results] == [0, 1, 4, 9, 16]
    pids = {r[1] for r in results}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


def test_one_worker_runs_in_this_process():
    assert {pid for _, pid in run_jobs(square_and_pid, [(1,), (2,)], workers=1)} == {os.getpid()}


def test_a_failing_job_raises_its_own_error():
    with pytest.raises(ValueError, match="job 2 failed"):
        run_jobs(fail_on_two, [(1,), (2,), (3,)], workers=2)


def test_workers_resolution(monkeypatch):
    monkeypatch.setattr(parallel, "usable_cores", lambda: 8)
    monkeypatch.setattr(parallel, "available_memory_gib", lambda: 100.0)
    assert resolve_workers("auto", 2) == 4
    assert resolve_workers("auto", 1, jobs=3) == 3
    assert resolve_workers(5, 1, jobs=2) == 2
    monkeypatch.setattr(parallel, "available_memory_gib", lambda: 17.0)  # room for two 8 GiB workers
    assert resolve_workers("auto", 1) == 2
    monkeypatch.setattr(parallel, "available_memory_gib", lambda: 3.0)
    assert resolve_workers("auto", 1) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_workers_die_with_their_parent(tmp_path):
    """kill -9 of the parent (what a killed `pivot run` worker is) leaves no worker running."""
    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import os, time
        from pivot_assets.core.parallel import run_jobs

        def sleep_job(i):
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(120)

        if __name__ == "__main__":
            run_jobs(sleep_job, [(0,), (1,)], workers=2)
    """)
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.time() + 60
    while time.time() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
        time.sleep(0.2)
    workers = [int(p) for p in pids.read_text().split()]
    assert len(workers) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.parametrize("stuck", [False, True])
def test_a_child_of_pivot_run_stops_when_its_parent_dies(tmp_path, stuck):
    """die_with_parent: SIGTERM (a clean stop: here it writes a file) when the parent is killed; a child that
    does not act on SIGTERM (stuck in a C call) is SIGKILLed grace_s later by the watchdog."""
    child_script = textwrap.dedent(f"""
        import os, signal, sys, time
        from pivot_assets.core.parallel import die_with_parent

        def stop(signum, frame):
            open({str(tmp_path / "stopped")!r}, "w").close()
            sys.exit(0)

        signal.signal(signal.SIGTERM, signal.SIG_IGN if {stuck} else stop)
        die_with_parent(int(sys.argv[1]), signal.SIGTERM, grace_s=1.0)
        print(os.getpid(), flush=True)
        time.sleep(120)
    """)
    (tmp_path / "child.py").write_text(child_script)
    parent_script = ("import os, subprocess, sys, time\n"
                     f"subprocess.Popen([sys.executable, {str(tmp_path / 'child.py')!r}, str(os.getpid())])\n"
                     "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    child = int(parent.stdout.readline())
    time.sleep(0.5)
    assert _alive(child)  # alive while its parent lives
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)
    assert (tmp_path / "stopped").exists() != stuck  # stopped cleanly, or killed by the watchdog


def test_a_reaped_child_goes_with_its_killed_parent():
    """reap_with_this_process: a child that does not watch its parent (vLLM's engine core in its own processes) is
    SIGKILLed when the parent dies by kill -9; a dismissed reaper kills nothing."""
    import psutil

    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        from pivot_assets.core.parallel import reap_with_this_process
        kept = subprocess.Popen(["sleep", "300"], start_new_session=True)
        reaped = subprocess.Popen(["sleep", "300"], start_new_session=True)
        reap_with_this_process([kept.pid])()
        reap_with_this_process([reaped.pid])
        print(kept.pid, reaped.pid, flush=True)
        time.sleep(300)
    """)], stdout=subprocess.PIPE, text=True)
    kept, reaped = (psutil.Process(int(pid)) for pid in parent.stdout.readline().split())
    try:
        parent.kill()
        parent.wait()
        reaped.wait(timeout=30)  # psutil.TimeoutExpired if it outlives its parent's reaper
        assert kept.is_running()  # its reaper was dismissed
    finally:
        for p in (kept, reaped):
            if p.is_running():
                p.kill()
