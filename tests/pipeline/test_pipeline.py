"""The Dagster layer: definitions snapshot, CLI runs recorded in the instance, staleness, one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pivot_jobs.cli import main as pivot

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).resolve().parent / "snapshots" / "definitions.txt"
VENV_BIN = Path(sys.executable).parent


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A fresh project dir with its own DAGSTER_HOME; returns a writer for pivot.yaml."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)

    def write(text: str) -> Path:
        path = tmp_path / "pivot.yaml"
        path.write_text(text)
        return path

    return write


def definitions_listing(defs) -> str:
    graph = defs.resolve_asset_graph()
    lines = []
    for key in graph.toposorted_asset_keys:
        node = graph.get(key)
        deps = ",".join(sorted(k.to_user_string() for k in node.parent_keys))
        lines.append(f"asset {key.to_user_string()} group={node.group_name} deps=[{deps}]")
    for check in sorted(graph.asset_check_keys, key=lambda c: (c.asset_key.to_user_string(), c.name)):
        blocking = graph.get_check_spec(check).blocking
        lines.append(f"check {check.asset_key.to_user_string()}:{check.name} blocking={blocking}")
    for job in sorted(j.name for j in defs.jobs):
        lines.append(f"job {job}")
    return "\n".join(lines) + "\n"


def test_definitions_snapshot(project):
    """The asset graph of the shipped pivot.yaml (regenerate: UPDATE_SNAPSHOTS=1 pytest this test)."""
    from pivot_jobs.definitions import build_definitions

    listing = definitions_listing(build_definitions(REPO / "pivot.yaml"))
    if os.environ.get("UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(listing)
    assert listing == SNAPSHOT.read_text()
    assert "check pivots_adv:data_contract blocking=True" in listing
    assert "check turns:data_contract blocking=False" in listing


def test_building_definitions_imports_no_model_stack(tmp_path):
    """Every `pivot` command builds the definitions: torch, transformers, TRL and Great Expectations (seconds of
    imports) load only in the steps that use them."""
    code = ("import sys; from pivot_jobs.definitions import build_definitions; build_definitions(sys.argv[1]); "
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'datasets', 'great_expectations') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "pivot.yaml")], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "DAGSTER_HOME": str(tmp_path / "dh")}, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_ingest_and_turns_on_shared_data(project, shared_data_dir, capsys):
    """`pivot run` on real NeMo-Gym + tau2 data; the DuckDB file answers with no Python."""
    project(
        f"warehouse: ./wh\ninputs:\n  - path: {shared_data_dir}/tau2-bench/airline_run1.json\n"
        f"  - path: {shared_data_dir}/nemo-gym/resources_servers/workplace_assistant/data/example_rollouts.jsonl\n"
    )
    assert pivot(["run", "--select", "trajectories,turns"]) == 0
    out = capsys.readouterr().out
    assert "materialized quarantine, trajectories, turns" in out
    duck = subprocess.run(
        [str(VENV_BIN / "duckdb"), "wh/pivot.duckdb", "-csv", "-c", "select count(*) from turns"],
        capture_output=True, text=True, check=True,
    )
    n_turns = int(duck.stdout.split()[-1])
    assert n_turns > 500
    # the run is recorded in the instance the UI reads
    import dagster as dg

    instance = dg.DagsterInstance.get()
    assert instance.get_latest_materialization_event(dg.AssetKey("turns")) is not None
    # under the named pipeline job, so the UI's Overview and the job's page list it (not Dagster's anonymous job)
    run = instance.get_runs(limit=1)[0]
    assert run.job_name == "pivot_pipeline"
    assert run.tags[".dagster/repository"] == "__repository__@pivot_curation"  # the job page finds it by this
    assert pivot(["sql", "select count(*) as n from turns", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out.strip()) == {"n": n_turns}


@pytest.mark.scenario
def test_stale_tracks_inputs_and_run_stale_materializes_only_those(project, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    from pivot_assets.ingest.sample_data import write_sample

    write_sample(data / "a.jsonl", n=5, seed=1)
    project("warehouse: ./wh\ninputs:\n  - path: data/*.jsonl\n")
    assert pivot(["run", "--select", "trajectories,turns"]) == 0
    capsys.readouterr()
    assert pivot(["stale"]) == 0
    stale = capsys.readouterr().out
    assert "trajectories" not in stale and "turns " not in stale
    assert "turn_profiles MISSING" in stale

    write_sample(data / "b.jsonl", n=3, seed=2)  # a new input file: ingestion's code version changes
    assert pivot(["stale"]) == 0
    stale_lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("trajectories STALE") for line in stale_lines)

    assert pivot(["run", "--select", "trajectories,turns"]) == 0
    out = capsys.readouterr().out
    assert "materialized quarantine, trajectories, turns" in out
    assert pivot(["sql", "select count(*) as n from trajectories", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out.strip()) == {"n": 8}


@pytest.mark.parametrize(
    "config, argv, expected",
    [
        ("warehouse: ./wh\npolicy: {kk: 1}\n", ["stale"], "config error: "),
        ("warehouse: ./wh\nverifier: {default: {name: tool_cal}}\n", ["stale"],
         "pivot.yaml: verifier.default: unknown verifier 'tool_cal' (known: "),
        ("warehouse: ./wh\ninputs:\n  - path: missing/*.json\n", ["run"], "inputs.0.path: no such file"),
        ("warehouse: ./wh\n", ["run", "--select", "key:nope*"], "matches no asset"),
        ("warehouse: ./wh\n", ["sql", "nope_query"], "run `pivot run` first"),
    ],
)
def test_cli_errors_are_one_line(project, config, argv, expected):
    project(config)
    proc = subprocess.run([str(VENV_BIN / "pivot"), *argv], capture_output=True, text=True)
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert expected in err, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err


def test_workspace_loads_in_dagster(project, tmp_path):
    """`dagster dev` / the UI load definitions.py through workspace.yaml from the repo root."""
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    proc = subprocess.run(
        [str(VENV_BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "DAGSTER_HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "All code locations passed validation" in proc.stderr + proc.stdout


def test_runs_are_labelled_with_the_workspace_location():
    import yaml

    from pivot_jobs import CODE_LOCATION

    workspace = yaml.safe_load((Path(__file__).resolve().parents[2] / "workspace.yaml").read_text())
    assert workspace["load_from"][0]["python_file"]["location_name"] == CODE_LOCATION

