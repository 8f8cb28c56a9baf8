"""`pivot run` with `warehouse: s3://...` on a real S3 server (SeaweedFS on 127.0.0.1): the same rows as a local
warehouse, a rerun generates nothing, a verifier change re-scores from the cached completions, `pivot sql` and
`pivot check` work, kill -9 mid-write then a rerun gives exactly turns x K, and the credentials appear nowhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from pivot_assets.core.catalog import KEY_COLUMNS
from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from tests.crashes import kill_run_after_first_part

from tests.s3_store import assert_no_credentials

pytestmark = pytest.mark.scenario
VENV_BIN = Path(sys.executable).parent
K = 2
TURNS = 6
PROFILE = "trajectories,turns,rollouts,rollout_rewards,turn_profiles"
PIVOTS = PROFILE + ",pivots_mixed,pivots_adv,pivots_cand,pivot_selection_log"
ROLLOUT_KEY = ["turn_id", "policy_fp", "sampling_fp", "sample_index"]


def config(warehouse: str, model: Path, batch_size: int = 4, verifier: str = "") -> str:
    return (f"warehouse: {warehouse}\nsample: {{n_trajectories: 3, seed: 3}}\n"
            f"policy: {{model: {model}, k: {K}, max_new_tokens: 8, limit_turns: {TURNS}, batch_size: {batch_size}}}\n"
            + verifier)


class Project:
    """A project dir with its own pivot.yaml and DAGSTER_HOME; runs the `pivot` CLI as a user would."""

    def __init__(self, root: Path, text: str):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.write(text)
        self.env = {**os.environ, "DAGSTER_HOME": str(root / "dagster_home"), "PIVOT_LOG_LEVEL": "DEBUG"}
        self.env.pop("PIVOT_CONFIG", None)
        self.output: list[str] = []  # everything every command printed, to grep for credentials

    def write(self, text: str) -> None:
        (self.root / "pivot.yaml").write_text(text)

    def pivot(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(VENV_BIN / "pivot"), *argv], cwd=self.root, env=self.env, capture_output=True,
                              text=True, timeout=900)
        self.output += [proc.stdout, proc.stderr]
        if check:
            assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    def timed_run(self, selection: str) -> float:
        t0 = time.perf_counter()
        self.pivot("run", "--select", selection)
        return time.perf_counter() - t0

    @property
    def warehouse(self) -> Warehouse:
        return Warehouse(load_config(self.root / "pivot.yaml").warehouse_dir)

    def metadata(self, asset: str) -> dict:
        with dg.DagsterInstance.from_config(str(self.root / "dagster_home")) as instance:
            event = instance.get_latest_materialization_event(dg.AssetKey(asset))
            return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def frame(wh: Warehouse, table: str) -> pl.DataFrame:
    """A table in a comparable order; `source` (the input file's path, which names the state dir) left out."""
    df = wh.read(table)
    df = df.drop([c for c in ("source",) if c in df.columns])
    key = [c for c in KEY_COLUMNS.get(table, []) if c in df.columns] or df.columns[:1]
    return df.sort(key)


def rollout_keys(wh: Warehouse) -> list[tuple]:
    if not wh.part_files("rollouts"):
        return []
    return wh.read("rollouts", ROLLOUT_KEY).rows()


def test_s3_warehouse_matches_local_and_reruns_from_cache(tmp_path, s3_env, tiny_model_dir):
    local = Project(tmp_path / "local", config("./wh", tiny_model_dir))
    remote = Project(tmp_path / "remote", config(s3_env, tiny_model_dir))
    local_s = local.timed_run(PIVOTS)
    remote_s = remote.timed_run(PIVOTS)
    print(f"\nsmall run ({PIVOTS}): local {local_s:.1f} s, s3 {remote_s:.1f} s")

    lw, rw = local.warehouse, remote.warehouse
    assert rw.is_remote and rw.tables() == lw.tables()
    assert {"rollouts", "rollout_rewards", "turn_profiles", "pivots_adv", "pivot_selection_log"} <= set(rw.tables())
    for table in lw.tables():
        assert frame(rw, table).equals(frame(lw, table)), table
    keys = rollout_keys(rw)
    assert len(keys) == TURNS * K and len(set(keys)) == len(keys)
    assert not list(rw.root.glob("*.parquet")) and not (rw.root / "rollouts").exists()  # tables live on S3 only

    # a rerun generates and scores nothing; the pivot sets' data versions (ETags) are unchanged
    adv_version = rw.data_version("pivots_adv")
    rerun_s = remote.timed_run(PIVOTS)
    print(f"s3 rerun (all cached): {rerun_s:.1f} s; local rerun (all cached): {local.timed_run(PIVOTS):.1f} s")
    assert remote.metadata("rollouts")["turns_generated"] == 0
    assert remote.metadata("rollout_rewards")["rollouts_scored"] == 0
    assert rw.data_version("pivots_adv") == adv_version
    assert len(rollout_keys(rw)) == TURNS * K

    # a verifier change: stale from scoring down, re-scored from the cached completions, nothing generated
    remote.write(config(s3_env, tiny_model_dir, verifier="verifier: {default: {name: tool_call, text_threshold: 0.2}}\n"))
    stale = {line.split()[0]: line.split()[1] for line in remote.pivot("stale").stdout.splitlines() if " " in line}
    assert stale.get("rollout_rewards") == "STALE" and "rollouts" not in stale
    ran = remote.pivot("run", "--stale").stdout
    materialized = next(line for line in ran.splitlines() if ": materialized " in line).split(": materialized ")[1]
    assert "rollout_rewards" in materialized.split(", ") and "rollouts" not in materialized.split(", ")
    assert remote.metadata("rollout_rewards")["rollouts_scored"] == TURNS * K
    assert len(rollout_keys(rw)) == TURNS * K

    # the CLI over the S3 warehouse: SQL through pivot.duckdb's views, the contracts where the data is
    out = remote.pivot("sql", "select count(*) as n from rollouts", "--format", "json").stdout
    assert json.loads(out.strip()) == {"n": TURNS * K}
    remote.pivot("sql", "pivot_funnel")
    checked = remote.pivot("check", check=False).stdout
    assert "rollouts: PASS" in checked and "turn_profiles: PASS" in checked and "pivots_adv: " in checked
    exported = remote.root / "export" / "pivots_mixed.jsonl"
    remote.pivot("export", "--set", "mixed", "--format", "nemo-gym", "--out", str(exported))
    n_mixed = len(rw.read("pivots_mixed"))
    rows = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(rows) == n_mixed
    for row in rows:  # the profile's per-sample rewards, read from the S3 warehouse's rollout_rewards
        rewards = row["qwen_235b_info"]["rewards"]
        assert len(rewards) == row["pass_rate_total"] and sum(r >= 1.0 for r in rewards) == row["pass_rate_passed"]

    assert_no_credentials(remote.root, texts=remote.output)


def test_kill_9_mid_rollouts_on_s3_then_resume(tmp_path, s3_env, tiny_model_dir):
    project = Project(tmp_path / "p", config(s3_env, tiny_model_dir))
    project.pivot("run", "--select", "trajectories,turns")
    wh = project.warehouse
    # one turn per part (batch_size is a speed knob, not part of the policy identity): room to kill between parts
    project.write(config(s3_env, tiny_model_dir, batch_size=2))
    kill_run_after_first_part([str(VENV_BIN / "pivot"), "run", "--select", "rollouts"],
                              lambda: bool(wh.part_files("rollouts")), cwd=project.root, env=project.env)
    written = len(rollout_keys(wh))
    assert written < TURNS * K, "the run finished before it could be killed: make the test input larger"
    assert written % K == 0  # whole turns only: no part is ever visible half-written
    project.pivot("run", "--select", "rollouts")
    keys = rollout_keys(wh)
    assert len(keys) == TURNS * K and len(set(keys)) == len(keys)
    assert project.metadata("rollouts")["turns_generated"] == TURNS - written // K
    assert_no_credentials(project.root, texts=project.output)
