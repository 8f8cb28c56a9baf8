"""Shards through Ray, for real: a single-node Ray head started here on 127.0.0.1 (free ports, stopped after),
shard runs that submit Ray jobs through dagster-ray's PipesRayJobClient, the tiny test policy in Ray Data actors.
A killed run is held after its first rollouts part (PIVOT_HOLD_AFTER_PART, forwarded to the jobs), so the kill
lands mid-table whatever the model's speed; its rerun is not held.

Covers: 4 shards profiled through Ray (two shard runs in flight at once) give exactly turns x K rows with no
duplicate key; a verifier change re-scores every shard without generating; the pivot sets read every shard;
kill -9 of a shard's Ray job mid-write, then a rerun, gives exactly turns x K; kill -9 of `pivot run` itself
leaves no process of it and no Ray job running, and a rerun gives exactly turns x K; so does a rerun after kill -9
of all its processes at once (it stops the orphaned jobs); a job that reports no data
version fails its run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from pivot_jobs.cli import main as pivot
from pivot_assets.core.warehouse import HOLD_AFTER_PART_ENV
from pivot_assets.profiling.shards import shard_of
from pivot_jobs.supervisor import ORPHAN_GRACE_S
from tests.crashes import kill_parent_mid_run, kill_run_after_first_part, still_alive, wait_for

from .conftest import (INGEST, K, PROFILING, assert_exactly_turns_x_k, expected_rows, make_project, materializations, project_warehouse,
                       rollout_rows)

pytestmark = pytest.mark.scenario
SHARDS = 4
HELD = {HOLD_AFTER_PART_ENV: "rollouts"}  # a killed run's processes stop after their first rollouts part


# -- 4 shards through Ray, then a verifier change, then the pivot sets ------------------------------------------
LIMIT = 14


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, ray_head, tiny_model_dir):
    """One warehouse profiled in 4 shards through Ray (module-scoped: the tests below build on it in order)."""
    root = make_project(tmp_path_factory.mktemp("ray4"), ray_head, shards=SHARDS, limit_turns=LIMIT, batch_rows=4,
                        model=tiny_model_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        mp.chdir(root)
        t0 = time.perf_counter()
        code = pivot(["run", "--select", f"{INGEST},{PROFILING}"])
        wall = time.perf_counter() - t0
    assert code == 0
    print(f"4 shards through Ray: {wall:.0f} s for `pivot run`")
    return root


def test_four_shards_through_ray_give_exactly_turns_x_k(profiled, in_project):
    root = in_project(profiled)
    expected = assert_exactly_turns_x_k(project_warehouse(root), SHARDS, LIMIT)
    assert sum(expected.values()) == LIMIT * K and all(expected.values()), expected  # every shard has turns
    assert rollout_rows(project_warehouse(root)) == (LIMIT * K, LIMIT * K)

    # one run per shard, each a Ray job with a data version; two of them were in flight at once
    records = materializations("rollouts")
    assert sorted(r.partition_key for r in records) == ["000", "001", "002", "003"]
    for r in records:
        meta = r.asset_materialization.metadata
        assert meta["Ray Job ID"].value and meta["seeding"].value == "per_sample"
        assert r.asset_materialization.tags.get("dagster/data_version")
    instance = dg.DagsterInstance.get()
    spans = sorted((s.start_time, s.end_time) for s in (instance.get_run_stats(r.run_id) for r in records))
    assert len({r.run_id for r in records}) == SHARDS
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans  # overlapping shard runs

    # every shard fresh, and pivot stale says so per shard
    assert pivot(["stale"]) == 0


def test_verifier_change_rescores_every_shard_without_generating(profiled, in_project, capsys):
    root = in_project(profiled)
    generated_before = len(materializations("rollouts"))
    text = (root / "pivot.yaml").read_text().replace("name: tool_call", "name: exact")
    (root / "pivot.yaml").write_text(text)
    capsys.readouterr()
    assert pivot(["stale"]) == 0
    stale = capsys.readouterr().out
    for shard in ("000", "001", "002", "003"):
        assert f"rollout_rewards[{shard}] STALE" in stale and f"turn_profiles[{shard}] STALE" in stale
        assert f"rollouts[{shard}]" not in stale
    assert pivot(["run", "--stale"]) == 0
    assert len(materializations("rollouts")) == generated_before  # not one token generated
    from pivot_assets.verifiers import DomainVerifiers

    exact = DomainVerifiers({"default": {"name": "exact"}}).fingerprint
    rescored = {r.partition_key for r in materializations("rollout_rewards")
                if r.asset_materialization.metadata["rollouts_scored"].value > 0
                and r.asset_materialization.metadata["verifier_fp"].value == exact}
    assert rescored == {"000", "001", "002", "003"}
    verifiers = duckdb.sql(f"select verifier_fp, count(*) from read_parquet('{root}/wh/rollout_rewards/**/*.parquet', "
                           "hive_partitioning = false) group by all").fetchall()
    assert sorted(n for _, n in verifiers) == [LIMIT * K, LIMIT * K]
    capsys.readouterr()
    assert pivot(["stale"]) == 0
    assert "rollout_rewards[" not in capsys.readouterr().out


def test_pivot_sets_read_every_shard(profiled, in_project, capsys):
    root = in_project(profiled)
    capsys.readouterr()
    assert pivot(["run", "--select", PROFILING]) == 0  # every shard fresh: `pivot run` starts no shard run
    assert "shards fresh, not run: 000, 001, 002, 003" in capsys.readouterr().err
    assert pivot(["run", "--select", "pivots_mixed"]) == 0  # the pivot-set multi-asset, unpartitioned
    logged = {r[0] for r in duckdb.sql(  # the turns the selection saw profiles of (the rest: not_profiled)
        f"select distinct turn_id from read_parquet('{root}/wh/pivot_selection_log.parquet') "
        "where reason <> 'not_profiled'").fetchall()}
    profiled_turns = duckdb.sql(f"select turn_id, trajectory_id from read_parquet('{root}/wh/turn_profiles/**/*.parquet', "
                                "hive_partitioning = false)").fetchall()
    assert len(profiled_turns) == LIMIT
    assert logged == {t for t, _ in profiled_turns}  # a selection decision for every turn of every shard
    assert {shard_of(traj, SHARDS) for _, traj in profiled_turns} == set(range(SHARDS))
    with duckdb.connect(str(root / "wh" / "pivot.duckdb"), read_only=True) as con:  # views over all shards
        assert con.execute("select count(*) from rollouts").fetchone()[0] == LIMIT * K
        assert "shard" not in {r[0] for r in con.execute("describe turn_profiles").fetchall()}


# -- kill -9 of a shard's Ray job mid-write ----------------------------------------------------------------------
def _running_job(dashboard: str, shard: int):
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    for job in client.list_jobs():
        if job.status == JobStatus.RUNNING and (job.metadata or {}).get("pivot_shard") == str(shard):
            return job
    return None


def _alive_actors(dashboard: str, job_id: str | None) -> list:
    from ray.util.state import list_actors

    return list_actors(address=dashboard, filters=[("job_id", "=", job_id), ("state", "!=", "DEAD")])


def test_kill_9_of_a_shard_job_mid_write_then_rerun(tmp_path, ray_head, in_project, tiny_model_dir):
    limit = 12
    root = in_project(make_project(tmp_path / "kill", ray_head, shards=2, limit_turns=limit, batch_rows=2,
                                   model=tiny_model_dir))
    assert pivot(["run", "--select", INGEST]) == 0
    expected = expected_rows(project_warehouse(root), 2, limit)
    shard = max(expected, key=expected.get)  # the bigger shard: more parts to kill between
    argv = [sys.executable, "-m", "pivot_jobs.cli", "run", "--in-process", "--shard", f"{shard:03d}",
            "--select", "rollouts"]
    proc = subprocess.Popen(argv, env={**os.environ, "PIVOT_SUPERVISED": "1", **HELD})
    seen: dict = {}

    def writing() -> bool:  # the shard's job is running and has written some of its rows, not all
        job = _running_job(ray_head.dashboard, shard)
        rows = rollout_rows(project_warehouse(root), shard)[0]
        if job is not None and job.driver_info is not None and 0 < rows < expected[shard]:
            seen.update(job=job, rows=rows)
            return True
        return False

    assert wait_for(writing, timeout_s=420, proc=proc, poll_s=0.2), \
        "the job finished (or never wrote) before it could be killed mid-write"
    os.kill(int(seen["job"].driver_info.pid), signal.SIGKILL)  # the shard job's driver, by its pid
    assert proc.wait(180) != 0  # the Dagster run fails with its Ray job
    # the driver's actors die with it, but one may finish the batch in hand first: count once none is left
    assert wait_for(lambda: not _alive_actors(ray_head.dashboard, seen["job"].job_id), timeout_s=120, poll_s=0.5)
    partial, distinct = rollout_rows(project_warehouse(root), shard)
    assert 0 < partial < expected[shard] and partial == distinct

    rerun = subprocess.run(argv, env={**os.environ, "PIVOT_SUPERVISED": "1"}, timeout=420)
    assert rerun.returncode == 0
    wh = project_warehouse(root)
    assert rollout_rows(wh, shard) == (expected[shard], expected[shard])  # exactly turns x K, no duplicate key
    assert not list((root / "wh" / "rollouts").rglob(".tmp-*"))
    meta = materializations("rollouts")[0].asset_materialization.metadata
    assert meta["rollouts_generated"].value == expected[shard] - partial  # only the missing sample keys


# -- kill -9 of `pivot run` itself mid-run: its children die with it ----------------------------------------------
def _unfinished_jobs(dashboard: str, warehouse: str) -> list[str]:
    from ray.job_submission import JobSubmissionClient

    return [j.submission_id for j in JobSubmissionClient(dashboard).list_jobs()
            if (j.metadata or {}).get("pivot_warehouse") == warehouse and not j.status.is_terminal()]


def _killable_project(root: Path, ray_head, limit: int, model: Path) -> tuple[dict, list[str], object]:
    """A 2-shard Ray project at `root` to kill mid-run: (env of the rerun, `pivot run` argv, its warehouse); the
    killed run's env adds HELD."""
    make_project(root, ray_head, shards=2, limit_turns=limit, batch_rows=2, model=model)
    env = {**os.environ, "DAGSTER_HOME": str(root / "dagster_home")}
    env.pop("PIVOT_CONFIG", None)
    argv = [str(Path(sys.executable).parent / "pivot"), "run", "--select", f"{INGEST},{PROFILING}"]
    return env, argv, project_warehouse(root)


def test_kill_9_of_pivot_run_leaves_no_process_and_a_rerun_completes(tmp_path, ray_head, tiny_model_dir):
    limit = 12
    root = tmp_path / "parent"
    env, argv, wh = _killable_project(root, ray_head, limit, tiny_model_dir)
    # the rows are counted at the kill (the Ray jobs' actors hold after their first part until stopped)
    killed = kill_parent_mid_run(argv, lambda: rollout_rows(wh)[0] > 0, cwd=root, env={**env, **HELD},
                                 at_kill=lambda: rollout_rows(wh)[0])
    assert killed.mid_run, "the run ended before its first part was seen"
    written, children = killed.at_kill, killed.descendants
    assert 0 < written < limit * K, "the run had written every row when it was killed: make the test input larger"
    assert len(children) >= 3, children  # the worker and both shard runs (max_shard_runs: 2)
    t0 = time.perf_counter()
    # every descendant went with the parent: the worker within ORPHAN_GRACE_S of the kill, a shard run within
    # ORPHAN_GRACE_S of the worker's end (each is SIGKILLed then if a clean stop has not ended it)
    # (an upper bound is the point: a process left running would be found; 30 s of slack on top of the two grace
    # periods keeps a loaded machine's slow stops and exits from reading as "left running")
    assert still_alive(children, within_s=2 * ORPHAN_GRACE_S + 30) == []
    print(f"kill -9 of `pivot run` with {written} rows written: its {len(children)} descendants gone in "
          f"{time.perf_counter() - t0:.1f} s")
    # the shard runs stopped their Ray jobs: Ray marks a stopped job terminal once its supervisor reaped the driver,
    # slow under load; the wait ends at that event, its bound only keeps a job left running from hanging the test
    assert wait_for(lambda: not _unfinished_jobs(ray_head.dashboard, str(wh.root)), timeout_s=120, poll_s=0.5), \
        _unfinished_jobs(ray_head.dashboard, str(wh.root))

    rerun = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert_exactly_turns_x_k(wh, 2, limit)
    assert rollout_rows(wh) == (limit * K, limit * K)


def test_kill_9_of_everything_mid_run_then_rerun_stops_the_orphaned_jobs(tmp_path, ray_head, tiny_model_dir):
    """kill -9 of `pivot run` and all its processes at once (a lost machine): nothing stops the Ray jobs or records
    the runs' end. The rerun marks those runs canceled, stops the orphaned jobs, and gives exactly turns x K."""
    from ray.job_submission import JobSubmissionClient

    limit = 12
    root = tmp_path / "all"
    env, argv, wh = _killable_project(root, ray_head, limit, tiny_model_dir)
    assert kill_run_after_first_part(argv, lambda: rollout_rows(wh)[0] > 0, cwd=root, env={**env, **HELD}).mid_run, \
        "the run ended before its first part was seen"
    orphans = _unfinished_jobs(ray_head.dashboard, str(wh.root))
    assert orphans, "no Ray job outlived the kill: make the test input larger"
    for job in orphans:  # frozen drivers: still running when the rerun reaches them, however fast this machine is
        os.kill(int(JobSubmissionClient(ray_head.dashboard).get_job_info(job).driver_info.pid), signal.SIGSTOP)
    rerun = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    printed = rerun.stdout + rerun.stderr
    assert all(f"stopping Ray job {job}" in printed for job in orphans), printed[-3000:]
    assert _unfinished_jobs(ray_head.dashboard, str(wh.root)) == []
    assert "lost its process" in printed  # the killed runs no longer block their shards
    assert_exactly_turns_x_k(wh, 2, limit)


# -- a job that reports no data version fails its run --------------------------------------------------------------
def test_a_job_reporting_no_data_version_fails_the_run(tmp_path, ray_head, in_project, monkeypatch, tiny_model_dir):
    from pivot_jobs.definitions import build_definitions
    from pivot_assets.profiling import assets as profiling_assets
    from pivot_jobs.runner import run_assets

    root = in_project(make_project(tmp_path / "silent", ray_head, shards=2, limit_turns=2, batch_rows=2,
                                   model=tiny_model_dir))
    script = root / "silent_job.py"
    script.write_text("from dagster_pipes import open_dagster_pipes\nwith open_dagster_pipes():\n    pass\n")
    monkeypatch.setattr(profiling_assets, "RAY_ENTRYPOINT", f"python {script}")  # a job that does nothing
    defs = build_definitions(str(root / "pivot.yaml"))
    report = run_assets(defs, [dg.AssetKey("rollouts")], dg.DagsterInstance.get(), partition_key="000")
    assert not report.success
    assert "without reporting a materialization with a data version" in report.error
