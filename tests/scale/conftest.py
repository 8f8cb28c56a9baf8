"""Fixtures of the scale tests: a single-node Ray head on 127.0.0.1 (ray_head.py), plain or with the S3 test
store's credentials in its environment, a project dir to run `pivot` in, and what its tables should hold."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.profiling.shards import read_sql, shard_of
from tests.s3_store import s3_credentials_env

from .ray_head import start_ray_head


def _head(request, env: dict[str, str] | None = None):
    head = start_ray_head(num_cpus=2, env=env)
    request.addfinalizer(head.stop)
    print(f"ray head up in {head.start_s:.1f} s at {head.dashboard}")
    return head


@pytest.fixture(scope="module")
def ray_head(request):
    return _head(request)


@pytest.fixture(scope="module")
def ray_head_s3(request, s3_server):
    """A Ray head whose environment (so every worker's and job driver's) holds the AWS variables of the test
    store: jobs write to S3 without any credential in their runtime_env or metadata."""
    return _head(request, s3_credentials_env(s3_server))


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
