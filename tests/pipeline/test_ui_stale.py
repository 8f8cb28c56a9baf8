"""After a verifier change and "Reload definitions", the UI shows the whole chain below scoring as unsynced, and
one launch of the unsynced assets (what "Materialize unsynced" sends) reruns it once, generating nothing.

Driven through the webserver's GraphQL API, as the UI does: reloadRepositoryLocation, assetNodes.staleStatus,
launchPipelineExecution on the implicit asset job with the stale keys.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.pipeline.test_ui import dagster_dev
from tests.ports import free_port

VENV_BIN = Path(sys.executable).parent
pytestmark = pytest.mark.scenario
LOCATION = "pivot_curation"
CONFIG = """warehouse: ./wh
sample: {{n_trajectories: 4, seed: 1}}
policy: {{model: {model}, k: 2, max_new_tokens: 8}}
verifier:
  default: {{name: tool_call, text_threshold: {threshold}}}
"""
PROFILED = "trajectories,turns,rollouts,rollout_rewards,turn_profiles,pivots_adv,pivot_dataset,pivot_nemo_gym"
CHAIN = {"rollout_rewards", "turn_profiles", "pivots_mixed", "pivots_adv", "pivots_cand", "pivot_selection_log",
         "pivot_dataset", "pivot_nemo_gym"}


def _gql(client, query: str, variables: dict | None = None) -> dict:
    return client._execute(query, variables or {})


def _stale_status(client) -> dict[str, str]:
    data = _gql(client, "query { assetNodes { assetKey { path } staleStatus } }")
    return {"/".join(n["assetKey"]["path"]): n["staleStatus"] for n in data["assetNodes"]}


def _launch(client, keys: list[str]) -> str:
    mutation = """mutation($p: ExecutionParams!) { launchPipelineExecution(executionParams: $p) {
        __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
        ... on InvalidSubsetError { message } ... on RunConfigValidationInvalid { errors { message } } } }"""
    params = {"selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                           "pipelineName": "__ASSET_JOB", "assetSelection": [{"path": [k]} for k in keys]},
              "mode": "default", "executionMetadata": {}}
    result = _gql(client, mutation, {"p": params})["launchPipelineExecution"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return result["run"]["runId"]


def _materialized(client, run_id: str) -> list[str]:
    query = """query($id: ID!) { logsForRun(runId: $id) { __typename ... on EventConnection {
        events { __typename ... on MaterializationEvent { assetKey { path } } } } } }"""
    events = _gql(client, query, {"id": run_id})["logsForRun"]["events"]
    return ["/".join(e["assetKey"]["path"]) for e in events if e["__typename"] == "MaterializationEvent"]


def _rollouts(wh: Path) -> int:
    return duckdb.sql(f"select count(*) from read_parquet('{wh / 'rollouts' / 'part-*.parquet'}')").fetchone()[0]


def test_one_launch_of_the_unsynced_assets_reruns_the_stale_chain_once(tmp_path, tiny_model_dir):
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    config = tmp_path / "pivot.yaml"
    config.write_text(CONFIG.format(threshold=0.5, model=tiny_model_dir))
    env = {**os.environ, "DAGSTER_HOME": str(home), "PIVOT_CONFIG": str(config), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(VENV_BIN / "pivot"), "run", "--select", PROFILED], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rollouts_before = _rollouts(tmp_path / "wh")

    port = free_port()
    with dagster_dev(env, port):
        client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=60)
        deadline, before, last = time.time() + 180, {}, None
        while not before:  # until the webserver answers with the assets' statuses
            if time.time() > deadline:
                pytest.fail(f"dagster dev gave no asset status within 180 s (last: {last!r})")
            try:
                before = _stale_status(client)
            except DagsterGraphQLClientError as exc:  # not up yet (connection refused, or a server error while loading)
                last = exc
            if not before:
                time.sleep(1)
        assert {k for k, v in before.items() if v == "STALE"} == set(), before

        config.write_text(CONFIG.format(threshold=0.7, model=tiny_model_dir))  # the verifier changes ...
        reload = _gql(client, f'mutation {{ reloadRepositoryLocation(repositoryLocationName: "{LOCATION}") '
                              "{ __typename } }")  # ... and the user clicks "Reload definitions"
        assert reload["reloadRepositoryLocation"]["__typename"] == "WorkspaceLocationEntry", reload
        after = _stale_status(client)
        stale = {k for k, v in after.items() if v == "STALE"}
        assert stale == CHAIN, after  # every affected asset shows before the click, nothing else
        missing = {k for k, v in after.items() if v == "MISSING"}  # never materialized: not part of the click
        assert {"sft_policy", "grpo_run", "pivot_eval"} <= missing and not missing & CHAIN, after

        run_id = _launch(client, sorted(stale))
        status = None
        while time.time() < deadline + 300:
            status = client.get_run_status(run_id).value
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            time.sleep(2)
        assert status == "SUCCESS", status
        materialized = _materialized(client, run_id)
        assert sorted(materialized) == sorted(CHAIN), materialized  # each once, and only the chain
        assert _rollouts(tmp_path / "wh") == rollouts_before  # nothing generated
        final = _stale_status(client)
        assert {k for k, v in final.items() if v == "STALE"} == set(), final
