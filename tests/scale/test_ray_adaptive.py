"""Adaptive profiling through Ray, for real: a Ray head on 127.0.0.1, 2 shards, each shard's rounds run by its job
on the same actors (each builds its engine once for all rounds), scoring between rounds in the job's driver, the
prior fitted on the shard's own first rounds.

Covers: the Ray run draws exactly the samples (keys and completions) and reaches exactly the profiles of a local
run with the same 2 shards (the same per-shard prior); more than one round ran; a rerun generates nothing.
The policy is the tiny random-weight one (tests/tiny_model.py): Ray's plumbing is under test, not the model; the
graded verifier gives its random completions mixed rewards, so some turns stop early and others take more rounds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import duckdb
import pytest

from pivot_jobs.cli import main as pivot
from tests.crashes import kill_run_after_first_part

from .conftest import INGEST, PROFILING, materializations

pytestmark = pytest.mark.scenario
VENV_BIN = Path(sys.executable).parent
SHARDS, LIMIT, K = 2, 8, 6


def write_project(root, engine: str, model) -> None:
    """A project profiling with `model` (the tiny test policy: Ray's plumbing is under test, not the model)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pivot.yaml").write_text(f"""warehouse: ./wh
sample: {{n_trajectories: 8, seed: 3}}
policy: {{model: {model}, k: {K}, max_new_tokens: 8, limit_turns: {LIMIT}, batch_size: 8, dtype: float32}}
verifier: {{default: {{name: string_similarity, graded: true, facts: ignore}}}}
profiling: {{seeding: per_sample, adaptive: {{enabled: true, rule: exact, round_size: 2, sets: [mixed]}}}}
runtime: {{threads: 1}}
scale: {engine}
""")


def samples(root) -> list[tuple]:
    return duckdb.sql(f"select turn_id, sample_index, completion from read_parquet('{root}/wh/rollouts/**/*.parquet', "
                      "hive_partitioning = false) order by all").fetchall()


def profiles(root) -> list[tuple]:
    return duckdb.sql(f"select turn_id, k, reward_mean, stop_reason from read_parquet('{root}/wh/turn_profiles/**/*.parquet', "
                      "hive_partitioning = false) order by all").fetchall()


def test_adaptive_rounds_through_ray_draw_exactly_the_local_samples(tmp_path, ray_head, in_project, tiny_model_dir):
    ray_root, local_root = tmp_path / "ray", tmp_path / "local"
    write_project(ray_root, f'{{shards: {SHARDS}, engine: ray, ray_address: "{ray_head.dashboard}", '
                            f'ray_batch_rows: 8, max_shard_runs: 2}}', tiny_model_dir)  # = policy.batch_size
    write_project(local_root, f"{{shards: {SHARDS}, engine: local}}", tiny_model_dir)

    in_project(local_root)
    assert pivot(["run", "--select", f"{INGEST},{PROFILING}"]) == 0
    in_project(ray_root)
    assert pivot(["run", "--select", f"{INGEST},{PROFILING}"]) == 0

    ray_samples = samples(ray_root)
    assert ray_samples == samples(local_root) and len(ray_samples) < LIMIT * K  # some turns stopped early
    assert len({(t, i) for t, i, _ in ray_samples}) == len(ray_samples)
    assert profiles(ray_root) == profiles(local_root)
    records = {r.partition_key: r.asset_materialization.metadata for r in materializations("rollouts")}
    assert sorted(records) == ["000", "001"]
    assert max(m["rounds"].value for m in records.values()) >= 2
    assert all(m["Ray Job ID"].value for m in records.values())

    assert pivot(["run", "--select", "rollouts"]) == 0  # every shard's rounds are settled on disk: nothing new
    assert samples(ray_root) == ray_samples

    # kill -9 of `pivot run` between rounds (once a first round is scored), then a rerun: the same samples, none twice
    killed = tmp_path / "killed"
    write_project(killed, f'{{shards: {SHARDS}, engine: ray, ray_address: "{ray_head.dashboard}", '
                          f'ray_batch_rows: 8, max_shard_runs: 2}}', tiny_model_dir)
    in_project(killed)
    assert pivot(["run", "--select", INGEST]) == 0
    env = {**os.environ, "DAGSTER_HOME": str(killed / "dagster_home")}
    # the samples are counted at the kill: the orphaned Ray jobs' actors write on until the rerun stops them
    kill = kill_run_after_first_part([str(VENV_BIN / "pivot"), "run", "--select", "rollouts"],
                                     lambda: bool(list((killed / "wh" / "rollout_rewards").glob("shard=*/part-*.parquet"))),
                                     cwd=killed, env=env, timeout_s=600, at_kill=lambda: len(samples(killed)))
    assert kill.mid_run, "the run ended before a first round was scored"
    assert 0 < kill.at_kill < len(ray_samples), "the run had drawn every sample when it was killed"
    assert pivot(["run", "--select", PROFILING]) == 0  # stops the orphaned jobs, then completes every shard's rounds
    assert samples(killed) == ray_samples and profiles(killed) == profiles(local_root)
