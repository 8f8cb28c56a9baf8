"""The Parquet + DuckDB warehouse: atomic writes, incremental parts, views, named queries."""

import subprocess
import sys

import duckdb
import pyarrow as pa
import pytest

from pivot_assets.core.warehouse import Warehouse, named_query
from tests.crashes import fail_mid_table_write, kill_mid_table_write


def test_write_table_is_atomic_and_viewable(tmp_path):
    wh = Warehouse(tmp_path)
    wh.write_table("turns", pa.table({"turn_id": ["a", "b"], "domain": ["d", "d"], "action_kind": ["message", "tool_call"]}))
    status = wh.refresh_views()
    con = duckdb.connect(str(wh.duckdb_path), read_only=True)
    assert con.sql("select count(*) from turns").fetchone()[0] == 2
    assert status["action_kind_mix"] == "ok"
    # a named query over a table that does not exist yet is reported, not raised
    assert "trajectories" in status["turns_per_trajectory"].lower() or "does not exist" in status["turns_per_trajectory"]
    con.close()
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_refresh_runs_only_what_changed_and_repairs_what_another_process_did(tmp_path):
    """Within one process, a second refresh over the same tables writes nothing to pivot.duckdb; a new table gets
    its view (and the sql/ views that now bind); a view dropped by another process is made again."""
    wh = Warehouse(tmp_path)
    wh.write_table("turns", pa.table({"turn_id": ["a"], "domain": ["d"], "action_kind": ["message"]}))
    first = wh.refresh_views()
    stamp = wh._duckdb_stamp()
    assert wh.refresh_views() == first and wh._duckdb_stamp() == stamp  # nothing ran: the file is untouched
    assert first["turns_per_trajectory"] != "ok"  # it reads trajectories, not there yet
    wh.write_table("trajectories", pa.table({"trajectory_id": ["A"], "domain": ["d"], "source": ["s"]}))
    second = wh.refresh_views()
    with duckdb.connect(str(wh.duckdb_path)) as con:
        assert con.sql("select count(*) from trajectories").fetchone()[0] == 1
        con.execute("drop view turns")  # another process (or a user) changes the file
    third = wh.refresh_views()
    with duckdb.connect(str(wh.duckdb_path), read_only=True) as con:
        assert con.sql("select count(*) from turns").fetchone()[0] == 1
    assert third == second


def test_failed_write_keeps_the_last_good_table(tmp_path):
    wh = Warehouse(tmp_path)
    wh.write_table("t", pa.table({"x": [1, 2, 3]}))
    fail_mid_table_write(wh)
    assert wh.read_arrow("t").column("x").to_pylist() == [1, 2, 3]
    assert not list(tmp_path.glob(".tmp-*"))


def test_kill_mid_write_leaves_the_last_good_table(tmp_path):
    wh = Warehouse(tmp_path)
    wh.write_table("t", pa.table({"x": [1]}))
    kill_mid_table_write(str(tmp_path))
    assert wh.read_arrow("t").column("x").to_pylist() == [1]
    assert wh.clean_temp_files("t") == 1


def test_parts_table_and_data_version(tmp_path):
    wh = Warehouse(tmp_path)
    assert not wh.exists("rollouts")
    wh.append_part("rollouts", pa.table({"k": [1, 2]}))
    v1 = wh.data_version("rollouts")
    wh.append_part("rollouts", pa.table({"k": [3]}))
    assert wh.data_version("rollouts") != v1
    assert sorted(wh.read_arrow("rollouts").column("k").to_pylist()) == [1, 2, 3]
    wh.refresh_views()
    con = wh.connect(read_only=True)
    assert con.sql("select sum(k) from rollouts").fetchone()[0] == 6
    con.close()


def test_same_content_same_data_version(tmp_path):
    a, b = Warehouse(tmp_path / "a"), Warehouse(tmp_path / "b")
    t = pa.table({"x": [1, 2]})
    a.write_table("t", t)
    b.write_table("t", t)
    assert a.data_version("t") == b.data_version("t")


def test_named_query_and_errors():
    assert "from turns" in named_query("action_kind_mix")
    assert named_query("select 1") == "select 1"
    with pytest.raises(ValueError, match="no query named 'nope'"):
        named_query("nope")


def test_invalid_table_name(tmp_path):
    with pytest.raises(ValueError):
        Warehouse(tmp_path).table_path("bad name; drop")


def test_s3_uris_and_the_state_dir_marker(tmp_path):
    from pivot_assets.core.warehouse import LOCATION_FILE, bind_state_dir, parse_s3_uri

    assert parse_s3_uri("s3://my-bucket/runs/2026") == ("my-bucket", "runs/2026")
    assert parse_s3_uri("s3://my-bucket") == ("my-bucket", "")
    for bad in ("s3://a/x", "s3://Bucket/x", "s3://bucket/x y", "s3://bucket/../x"):
        with pytest.raises(ValueError, match="not an S3 warehouse URI"):
            parse_s3_uri(bad)
    state = bind_state_dir(tmp_path / "state", "s3://my-bucket/runs")
    assert (state / LOCATION_FILE).read_text().strip() == "s3://my-bucket/runs"
    assert not Warehouse(tmp_path / "local").is_remote  # a dir without the marker is a local warehouse


def test_connections_never_auto_install_and_wait_for_the_writer(tmp_path):
    """A second process may be refreshing pivot.duckdb's views: connect waits for its lock, then proceeds."""
    from pivot_assets.core.warehouse import connect_for

    wh = Warehouse(tmp_path)
    wh.write_table("t", pa.table({"x": [1]}))
    wh.refresh_views()
    with connect_for(wh) as con:
        assert con.sql("select current_setting('autoinstall_known_extensions')").fetchone()[0] is False
    holder = subprocess.Popen([sys.executable, "-c",
                               "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('locked', flush=True); "
                               "time.sleep(3)", str(wh.duckdb_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    con = wh.connect(read_only=True)  # blocked by the other process's write lock until it exits
    assert con.sql("select x from t").fetchone()[0] == 1
    con.close()
    holder.wait()
