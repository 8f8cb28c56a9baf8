"""A shared Dagster instance in PostgreSQL 15 (dagster-postgres), started by the test on 127.0.0.1: two `pivot run`s
at once record both runs and all their events there, and each warehouse gets exactly the rows it should; two shard
runs of one project at once (`pivot run --shard NNN`) each write exactly their shard's turns x K."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl

from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.ingest.inputs import resolved_inputs, write_ingest, write_turns

VENV_BIN = Path(sys.executable).parent

# The dagster.yaml docs/scale.md documents (the URL comes from the environment, so no password sits in the file).
DAGSTER_YAML = """\
storage:
  postgres:
    postgres_url:
      env: PIVOT_DAGSTER_PG_URL
concurrency:
  pools:
    default_limit: 1
  runs:
    max_concurrent_runs: 8
telemetry:
  enabled: false
"""


def expected_turns(tmp_path: Path, text: str) -> pl.DataFrame:
    """The turns a config's input gives, computed by the Dagster-free libraries in a throwaway local warehouse."""
    root = tmp_path / "reference" / str(abs(hash(text)))
    root.mkdir(parents=True)
    (root / "pivot.yaml").write_text(text.split("\n", 1)[1])  # the same input, the default local warehouse
    cfg = load_config(root / "pivot.yaml")
    wh = Warehouse(cfg.warehouse_dir)
    write_ingest(wh, resolved_inputs(cfg), workers=1)
    write_turns(wh)
    return wh.read("turns").sort("turn_id")


def test_two_runs_at_once_share_a_postgres_instance(tmp_path, postgres, s3_env, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    env = {**os.environ, "DAGSTER_HOME": str(home), "PIVOT_DAGSTER_PG_URL": postgres["url"]}
    env.pop("PIVOT_CONFIG", None)
    # two warehouses, one on the object store and one local, one instance: like two shard runs at once
    configs = {"s3": f"warehouse: {s3_env}\nsample: {{n_trajectories: 6, seed: 1}}\n",
               "local": "warehouse: ./wh\nsample: {n_trajectories: 4, seed: 2}\n"}
    procs = {}
    for name, text in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "pivot.yaml").write_text(text)
        procs[name] = subprocess.Popen([str(VENV_BIN / "pivot"), "run", "--select", "trajectories,turns"],
                                       cwd=tmp_path / name, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
    outputs = {name: p.communicate(timeout=600) for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, outputs[name][1][-2000:]
    run_ids = {name: next(line.split()[1].rstrip(":") for line in outputs[name][0].splitlines()
                          if line.startswith("run ")) for name in configs}

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("PIVOT_DAGSTER_PG_URL", postgres["url"])
    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        records = {name: instance.get_run_record_by_id(run_id) for name, run_id in run_ids.items()}
        assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records.values())
        # they really ran at the same time (each started before the other ended)
        a, b = records.values()
        assert a.start_time < b.end_time and b.start_time < a.end_time
        for name, run_id in run_ids.items():
            events = instance.all_logs(run_id)
            materialized = {e.dagster_event.asset_key.to_user_string() for e in events if e.is_dagster_event
                            and e.dagster_event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION}
            assert materialized == {"trajectories", "quarantine", "turns"}, name
            assert any(e.dagster_event.event_type == dg.DagsterEventType.RUN_SUCCESS
                       for e in events if e.is_dagster_event)

    # the events are in Postgres itself, not in a local file
    n_events = subprocess.run([str(Path("/usr/lib/postgresql/15/bin/psql")), postgres["libpq_url"], "-tAc",
                               "select count(*) from event_logs where run_id in ('%s', '%s')" % tuple(run_ids.values())],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert int(n_events) > 10
    assert not list(home.rglob("*.db"))  # no SQLite storage was created beside it

    # each warehouse holds exactly the turns its input gives
    for name, text in configs.items():
        wh = Warehouse(load_config(tmp_path / name / "pivot.yaml").warehouse_dir)
        got = wh.read("turns").sort("turn_id")
        assert got.equals(expected_turns(tmp_path, text)), name


def test_two_shard_runs_at_once_share_a_postgres_instance(tmp_path, postgres, monkeypatch, tiny_model_dir):
    """Two shard runs of one project at once (`pivot run --shard 000` and `--shard 001`) on the Postgres instance:
    both succeed, overlap in time, carry their partition, and each shard holds exactly its turns x K rollouts."""
    from tests.scale.conftest import assert_exactly_turns_x_k

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    env = {**os.environ, "DAGSTER_HOME": str(home), "PIVOT_DAGSTER_PG_URL": postgres["url"]}
    env.pop("PIVOT_CONFIG", None)
    (tmp_path / "pivot.yaml").write_text(
        "warehouse: ./wh\nsample: {n_trajectories: 6, seed: 3}\nverifier: {default: {name: tool_call}}\n"
        f"policy: {{model: {tiny_model_dir}, k: 2, max_new_tokens: 8, limit_turns: 8, batch_size: 8}}\n"
        "runtime: {threads: 1}\nscale: {shards: 2}\n")
    pivot = str(VENV_BIN / "pivot")
    subprocess.run([pivot, "run", "--select", "trajectories,turns"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    procs = {shard: subprocess.Popen([pivot, "run", "--shard", shard, "--select", "rollouts,rollout_rewards,turn_profiles"],
                                     cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for shard in ("000", "001")}
    outputs = {shard: p.communicate(timeout=600) for shard, p in procs.items()}
    for shard, p in procs.items():
        assert p.returncode == 0, outputs[shard][1][-2000:]

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("PIVOT_DAGSTER_PG_URL", postgres["url"])
    with dg.DagsterInstance.get() as instance:
        records = [r for r in instance.get_run_records() if r.dagster_run.tags.get("dagster/partition") in ("000", "001")]
        assert sorted(r.dagster_run.tags["dagster/partition"] for r in records) == ["000", "001"]
        assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records)
        a, b = records
        assert a.start_time < b.end_time and b.start_time < a.end_time  # really at once

    wh = Warehouse(load_config(tmp_path / "pivot.yaml").warehouse_dir)
    assert_exactly_turns_x_k(wh, 2, 8)


def test_runs_starting_at_once_create_each_new_pool_once(tmp_path, postgres, monkeypatch):
    """Many runs that start at once on a new pool: each creates the pool's limit row before its steps claim it, and
    none fails on the insert the others made (a shard run failed that way with a unique violation)."""
    from concurrent.futures import ThreadPoolExecutor

    from pivot_jobs.runner import create_pools

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    monkeypatch.setenv("PIVOT_DAGSTER_PG_URL", postgres["url"])
    instances = [dg.DagsterInstance.from_config(str(home)) for _ in range(4)]
    pools = {f"race_{i}" for i in range(10)}
    with ThreadPoolExecutor(len(instances)) as pool:
        list(pool.map(lambda inst: create_pools(inst, pools), instances))
    limits = {key: instances[0].event_log_storage.get_concurrency_info(key).slot_count for key in pools}
    assert limits == dict.fromkeys(pools, 1)  # the instance's default_limit, once per pool
