"""The pivot sets as Dagster assets: the funnel adds up in SQL, and a corrupted upstream table makes the
blocking data contract fail so the downstream asset is not materialized."""


import shutil
from pathlib import Path

import dagster as dg
import duckdb
import polars as pl
import pyarrow as pa
import pytest

from pivot_jobs.cli import main as pivot
from pivot_jobs.definitions import build_definitions
from pivot_jobs.runner import run_assets
from pivot_assets.core.warehouse import Warehouse
from tests.projects import ingested_sample

pytestmark = pytest.mark.scenario  # Dagster runs of the pivot sets with their contracts, ~2-8 s each
PIVOT_ASSETS = ["pivots_mixed", "pivots_adv", "pivots_cand", "pivot_selection_log", "pivot_dataset"]


CONFIG = "warehouse: ./wh\nsample: {n_trajectories: 12, seed: 5}\npolicy: {model: embedded}\ntraining: {init: reference}\n"


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> Path:
    """The embedded sample's trajectories and turns, ingested once for the module; each test copies the warehouse
    (a moved warehouse reads the same)."""
    with ingested_sample(tmp_path_factory.mktemp("ingested"), CONFIG) as root:
        return root / "wh"


@pytest.fixture
def warehouse(ingested, tmp_path, monkeypatch):
    """A copy of the ingested warehouse (real turns) with hand-made profiles: K=4 binary rewards per turn."""
    (tmp_path / "dagster_home").mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pivot.yaml").write_text(CONFIG)
    shutil.copytree(ingested, tmp_path / "wh")
    wh = Warehouse(tmp_path / "wh")
    turns = wh.read("turns").sort("turn_id").to_dicts()
    write_profiles(wh, turns)
    return wh, turns


def write_profiles(wh: Warehouse, turns: list[dict], mutate=None) -> None:
    k = 4
    rewards, profiles = [], []
    for i, t in enumerate(turns):
        n_pass = i % (k + 1)  # 0..4 passes: all-fail, mixed and all-pass turns
        rs = [1.0] * n_pass + [0.0] * (k - n_pass)
        for s, r in enumerate(rs):
            rewards.append({"turn_id": t["turn_id"], "policy_fp": "p", "sampling_fp": "s", "sample_index": s,
                            "verifier_fp": "v", "domain": t["domain"], "reward": r, "reason": "OK" if r else "TEXT_DIFFERENT",
                            "detail": "", "action": None})
        mean = n_pass / k
        profiles.append({"turn_id": t["turn_id"], "trajectory_id": t["trajectory_id"], "domain": t["domain"],
                         "policy_fp": "p", "sampling_fp": "s", "verifier_fp": "v", "k": k, "reward_mean": mean,
                         "reward_var": mean * (1 - mean), "reward_std": (mean * (1 - mean)) ** 0.5,
                         "n_pass": n_pass, "n_distinct_actions": 2})
    if mutate:
        profiles = mutate(profiles)
    wh.write_table("rollout_rewards", pa.Table.from_pylist(rewards))
    wh.write_table("turn_profiles", pa.Table.from_pylist(profiles))
    wh.refresh_views()


def materialize(wh):
    defs = build_definitions("pivot.yaml")
    report = run_assets(defs, [dg.AssetKey(a) for a in PIVOT_ASSETS], dg.DagsterInstance.get())
    return report


def test_pivot_sets_satisfy_their_definitions_and_reconcile_with_the_funnel(warehouse):
    wh, turns = warehouse
    report = materialize(wh)
    assert report.success and not report.failed_checks, report
    assert set(report.materialized) == set(PIVOT_ASSETS)
    con = duckdb.connect(str(wh.duckdb_path), read_only=True)
    assert con.sql("select count(*) from pivots_adv where not (reward_var > 0 and reward_mean <= 0.6)").fetchone()[0] == 0
    assert con.sql("select count(*) from pivots_mixed where not (reward_var > 0)").fetchone()[0] == 0
    n_mixed = sum(1 for i in range(len(turns)) if i % 5 in (1, 2, 3))
    n_adv = sum(1 for i in range(len(turns)) if i % 5 in (1, 2))
    funnel = dict(con.sql("select stage, turns from pivot_funnel").fetchall())
    assert funnel == {"turns": len(turns), "prompt_too_long": 0, "profiled": len(turns), "mixed": n_mixed, "adv": n_adv,
                      "cand": n_adv}
    # every rejected turn is written with its reason
    log = dict(con.sql("select reason, count(*) from pivot_selection_log where set = 'adv' and not kept group by 1").fetchall())
    assert sum(log.values()) == len(turns) - n_adv
    con.close()


@pytest.mark.parametrize(
    "name, mutate, column",
    [
        ("reward of 2.0", lambda ps: [{**p, "reward_mean": 2.0} if i == 1 else p for i, p in enumerate(ps)], "reward_mean"),
        ("variance inconsistent with the mean", lambda ps: [{**p, "reward_var": 0.2} if i == 1 else p for i, p in enumerate(ps)],
         "std_gap"),
    ],
)
def test_corrupted_profiles_fail_the_blocking_check_and_stop_downstream(warehouse, name, mutate, column):
    wh, turns = warehouse
    write_profiles(wh, turns, mutate)
    report = materialize(wh)
    failed = [c for c in report.failed_checks if c.startswith("pivots_mixed:data_contract: ")]
    assert failed, (name, report)
    # the run's error names the expectation, the column and one offending row (no separate `pivot check` needed)
    assert f"expect_column_values_to_be_between on {column}" in failed[0] and "e.g. {" in failed[0], failed[0]
    assert turns[1]["turn_id"] in failed[0], failed[0]
    # the blocking checks stop everything below the broken sets: the training export is not written
    assert "pivot_dataset" not in report.materialized and "pivot_nemo_gym" not in report.materialized, report
    record = dg.DagsterInstance.get().event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey("pivots_mixed"), "data_contract")]
    )
    assert record  # recorded for the UI


def test_profile_of_an_unknown_turn_is_logged_not_selected(warehouse):
    wh, turns = warehouse
    write_profiles(wh, turns, lambda ps: ps + [{**ps[1], "turn_id": "0000000000000000"}])
    assert materialize(wh).success
    con = duckdb.connect(str(wh.duckdb_path), read_only=True)
    assert con.sql("select count(*) from pivots_mixed where turn_id = '0000000000000000'").fetchone()[0] == 0
    reasons = {r[0] for r in con.sql("select reason from pivot_selection_log where turn_id = '0000000000000000'").fetchall()}
    assert reasons == {"turn_missing"}
    con.close()


def test_duplicated_profile_key_stops_selection_with_a_clear_error(warehouse):
    wh, turns = warehouse
    write_profiles(wh, turns, lambda ps: ps + [ps[1]])
    report = materialize(wh)
    assert not report.success and "duplicated turn_id" in report.error
    assert not set(report.materialized) & set(PIVOT_ASSETS)


def run_contract_check_only(table: str):
    defs = build_definitions("pivot.yaml")
    check = dg.AssetCheckKey(dg.AssetKey(table), "data_contract")
    checks_only = dg.Definitions(
        assets=defs.assets, asset_checks=defs.asset_checks, resources=defs.resources,
        jobs=[dg.define_asset_job("contract_only", selection=dg.AssetSelection.checks(check))],
    )
    result = checks_only.resolve_job_def("contract_only").execute_in_process(
        instance=dg.DagsterInstance.get(), raise_on_error=False
    )
    return [e.asset_check_evaluation_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]


def test_duplicated_pivot_row_fails_the_contract_check(warehouse):
    """A pivot set corrupted after materialization: its Dagster check (and `pivot check`) fails."""
    wh, turns = warehouse
    assert materialize(wh).success
    table = wh.read("pivots_mixed")
    wh.write_table("pivots_mixed", pa.concat_tables([table.to_arrow(), table.head(1).to_arrow()]))
    evaluations = run_contract_check_only("pivots_mixed")
    assert len(evaluations) == 1 and not evaluations[0].passed
    assert "compound_columns_to_be_unique" in evaluations[0].description
    assert pivot(["check", "pivots_mixed"]) == 1


def test_pivot_whose_turn_is_missing_fails_the_contract_check(warehouse):
    wh, turns = warehouse
    assert materialize(wh).success
    gone = wh.read("pivots_adv")["turn_id"][0]
    wh.write_table("turns", wh.read("turns").filter(pl.col("turn_id") != gone).to_arrow())
    evaluations = run_contract_check_only("pivots_adv")
    assert len(evaluations) == 1 and not evaluations[0].passed
    assert "turn_in_turns" in evaluations[0].description, evaluations[0].description
