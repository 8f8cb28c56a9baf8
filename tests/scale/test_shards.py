"""Shards without a model: the shard function, the layout guard, the partitions Dagster sees, the run plan, and
the choice that a `shard=NNN` folder never becomes a column (DuckDB 1.5 and pyarrow would read it as one)."""

import dagster as dg
import duckdb
import pyarrow as pa
import pytest

from pivot_assets.core.catalog import ROLLOUTS_SCHEMA
from pivot_assets.core.config import ConfigError, PivotConfig, load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_jobs.definitions import build_definitions
from pivot_assets.profiling.profiler import (
    PER_SAMPLE,
    PER_TURN,
    policy_version,
    sampling_fingerprint,
)
from pivot_assets.profiling.shards import (
    check_layout,
    parse_shard,
    part_key,
    partition_keys,
    read_sql,
    shard_of,
)
from pivot_jobs.runner import plan_runs

PROFILING = ("rollouts", "rollout_rewards", "turn_profiles")


def test_shard_of_is_stable_and_spreads():
    ids = [f"traj-{i}" for i in range(400)]
    shards = [shard_of(t, 8) for t in ids]
    assert shards == [shard_of(t, 8) for t in ids]  # no salted hash(): the same in every process
    assert set(shards) == set(range(8)) and max(shards.count(s) for s in range(8)) < 80
    assert shard_of("traj-0", 1) == 0


def test_parse_shard_errors_are_one_line():
    assert parse_shard("003", 4) == 3 and parse_shard("3", 4) == 3
    with pytest.raises(ValueError, match=r"out of range \(scale.shards is 4: 0..3\)"):
        parse_shard("004", 4)
    with pytest.raises(ValueError, match="is not a number"):
        parse_shard("x", 4)


def test_scale_section_bounds(tmp_path):
    (tmp_path / "p.yaml").write_text("scale: {shards: 100}\n")
    with pytest.raises(ConfigError, match="scale.shards"):
        load_config(tmp_path / "p.yaml")
    (tmp_path / "p.yaml").write_text("scale: {engine: spark}\n")
    with pytest.raises(ConfigError, match="scale.engine"):
        load_config(tmp_path / "p.yaml")


def test_layout_is_recorded_and_another_shard_count_refused(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    check_layout(wh, 4)
    check_layout(wh, 4)
    with pytest.raises(ValueError, match="was profiled with shards: 4"):
        check_layout(wh, 8)
    old = Warehouse(tmp_path / "old")  # profiled unsharded before any layout was recorded
    old.append_part("rollouts", ROLLOUTS_SCHEMA.empty_table())
    with pytest.raises(ValueError, match="holds rows profiled with shards: 1"):
        check_layout(old, 2)
    check_layout(old, 1)  # the layout it has: recorded from now on
    with pytest.raises(ValueError, match="was profiled with shards: 1"):
        check_layout(old, 2)


def test_partitions_only_when_sharded():
    def partitions(cfg):
        defs = build_definitions(cfg)
        dg.Definitions.validate_loadable(defs)  # the code location the UI loads, jobs included
        graph = defs.resolve_asset_graph()
        return {k.to_user_string(): graph.get(k).partitions_def for k in graph.get_all_asset_keys()}

    assert all(p is None for p in partitions(PivotConfig()).values())
    sharded = partitions(PivotConfig.model_validate({"scale": {"shards": 4}}))
    for name, p in sharded.items():
        if name in PROFILING:
            assert p.get_partition_keys() == partition_keys(4) == ["000", "001", "002", "003"]
        else:
            assert p is None, name  # pivot sets, exports, training read every shard


def test_ray_engine_is_another_sample_identity():
    """Per-sample seeds draw other samples than K from one generator per turn: rows and code version differ."""
    cfg = PivotConfig()
    assert policy_version(cfg.policy) == policy_version(cfg.policy, PER_TURN)
    assert policy_version(cfg.policy, PER_SAMPLE) != policy_version(cfg.policy)
    from pivot_assets.policies.base import SamplingConfig

    s = SamplingConfig()
    assert sampling_fingerprint(s) == s.fingerprint and sampling_fingerprint(s, PER_SAMPLE) != s.fingerprint


def test_run_plan_one_run_per_shard():
    defs = build_definitions(PivotConfig.model_validate({"scale": {"shards": 3}}))
    keys = [dg.AssetKey(n) for n in ("trajectories", "quarantine", "turns", *PROFILING, "pivots_adv")]
    plan = plan_runs(defs, [(k, None) for k in keys])
    assert [k.to_user_string() for k in plan.before] == ["quarantine", "trajectories", "turns"]
    assert sorted(plan.shards) == ["000", "001", "002"]
    assert all([k.to_user_string() for k in v] == list(PROFILING) for v in plan.shards.values())
    assert [k.to_user_string() for k in plan.after] == ["pivots_adv"]
    # stale shards only: the plan runs those partitions, nothing before them
    plan = plan_runs(defs, [(dg.AssetKey("rollout_rewards"), "001"), (dg.AssetKey("turn_profiles"), "001")])
    assert plan.before == [] and list(plan.shards) == ["001"] and plan.after == []


def test_part_key_is_deterministic():
    assert part_key("p", "s", rows=["b", "a"]) == part_key("p", "s", rows=["a", "b"]) != part_key("p", "s", rows=["a"])


def test_shard_folders_are_no_column(tmp_path):
    """Parts under shard=NNN/ read back with the table's own columns in the views, the contracts' reads,
    read_arrow and the profiler's reads: the same schema whatever scale.shards is."""
    wh = Warehouse(tmp_path / "wh")
    for shard in (0, 1):
        row = {f.name: None for f in ROLLOUTS_SCHEMA} | {"turn_id": f"t{shard}", "sample_index": 0}
        wh.append_part("rollouts", pa.Table.from_pylist([row], schema=ROLLOUTS_SCHEMA), shard=shard, key="k")
    names = set(ROLLOUTS_SCHEMA.names)
    auto = duckdb.sql(f"select * from read_parquet('{wh.source_glob('rollouts')}')").columns
    assert "shard" in auto  # what DuckDB 1.5 does by default: the reason for the choice below
    assert set(duckdb.sql(f"select * from {read_sql(wh, 'rollouts')}").columns) == names
    assert set(wh.read_arrow("rollouts").column_names) == names
    wh.refresh_views()
    with wh.connect(read_only=True) as con:
        assert {r[0] for r in con.execute("describe rollouts").fetchall()} == names
        assert con.execute("select count(*) from rollouts").fetchone()[0] == 2


def test_instance_settings_for_shard_runs(tmp_path, monkeypatch):
    """The shipped run-queue limit (one run in flight per shard) and fleet pool load as Dagster reads them."""
    from tests.conftest import REPO_ROOT

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO_ROOT / "configs" / "dagster_instance_scale.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = dg.DagsterInstance.get()
    config = instance.get_concurrency_config()
    assert config.run_queue_config.tag_concurrency_limits == [
        {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]
    assert config.pool_config.default_pool_limit == 64
    graph = build_definitions(PivotConfig.model_validate({"scale": {"shards": 2}})).resolve_asset_graph()
    from pivot_assets.profiling.assets import GENERATION_POOL

    assert graph.get(dg.AssetKey("rollouts")).pools == {GENERATION_POOL}


def test_a_busy_shard_refuses_a_second_run(tmp_path, monkeypatch):
    """One run in flight per shard, also for runs the run queue never sees (`pivot run`, execute_in_process)."""
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

    from pivot_jobs.runner import run_assets

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    instance = dg.DagsterInstance.get()
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id="busy-run", status=DagsterRunStatus.STARTED,
                                tags={"dagster/partition": "001"}))
    defs = build_definitions(PivotConfig.model_validate({"scale": {"shards": 2}, "warehouse": str(tmp_path / "wh")}))
    report = run_assets(defs, [dg.AssetKey("rollout_rewards")], instance, partition_key="001")
    assert not report.success and "shard 001 already has run busy-run in flight" in report.error
    assert not (tmp_path / "wh" / "rollout_rewards").exists()  # stopped before writing anything


def test_a_run_whose_process_is_gone_no_longer_blocks_its_shard(tmp_path, monkeypatch):
    """A shard run killed with no chance to record its end (kill -9) stays STARTED; the next run of the shard sees
    its process is gone (pivot/process tag), marks it canceled and goes on. A live process still blocks."""
    import subprocess
    import sys

    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

    from pivot_assets.core.parallel import process_token
    from pivot_assets.materialization import PROCESS_TAG
    from pivot_jobs.runner import run_assets

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    instance = dg.DagsterInstance.get()
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    dead_token = process_token(dead.pid)
    dead.kill()
    dead.wait()
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id="killed-run", status=DagsterRunStatus.STARTED,
                                tags={"dagster/partition": "001", PROCESS_TAG: dead_token}))
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id="live-run", status=DagsterRunStatus.STARTED,
                                tags={"dagster/partition": "000", PROCESS_TAG: process_token()}))
    defs = build_definitions(PivotConfig.model_validate({"scale": {"shards": 2}, "warehouse": str(tmp_path / "wh")}))
    report = run_assets(defs, [dg.AssetKey("rollout_rewards")], instance, partition_key="001")
    assert "already has run" not in (report.error or "")
    assert instance.get_run_by_id("killed-run").status == DagsterRunStatus.CANCELED
    report = run_assets(defs, [dg.AssetKey("rollout_rewards")], instance, partition_key="000")
    assert not report.success and "shard 000 already has run live-run in flight" in report.error
