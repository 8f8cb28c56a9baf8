"""Fixtures of the scale tests: a single-node Ray head on 127.0.0.1 (ray_head.py), plain or with the S3 test
store's credentials in its environment, a project dir to run `pivot` in, and what its tables should hold."""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import pytest

from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.profiling.shards import read_sql, shard_of
from tests.s3_store import s3_credentials_env

from .ray_head import start_ray_head


@pytest.fixture(scope="session")
def ray_head(request, s3_server):
    """One Ray head for every Ray test of the run (a head takes 12-22 s to start), its environment (so every
    worker's and job driver's) holding the AWS variables of the test store: jobs write to an s3:// warehouse
    without any credential in their runtime_env or metadata; a local warehouse never reads them. Each test that
    uses it must leave it clean (`_ray_head_left_clean`)."""
    head = start_ray_head(num_cpus=2, env=s3_credentials_env(s3_server))
    request.addfinalizer(head.stop)
    print(f"ray head up in {head.start_s:.1f} s at {head.dashboard}")
    return head


@pytest.fixture(autouse=True)
def _ray_head_left_clean(request):
    """After a test on the shared head: no job of it still running and no actor alive, so the next test starts on
    an idle head (a test that kills a job waits for Ray to mark it ended; this checks that it did)."""
    yield
    if "ray_head" in request.fixturenames:
        leftovers = ray_head_leftovers(request.getfixturevalue("ray_head").dashboard)
        assert leftovers == ([], []), f"left on the shared Ray head (jobs not ended, actors alive): {leftovers}"


def ray_head_leftovers(dashboard: str, wait_s: float = 60) -> tuple[list[str], list[str]]:
    """(jobs not in a terminal state, a job's actors not dead) on the head, after waiting up to `wait_s` for them to
    end (Ray marks a stopped job ended once its supervisor has reaped the driver, which takes a moment under load).
    Detached actors are the cluster's, not a job's (Ray Data's stats actor lives as long as the head): not counted."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    client, deadline = JobSubmissionClient(dashboard), time.monotonic() + wait_s
    while True:
        jobs = [j.submission_id for j in client.list_jobs() if not j.status.is_terminal()]
        actors = [f"{a.class_name} {a.actor_id}" for a in list_actors(address=dashboard, filters=[("state", "!=", "DEAD")],
                                                                     detail=True) if not a.is_detached]
        if (not jobs and not actors) or time.monotonic() > deadline:
            return jobs, actors
        time.sleep(0.5)


@pytest.fixture
def in_project(monkeypatch):
    """Enter a project dir: its own DAGSTER_HOME, no inherited $PIVOT_CONFIG, cwd = the dir."""
    def enter(root: Path) -> Path:
        (root / "dagster_home").mkdir(exist_ok=True)
        monkeypatch.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        monkeypatch.delenv("PIVOT_CONFIG", raising=False)
        monkeypatch.chdir(root)
        return root
    return enter


# -- a project profiled in shards on Ray ---------------------------------------------------------------------------
K = 2  # samples per turn in every scale test project
INGEST = "trajectories,turns"
PROFILING = "rollouts,rollout_rewards,turn_profiles"


def make_project(root: Path, ray_head, *, shards: int, limit_turns: int, batch_rows: int, max_new_tokens: int = 8,
                 verifier: str = "tool_call", warehouse: str = "./wh", model: str | Path = "embedded") -> Path:
    """A pivot.yaml: `model` (the embedded policy, or the tiny test policy where only the plumbing is under test),
    K samples, `shards` shards on the Ray head, two shard runs at once."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pivot.yaml").write_text(f"""warehouse: {warehouse}
sample: {{n_trajectories: 8, seed: 3}}
policy: {{model: {model}, k: {K}, max_new_tokens: {max_new_tokens}, limit_turns: {limit_turns}, batch_size: 8}}
verifier: {{default: {{name: {verifier}}}}}
runtime: {{threads: 1}}
scale: {{shards: {shards}, engine: ray, ray_address: "{ray_head.dashboard}", ray_batch_rows: {batch_rows}, max_shard_runs: 2}}
""")
    return root


def project_warehouse(root: Path) -> Warehouse:
    """The warehouse of the project at `root` (a local dir or s3://: the AWS variables must be set)."""
    return Warehouse(load_config(root / "pivot.yaml").warehouse_dir)


def expected_rows(wh: Warehouse, shards: int, limit_turns: int) -> dict[int, int]:
    """turns x K per shard, from the turns table and the shard function (not from what was written)."""
    with wh.duck() as con:
        rows = con.sql(f"select turn_id, trajectory_id from read_parquet('{wh.table_path('turns')}') "
                       f"order by turn_id limit {limit_turns}").fetchall()
    out = {s: 0 for s in range(shards)}
    for _, trajectory in rows:
        out[shard_of(trajectory, shards)] += K
    return out


def assert_exactly_turns_x_k(wh: Warehouse, shards: int, limit_turns: int) -> dict[int, int]:
    """Every shard holds exactly its turns x K rollouts, with no duplicate sample key; returns rows per shard."""
    expected = expected_rows(wh, shards, limit_turns)
    for shard, n in expected.items():
        assert rollout_rows(wh, shard) == (n, n), f"shard {shard}"
    return expected


def rollout_rows(wh: Warehouse, shard: int | None = None) -> tuple[int, int]:
    """(rows, distinct sample keys) of the rollouts, all shards or one."""
    if not wh.part_files("rollouts", shard):
        return 0, 0
    with wh.duck() as con:
        return con.sql(f"select count(*), count(distinct (turn_id, policy_fp, sampling_fp, sample_index)) "
                       f"from {read_sql(wh, 'rollouts', shard)}").fetchone()


def shard_jobs(dashboard: str) -> list:
    """The head's Ray jobs but the preflight checks (profiling/ray_preflight.py): the shard runs' jobs."""
    from ray.job_submission import JobSubmissionClient

    return [j for j in JobSubmissionClient(dashboard).list_jobs() if not (j.metadata or {}).get("pivot_preflight")]


def materializations(asset: str) -> list:
    """Every materialization of `asset` in the current instance ($DAGSTER_HOME), newest first."""
    return dg.DagsterInstance.get().fetch_materializations(dg.AssetKey(asset), limit=1000).records
