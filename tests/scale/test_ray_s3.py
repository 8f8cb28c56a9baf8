"""Shards through Ray INTO S3, for real: 4 shards profiled by Ray jobs on a single-node head (127.0.0.1) whose
workers write to SeaweedFS (127.0.0.1), with the credentials in the head's environment only.

Covers: exactly turns x K rollouts with no duplicate sample key; keyed parts under table/shard=NNN/ on the store
(named by their rows, nothing local); the pivot sets read every shard; no credential in any Ray job's metadata,
runtime_env or log; a rerun is cached (no shard run, no Ray job) and a forced shard job generates nothing.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pivot_jobs.cli import main as pivot
from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.profiling.profiler import Profiler
from pivot_assets.profiling.shards import part_key, shard_of
from tests.s3_store import ACCESS_KEY, SECRET_KEY, assert_no_credentials

from .conftest import (
    INGEST,
    PROFILING,
    K,
    assert_exactly_turns_x_k,
    make_project,
    materializations,
    project_warehouse,
    rollout_rows,
    shard_jobs,
)

pytestmark = pytest.mark.scenario
SHARDS = 4
LIMIT = 12
PIVOT_SETS = "pivots_mixed,pivots_adv,pivots_cand,pivot_selection_log"


def ray_jobs(dashboard: str) -> list:
    return shard_jobs(dashboard)  # the preflight check's job is not a shard's


def parts_on_store(wh: Warehouse, table: str) -> dict[str, str]:
    """{key under the warehouse prefix: ETag} of a table's parts (what a rerun must leave untouched)."""
    base = len(wh.tables_uri.removeprefix("s3://")) + 1
    return {p.key[base:]: p.etag() for p in wh.part_files(table)}


def assert_keyed_rollout_parts(wh: Warehouse, policy_fp: str, sampling_fp: str) -> None:
    """Every rollouts part sits in its rows' shard folder and is named by its rows (a rerun overwrites it)."""
    for path in wh.part_files("rollouts"):
        rows = pq.read_table(path.key, filesystem=path.fs).to_pylist()
        assert {r["policy_fp"] for r in rows} == {policy_fp} and {r["sampling_fp"] for r in rows} == {sampling_fp}
        assert {shard_of(r["trajectory_id"], SHARDS) for r in rows} == {int(path.parent.name.removeprefix("shard="))}
        key = part_key(policy_fp, sampling_fp, rows=(f"{r['turn_id']}:{r['sample_index']}" for r in rows))
        assert path.name == f"part-{key}.parquet", path


def assert_no_credentials_in_jobs(dashboard: str) -> list:
    """No credential in any job's (the preflight's included) entrypoint, metadata, runtime_env or log; returns the
    shard jobs."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    jobs = client.list_jobs()
    for job in jobs:
        env_vars = (job.runtime_env or {}).get("env_vars", {})
        assert env_vars.get("HF_HUB_OFFLINE") == "1"  # the forwarded environment is where we look
        assert not any(name.startswith("AWS_") for name in env_vars), sorted(env_vars)
        text = job.model_dump_json() + client.get_job_logs(job.submission_id)
        assert ACCESS_KEY not in text and SECRET_KEY not in text, job.submission_id
    return [j for j in jobs if not (j.metadata or {}).get("pivot_preflight")]


def test_four_shards_through_ray_into_s3(tmp_path, s3_env, ray_head, tiny_model_dir, in_project, capsys):
    root = in_project(make_project(tmp_path / "p", ray_head, warehouse=s3_env, shards=SHARDS, limit_turns=LIMIT,
                                   batch_rows=4, model=tiny_model_dir))
    earlier = {j.submission_id for j in ray_jobs(ray_head.dashboard)}  # other tests' jobs on the shared head
    assert pivot(["run", "--select", f"{INGEST},{PROFILING},{PIVOT_SETS}"]) == 0
    wh = project_warehouse(root)
    assert wh.is_remote and not (wh.root / "rollouts").exists()  # the tables live on the store only

    # exactly turns x K, per shard and in all, no duplicate sample key; keyed parts in shard folders
    expected = assert_exactly_turns_x_k(wh, SHARDS, LIMIT)
    assert sum(expected.values()) == LIMIT * K and all(expected.values()), expected  # every shard has turns
    assert rollout_rows(wh) == (LIMIT * K, LIMIT * K)
    profiler = Profiler.for_config(load_config(root / "pivot.yaml"), shard=0)
    assert_keyed_rollout_parts(wh, profiler.policy_fp, profiler.sampling_fp)
    profile_parts = sorted(parts_on_store(wh, "turn_profiles"))
    assert profile_parts == [f"turn_profiles/shard={s:03d}/part-profiles.parquet" for s in range(SHARDS)]
    assert {k.split("/")[1] for k in parts_on_store(wh, "rollout_rewards")} == {f"shard={s:03d}" for s in range(SHARDS)}

    # the pivot sets read every shard: a selection decision for every profiled turn, turns of all 4 shards
    profiled = wh.read("turn_profiles", ["turn_id", "trajectory_id"]).rows()
    logged = {t for t, reason in wh.read("pivot_selection_log", ["turn_id", "reason"]).rows() if reason != "not_profiled"}
    assert len(profiled) == LIMIT and logged == {t for t, _ in profiled}
    assert {shard_of(trajectory, SHARDS) for _, trajectory in profiled} == set(range(SHARDS))

    # one Ray job per shard, each of which wrote to S3 with the head's credentials and shows none of them
    jobs = [j for j in assert_no_credentials_in_jobs(ray_head.dashboard) if j.submission_id not in earlier]
    assert sorted(j.metadata["pivot_shard"] for j in jobs) == [str(s) for s in range(SHARDS)]

    # a rerun is cached: no shard run, no Ray job, not one part rewritten
    before = {t: parts_on_store(wh, t) for t in ("rollouts", "rollout_rewards", "turn_profiles")}
    capsys.readouterr()
    assert pivot(["run", "--select", f"{INGEST},{PROFILING},{PIVOT_SETS}"]) == 0
    assert "shards fresh, not run: 000, 001, 002, 003" in capsys.readouterr().err
    assert len(ray_jobs(ray_head.dashboard)) == len(earlier) + SHARDS
    # forced, a shard's Ray job finds every sample on the store and generates nothing
    assert pivot(["run", "--shard", "001", "--select", "rollouts"]) == 0
    assert materializations("rollouts")[0].asset_materialization.metadata["rollouts_generated"].value == 0
    assert {t: parts_on_store(wh, t) for t in before} == before
    assert_no_credentials_in_jobs(ray_head.dashboard)
    printed = capsys.readouterr()
    assert_no_credentials(root, texts=[printed.out, printed.err])
