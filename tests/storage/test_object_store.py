"""The warehouse on a real S3 server (SeaweedFS on 127.0.0.1): atomic whole objects, keyed parts per shard,
ETag data versions, DuckDB views through httpfs from PyPI, credentials only from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from pivot_assets.core.config import ConfigError, load_config
from pivot_assets.core.warehouse import S3Settings, Warehouse, connect_for

from tests.crashes import fail_mid_table_write, kill_mid_table_write

from tests.s3_store import ACCESS_KEY, SECRET_KEY


def s3_warehouse(tmp_path, uri: str) -> Warehouse:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "pivot.yaml").write_text(f"warehouse: {uri}\n")
    return Warehouse(load_config(tmp_path / "pivot.yaml").warehouse_dir)


def test_config_derives_a_local_state_dir(tmp_path, s3_env):
    (tmp_path / "pivot.yaml").write_text(f"warehouse: {s3_env}/\n")
    cfg = load_config(tmp_path / "pivot.yaml")
    bucket_and_prefix = s3_env.removeprefix("s3://")
    assert cfg.warehouse == s3_env
    assert cfg.warehouse_dir == tmp_path / ".warehouse-state" / bucket_and_prefix
    wh = Warehouse(cfg.warehouse_dir)
    assert wh.is_remote and wh.tables_uri == s3_env
    assert str(wh.table_path("turns")) == f"{s3_env}/turns.parquet"
    assert wh.source_glob("rollouts", shard=3) == f"{s3_env}/rollouts/shard=003/part-*.parquet"


@pytest.mark.parametrize("uri, message", [
    ("gs://bucket/x", "a local dir or s3://bucket/prefix"),
    ("s3://B/x", "not an S3 warehouse URI"),
    ("s3://bucket/a//b", "not an S3 warehouse URI"),
    ("s3://bucket/a/../b", "not an S3 warehouse URI"),
])
def test_bad_warehouse_uris_are_one_line_config_errors(tmp_path, uri, message):
    (tmp_path / "pivot.yaml").write_text(f"warehouse: {uri}\n")
    with pytest.raises(ConfigError, match=message) as err:
        load_config(tmp_path / "pivot.yaml")
    assert "\n" not in str(err.value)


def test_missing_credentials_are_one_line(tmp_path, s3_env, monkeypatch):
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "pivot.yaml").write_text(f"warehouse: {s3_env}\n")
    with pytest.raises(ValueError, match="needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        Warehouse(load_config(tmp_path / "pivot.yaml").warehouse_dir)


def test_settings_never_show_credentials(s3_env):
    settings = S3Settings.from_env()
    assert SECRET_KEY not in repr(settings) and ACCESS_KEY not in repr(settings)
    assert settings.endpoint.startswith("127.0.0.1:") and settings.scheme == "http"


def test_tables_parts_views_and_versions(tmp_path, s3_env):
    wh = s3_warehouse(tmp_path, s3_env)
    assert wh.tables() == [] and not wh.exists("turns")
    wh.write_table("turns", pa.table({"turn_id": ["a", "b"], "domain": ["d", "d"], "action_kind": ["message", "tool_call"]}))
    v1 = wh.data_version("turns")
    wh.write_table("turns", pa.table({"turn_id": ["a", "b"], "domain": ["d", "d"], "action_kind": ["message", "tool_call"]}))
    assert wh.data_version("turns") == v1  # same bytes, same ETag: children stay fresh
    # keyed parts per shard: a rerun of the same work overwrites, never duplicates
    for shard in (0, 1):
        wh.append_part("rollouts", pa.table({"k": [shard, shard + 10]}), shard=shard, key=f"batch-{shard}")
    wh.append_part("rollouts", pa.table({"k": [1, 11]}), shard=1, key="batch-1")
    wh.append_part("rollouts", pa.table({"k": [99]}))  # an unsharded part sits beside the shards
    assert [p.name for p in wh.part_files("rollouts", shard=1)] == ["part-batch-1.parquet"]
    assert len(wh.part_files("rollouts")) == 3
    assert sorted(wh.read_arrow("rollouts").column("k").to_pylist()) == [0, 1, 10, 11, 99]
    v_parts = wh.data_version("rollouts")
    wh.append_part("rollouts", pa.table({"k": [2]}), shard=2, key="batch-2")
    assert wh.data_version("rollouts") != v_parts
    assert wh.tables() == ["rollouts", "turns"]

    status = wh.refresh_views()
    assert status["action_kind_mix"] == "ok"
    con = wh.connect(read_only=True)
    assert con.sql("select sum(k) from rollouts").fetchone()[0] == 123
    assert con.sql("select count(*) from action_kind_mix").fetchone()[0] == 2
    con.close()
    # the default connection (duckdb.sql) reads the store too, and nothing is auto-installed
    assert duckdb.sql(f"select count(*) from read_parquet('{wh.source_glob('rollouts', shard=0)}')").fetchone()[0] == 2
    with connect_for(wh) as con:
        assert con.sql("select current_setting('autoinstall_known_extensions')").fetchone()[0] is False
    # the credentials are in no file of the state dir (the DuckDB secret is temporary, in memory only)
    for f in wh.root.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert SECRET_KEY.encode() not in data and ACCESS_KEY.encode() not in data, f


def test_kill_9_mid_upload_leaves_the_last_good_object(tmp_path, s3_env):
    wh = s3_warehouse(tmp_path, s3_env)
    wh.write_table("t", pa.table({"x": [1]}))
    kill_mid_table_write(str(wh.root), os.environ.copy())
    assert wh.read_arrow("t").column("x").to_pylist() == [1]
    assert wh.clean_temp_files("t") == 1  # the local upload buffer the killed writer left in the state dir
    assert not list(wh.root.glob(".tmp-*"))


def test_failed_write_keeps_the_last_good_object(tmp_path, s3_env):
    wh = s3_warehouse(tmp_path, s3_env)
    wh.write_table("t", pa.table({"x": [1, 2, 3]}))
    fail_mid_table_write(wh)
    assert wh.read_arrow("t").column("x").to_pylist() == [1, 2, 3]
    assert not list(wh.root.glob(".tmp-*"))


def test_the_duckdb_shell_reads_the_views_with_httpfs_and_a_secret_from_the_env(tmp_path, s3_env):
    """The recipe in docs/scale.md: the `duckdb` shell (duckdb-cli, same version) on the state dir's pivot.duckdb."""
    from pivot_assets.core.warehouse import httpfs_extension_path

    wh = s3_warehouse(tmp_path, s3_env)
    wh.write_table("turns", pa.table({"turn_id": ["a", "b", "c"]}))
    wh.refresh_views()
    endpoint = os.environ["AWS_ENDPOINT_URL"].removeprefix("http://")
    setup = (f"LOAD '{httpfs_extension_path()}'; CREATE SECRET (TYPE s3, KEY_ID getenv('AWS_ACCESS_KEY_ID'), "
             f"SECRET getenv('AWS_SECRET_ACCESS_KEY'), ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL false);")
    duck = subprocess.run([str(Path(sys.executable).parent / "duckdb"), str(wh.duckdb_path), "-readonly", "-csv",
                           "-cmd", setup, "-c", "select count(*) from turns"],
                          capture_output=True, text=True, timeout=120)
    assert duck.returncode == 0, duck.stderr
    assert duck.stdout.split()[-1] == "3"


def test_table_paths_open_in_pyarrow_and_duckdb_as_uris(tmp_path, s3_env):
    """Stages pass table_path() straight to pyarrow (read_schema, ParquetFile) and into DuckDB SQL."""
    import pyarrow.parquet as pq

    wh = s3_warehouse(tmp_path, s3_env)
    wh.write_table("trajectories", pa.table({"trajectory_id": ["t1", "t2"], "n": [1, 2]}))
    path = wh.table_path("trajectories")
    assert path.exists() and path.is_file() and path.stat().st_size > 0
    assert pq.read_schema(path).names == ["trajectory_id", "n"]
    assert pq.ParquetFile(path).metadata.num_rows == 2
    assert duckdb.sql(f"select sum(n) from read_parquet('{path}')").fetchone()[0] == 3
    with wh.duck() as con:
        assert con.sql(f"select count(*) from read_parquet('{wh.source_glob('trajectories')}')").fetchone()[0] == 2


def test_the_shard_layout_is_recorded_on_the_store_for_every_machine(tmp_path, s3_env):
    """A shard job on another node has its own local state dir: the shard count it checks against must be the
    one recorded beside the tables, not in a local file."""
    from pivot_assets.profiling.shards import check_layout

    here = s3_warehouse(tmp_path / "dagster-box", s3_env)
    check_layout(here, 4)
    here.append_part("rollouts", pa.table({"k": [1]}), shard=2, key="batch")
    elsewhere = s3_warehouse(tmp_path / "ray-node", s3_env)  # same tables, a fresh state dir
    check_layout(elsewhere, 4)
    with pytest.raises(ValueError, match="was profiled with shards: 4"):
        check_layout(elsewhere, 8)
    assert not list((tmp_path / "ray-node").rglob("profiling_layout.json"))
    assert str(here.file_path("profiling_layout.json")) == f"{s3_env}/profiling_layout.json"
    assert here.file_path("profiling_layout.json").exists()
