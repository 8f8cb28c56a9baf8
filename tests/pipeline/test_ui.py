"""The UI path: `dagster dev` on the repo's workspace.yaml launches the same definitions; a run launched
through the webserver's GraphQL API (what the UI's buttons call) materializes into the configured warehouse."""

import os
import shutil
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
pytestmark = pytest.mark.scenario


@contextmanager
def serving(command: list[str], env: dict, cwd: Path):
    """A webserver command in its own session, stopped (SIGINT, then SIGKILL) on exit."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def dagster_dev(env: dict, port: int):
    """`dagster dev` on the repo's workspace.yaml on 127.0.0.1:port."""
    return serving(["env", "--default-signal=INT,TERM", str(VENV_BIN / "dagster"), "dev", "-w", "workspace.yaml",
                    "-h", "127.0.0.1", "-p", str(port)], env, REPO)


def _fail_if_gone(server: subprocess.Popen, deadline: float, last: Exception | None, what: str) -> None:
    """Fail at once when the webserver exited, or after the deadline, naming the last error seen."""
    if server.poll() is not None:
        pytest.fail(f"{what}: the webserver exited with {server.returncode} (last error: {last})")
    if time.time() > deadline:
        pytest.fail(f"{what} within 180 s (last error: {last})")


def test_run_launched_through_the_webserver(tmp_path):
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    config = tmp_path / "pivot.yaml"
    config.write_text("warehouse: ./wh\nsample: {n_trajectories: 4, seed: 1}\n")
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PIVOT_CONFIG": str(config), "HF_HUB_OFFLINE": "1"}
    with dagster_dev(env, port) as server:
        client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=30)
        deadline, run_id, last = time.time() + 180, None, None
        while run_id is None:
            _fail_if_gone(server, deadline, last, "dagster dev did not accept a run")
            try:
                run_id = client.submit_job_execution("ingest_job", repository_location_name="pivot_curation")
            except DagsterGraphQLClientError as exc:  # not listening yet, or the location still loading
                last = exc
                time.sleep(2)
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


@pytest.fixture(scope="module")
def served_project(tmp_path_factory):
    """A config outside the repo, one `pivot run --config` of it, then `pivot ui --config` on it: (port, answers of
    the webserver's GraphQL to the timeline's run fields and the workspace's repositories)."""
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

    tmp_path = tmp_path_factory.mktemp("ui")
    project = tmp_path / "project"
    project.mkdir()
    config = project / "my.yaml"
    config.write_text("warehouse: ./wh\nsample: {n_trajectories: 3, seed: 2}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PIVOT_CONFIG")}
    env["HF_HUB_OFFLINE"] = "1"
    pivot = str(VENV_BIN / "pivot")
    run = subprocess.run([pivot, "run", "--config", str(config), "--select", "trajectories"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (project / ".dagster_home").is_dir()
    port = free_port()
    query = ("{ runsOrError(filter: {statuses: [SUCCESS]}) { ... on Runs { results { runId jobName status "
             "repositoryOrigin { repositoryName repositoryLocationName } } } } }")  # the timeline's fields
    with serving([pivot, "ui", "--config", str(config), "--port", str(port)], env, tmp_path) as server:
        client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=30)
        deadline, runs, last = time.time() + 180, None, None
        while runs is None:
            _fail_if_gone(server, deadline, last, "pivot ui did not answer")
            try:
                runs = client._execute(query)["runsOrError"]["results"]
            except DagsterGraphQLClientError as exc:  # not listening yet
                last = exc
                time.sleep(2)
        repos = client._execute("{ repositoriesOrError { ... on RepositoryConnection { nodes { name "
                                "location { name } jobs { name } } } } }")
        yield port, runs, repos


def test_pivot_ui_shows_the_runs_of_pivot_run_with_the_same_config(served_project):
    """A config outside the repo keeps its own instance (<its folder>/.dagster_home); `pivot ui --config` opens
    the webserver on that instance and that config's definitions, so the run `pivot run --config` made is there,
    on the Overview timeline too: the timeline's own query (dagster-webui useRunsForTimeline) returns it with a
    repository origin naming a job of the workspace (the timeline leaves off a run without one)."""
    _, runs, repos = served_project
    assert [(r["jobName"], r["status"]) for r in runs] == [("pivot_pipeline", "SUCCESS")]
    nodes = repos["repositoriesOrError"]["nodes"]
    assert nodes and nodes[0]["location"]["name"] == "pivot_curation"
    assert "pivot_pipeline" in {j["name"] for j in nodes[0]["jobs"]}
    # the timeline's grouping: (repository, location, job) of the run must be a job the workspace holds
    workspace_jobs = {(n["name"], n["location"]["name"], j["name"]) for n in nodes for j in n["jobs"]}
    origin = runs[0]["repositoryOrigin"]
    assert origin is not None, "a run without a repository origin is left off the Overview timeline"
    assert (origin["repositoryName"], origin["repositoryLocationName"], runs[0]["jobName"]) in workspace_jobs


def browser() -> str | None:
    """A headless-capable Chromium on PATH (`make setup-browser` installs Debian's)."""
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def rendered(url: str, chrome: str) -> str:
    """The page's DOM after its scripts ran (the UI's React app fetches its GraphQL and renders), from headless
    Chromium; virtual time lets the page's requests finish without waiting the wall clock."""
    proc = subprocess.run([chrome, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--virtual-time-budget=30000", "--dump-dom", url], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_run_of_pivot_run_is_drawn_on_the_overview_timeline_in_a_browser(served_project):
    """What a user sees: Chromium renders `pivot ui`'s Overview timeline, and the row of the run's job
    (pivot_curation / pivot_pipeline) holds a drawn run (the timeline draws a run as a chunk in its job's row)."""
    import re

    chrome = browser()
    if chrome is None:
        pytest.skip("no Chromium on PATH: `make setup-browser` installs it (apt)")
    port, _, _ = served_project
    dom = rendered(f"http://127.0.0.1:{port}/overview/timeline", chrome)
    row = re.search(r'href="/locations/pivot_curation/jobs/pivot_pipeline".*?(?=href="/locations/|$)', dom, re.S)
    assert row, "no timeline row for pivot_curation / pivot_pipeline in the rendered page"
    assert re.search(r'class="RunTimeline_runChunk__', row.group(0)), "the job's row has no run drawn"
    assert "pivot_pipeline" in rendered(f"http://127.0.0.1:{port}/runs", chrome)  # and on the Runs page


def test_pivot_ui_with_a_bad_config_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: {k: -1}\n")
    proc = subprocess.run([str(VENV_BIN / "pivot"), "ui", "--config", str(bad)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("config error:")
