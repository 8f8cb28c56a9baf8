"""The UI path: `dagster dev` on the repo's workspace.yaml launches the same definitions; a run launched
through the webserver's GraphQL API (what the UI's buttons call) materializes into the configured warehouse."""

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


@contextmanager
def dagster_dev(env: dict, port: int):
    """`dagster dev` on the repo's workspace.yaml on 127.0.0.1:port, stopped (SIGINT, then SIGKILL) on exit."""
    proc = subprocess.Popen(
        ["env", "--default-signal=INT,TERM", str(VENV_BIN / "dagster"), "dev", "-w", "workspace.yaml",
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_run_launched_through_the_webserver(tmp_path):
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    config = tmp_path / "pivot.yaml"
    config.write_text("warehouse: ./wh\nsample: {n_trajectories: 4, seed: 1}\n")
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PIVOT_CONFIG": str(config), "HF_HUB_OFFLINE": "1"}
    with dagster_dev(env, port):
        client = None
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=30)
                run_id = client.submit_job_execution("ingest_job", repository_location_name="pivot_curation")
                break
            except (DagsterGraphQLClientError, Exception):
                time.sleep(2)
        else:
            pytest.fail("dagster dev did not accept a run within 180 s")
        status = None
        while time.time() < deadline + 120:
            status = client.get_run_status(run_id).value
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            time.sleep(2)
        assert status == "SUCCESS", status
        import duckdb

        con = duckdb.connect(str(tmp_path / "wh" / "pivot.duckdb"), read_only=True)
        assert con.sql("select count(*) from trajectories").fetchone()[0] == 4
        assert con.sql("select count(*) from turns").fetchone()[0] > 4
        con.close()
