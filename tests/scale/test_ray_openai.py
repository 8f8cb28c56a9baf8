"""The openai backend inside Ray, for real: shard runs submit Ray jobs (single-node head on 127.0.0.1) whose
actors load no model and send their requests to an OpenAI-compatible server (`transformers serve` on
127.0.0.1): the server-fleet path of the scale plan in docs/scale.md, on this machine's CPU.

Covers: every shard holds exactly its turns x K rollouts with no duplicate sample key, all keyed by the server's
policy fingerprint; the turns are profiled (K samples each, every sample scored); one Ray job per shard, each
succeeded; a rerun is cached (no new Ray job).
"""

from __future__ import annotations

import pytest

from pivot_jobs.cli import main as pivot
from pivot_assets.profiling.shards import read_sql
from tests.model_server import transformers_serve

from .conftest import (
    INGEST,
    PROFILING,
    K,
    assert_exactly_turns_x_k,
    project_warehouse,
    shard_jobs,
)

pytestmark = pytest.mark.scenario
SHARDS = 2
LIMIT = 6


@pytest.fixture(scope="module")
def served(embedded_model_dir, tmp_path_factory):
    with transformers_serve(embedded_model_dir, tmp_path_factory.mktemp("serve") / "serve.log") as server:
        yield server


def ray_jobs(dashboard: str) -> list:
    return shard_jobs(dashboard)  # the preflight check's job is not a shard's


def test_shards_through_ray_with_the_openai_backend(tmp_path, ray_head, served, in_project):
    root = in_project(tmp_path)
    (root / "pivot.yaml").write_text(f"""warehouse: ./wh
sample: {{n_trajectories: 8, seed: 3}}
policy: {{backend: openai, base_url: '{served.base_url}', model: '{served.model}', k: {K}, max_new_tokens: 8,
          limit_turns: {LIMIT}, concurrency: 2}}
verifier: {{default: {{name: tool_call}}}}
scale: {{shards: {SHARDS}, engine: ray, ray_address: "{ray_head.dashboard}", ray_batch_rows: 4, max_shard_runs: 2}}
""")
    jobs_before = len(ray_jobs(ray_head.dashboard))
    assert pivot(["run", "--select", INGEST]) == 0
    assert pivot(["run", "--select", PROFILING]) == 0

    wh = project_warehouse(root)
    want = assert_exactly_turns_x_k(wh, SHARDS, LIMIT)
    assert sum(want.values()) == LIMIT * K
    with wh.duck() as con:
        fingerprints = con.sql(f"select distinct policy_fp from {read_sql(wh, 'rollouts')}").fetchall()
        profile_ks = con.sql(f"select k from {read_sql(wh, 'turn_profiles')}").fetchall()
    assert fingerprints == [(f"openai|{served.base_url}|{served.model}",)]
    assert profile_ks == [(K,)] * LIMIT

    jobs = ray_jobs(ray_head.dashboard)[jobs_before:]
    assert len(jobs) == sum(1 for rows in want.values() if rows) and all(j.status == "SUCCEEDED" for j in jobs)
    assert pivot(["run", "--select", PROFILING]) == 0  # cached: nothing to generate, no new job
    assert len(ray_jobs(ray_head.dashboard)) == jobs_before + len(jobs)
