"""Pivot rows that arrive profiled: NeMo-Gym pivot rows (this project's export, NVIDIA's released shape) ingested
with their profile as `imported_profiles`, selected from under pivots.profile_source: imported, with nothing
sampled.

The round trip runs through `pivot run` and `pivot export` on the built-in sample: warehouse A profiles it with the
tiny random-weight policy (tests/tiny_model.py) and a graded verifier (continuous rewards: mixed turns), and exports
every profiled candidate (cand_size over the pool: D_cand is every candidate) as NeMo-Gym rows; warehouse B ingests
that file as imported profiles and selects from them. Matched by the rows' turn ids (metadata.turn_id), B has A's
pass rates and A's D_mixed, D_adv and D_cand's seeded draw, with no profiling asset run, no rollout written and a
policy.model that does not exist (nothing loads a policy)."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from pivot_assets.core.config import PivotsSection
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.curation.selection import select_pivots
from pivot_assets.ingest.formats import RawRecord, ingest_record
from pivot_assets.ingest.formats.profiles import row_profile
from pivot_assets.ingest.formats.records import RecordError
from pivot_jobs.cli import main as pivot

pytestmark = pytest.mark.scenario
LAMBDA = 0.3
SAMPLED = f"""
warehouse: ./wh
sample: {{n_trajectories: 4, seed: 3}}
policy: {{backend: transformers, model: MODEL, k: 4, max_new_tokens: 8, batch_size: 4}}
verifier:
  default: {{name: string_similarity, graded: true, facts: ignore}}
pivots: {{lambda_diff: {LAMBDA}, cand_size: 100000}}
runtime: {{workers: 1, threads: 1}}
"""
IMPORTED = f"""
warehouse: ./wh
inputs: [{{path: INPUT}}]
policy: {{backend: transformers, model: MODEL, k: 4, max_new_tokens: 8, batch_size: 4, limit_turns: LIMIT}}
verifier:
  default: {{name: string_similarity, graded: true, facts: ignore}}
pivots: {{lambda_diff: {LAMBDA}, profile_source: SOURCE}}
runtime: {{workers: 1, threads: 1}}
"""
PROFILING = ("rollouts", "rollout_rewards", "turn_profiles")


def materialized(home: Path, asset: str) -> list[dict]:
    """The metadata of every materialization of `asset` in the Dagster instance at `home`."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.fetch_materializations(dg.AssetKey(asset), limit=100).records
        return [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records]


def run_in(root: Path, monkeypatch, *argv: str) -> None:
    monkeypatch.chdir(root)
    monkeypatch.setenv("DAGSTER_HOME", str(root / "dagster_home"))
    (root / "dagster_home").mkdir(exist_ok=True)
    assert pivot(list(argv)) == 0


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory, tiny_model_dir):
    """(A's warehouse, the exported file, B's root) after A profiled and exported and B selected from the file."""
    with pytest.MonkeyPatch.context() as mp:
        a = tmp_path_factory.mktemp("sampled")
        (a / "pivot.yaml").write_text(SAMPLED.replace("MODEL", str(tiny_model_dir)))
        run_in(a, mp, "run", "--select", "*pivots_cand")
        exported = a / "every_candidate.jsonl"
        run_in(a, mp, "export", "--set", "cand", "--format", "nemo-gym", "--out", str(exported))
        b = tmp_path_factory.mktemp("imported")
        # a policy that does not exist: the run passes only if nothing checks, loads or samples it
        (b / "pivot.yaml").write_text(imported_config(b / "no-such-policy", exported, "imported"))
        run_in(b, mp, "run", "--select", "*pivot_nemo_gym")
        run_in(b, mp, "check")
        yield Warehouse(a / "wh"), exported, b


def imported_config(model: Path, exported: Path, source: str, limit_turns: int | None = None) -> str:
    return (IMPORTED.replace("MODEL", str(model)).replace("INPUT", str(exported)).replace("SOURCE", source)
            .replace("LIMIT", "null" if limit_turns is None else str(limit_turns)))


def by_source_turn(wh: Warehouse, table: str) -> pl.DataFrame:
    return wh.read(table).filter(pl.col("source_turn_id").is_not_null())


def test_the_export_holds_every_profiled_candidate(round_trip):
    a, exported, _ = round_trip
    rows = [json.loads(line) for line in exported.read_text().splitlines()]
    profiles = a.read("turn_profiles")
    assert len(rows) == profiles.height > 0
    assert {r["metadata"]["turn_id"] for r in rows} == set(profiles["turn_id"])


def test_imported_profiles_have_the_exported_pass_rates(round_trip):
    a, exported, b = round_trip
    sampled = a.read("turn_profiles")
    imported = Warehouse(b / "wh").read("imported_profiles")
    assert imported.height == sampled.height
    assert imported["source_turn_id"].null_count() == 0
    assert set(imported["profile_source"]) == {"imported"} and set(imported["model"]) == {"qwen_235b"}
    assert set(imported["policy_fp"]) == {"imported:qwen_235b"}
    from pivot_assets.ingest.imported_profiles import file_fingerprint

    assert set(imported["source_fp"]) == {file_fingerprint(exported)} and set(imported["source"]) == {str(exported)}
    joined = sampled.join(imported, left_on="turn_id", right_on="source_turn_id", suffix="_imported")
    assert joined.height == sampled.height
    for column in ("k", "n_pass"):
        assert joined[column].to_list() == joined[f"{column}_imported"].to_list(), column
    for column in ("reward_mean", "reward_var", "reward_std"):
        assert joined[column].to_list() == pytest.approx(joined[f"{column}_imported"].to_list(), abs=1e-12), column
    # every sample's reward came along (the profile object's `rewards`)
    assert all(len(r) == k for r, k in zip(joined["rewards"].to_list(), joined["k"].to_list()))


def test_the_pivot_sets_match_by_the_rows_turn_ids(round_trip):
    a, _, b = round_trip
    wh_b = Warehouse(b / "wh")
    expected = select_pivots(a.read("turn_profiles"), a.read("turns"), PivotsSection(lambda_diff=LAMBDA))
    assert 0 < expected["pivots_adv"].height < expected["pivots_mixed"].height, "resize the test: no choice made"
    for table in ("pivots_mixed", "pivots_adv", "pivots_cand"):
        got = by_source_turn(wh_b, table)
        assert got.height == wh_b.read(table).height, table  # nothing selected that the file did not profile
        assert set(got["source_turn_id"]) == set(expected[table]["turn_id"]), table
    log = wh_b.read("pivot_selection_log")
    assert log.filter(pl.col("reason") == "not_profiled").height > 0  # the rows' earlier turns: no profile, logged


def test_nothing_was_sampled_and_no_engine_started(round_trip):
    _, _, b = round_trip
    home = b / "dagster_home"
    for asset in PROFILING:
        assert materialized(home, asset) == [], asset
    wh = Warehouse(b / "wh")
    assert not any(wh.exists(t) for t in PROFILING)
    (meta,) = materialized(home, "imported_profiles")
    assert meta["profiles"] == wh.read("imported_profiles").height and meta["duplicate_rows"] == 0
    # the export of B's D_adv carries the imported profile: its k, pass counts and per-sample rewards
    rows = [json.loads(line) for line in (b / "wh" / "exports" / "pivots_adv.jsonl").read_text().splitlines()]
    adv = wh.read("pivots_adv")
    assert len(rows) == adv.height and all(len(r["qwen_235b_info"]["rewards"]) == r["pass_rate_total"] for r in rows)


def test_the_hf_export_of_imported_pivots_loads_with_their_profile(round_trip, tmp_path):
    from datasets import load_from_disk

    _, _, b = round_trip
    with pytest.MonkeyPatch.context() as mp:
        run_in(b, mp, "export", "--set", "adv", "--format", "hf", "--out", str(tmp_path / "adv"))
    rows = load_from_disk(str(tmp_path / "adv")).to_list()
    adv = Warehouse(b / "wh").read("pivots_adv")
    assert sorted(r["turn_id"] for r in rows) == sorted(adv["turn_id"])
    assert {r["policy_fp"] for r in rows} == {"imported:qwen_235b"} and all(r["n_distinct_actions"] is None for r in rows)
    assert sorted((r["k"], r["n_pass"]) for r in rows) == sorted(zip(adv["k"], adv["n_pass"]))


def test_the_sql_views_read_imported_profiles(round_trip, capsys):
    _, _, b = round_trip
    with pytest.MonkeyPatch.context() as mp:
        capsys.readouterr()
        run_in(b, mp, "sql", "imported_pass_rates", "--format", "json")
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    wh = Warehouse(b / "wh")
    (row,) = rows
    assert row["model"] == "qwen_235b" and row["turns"] == wh.read("imported_profiles").height
    assert row["adv_pivots"] == wh.read("pivots_adv").height


def test_switching_the_profile_source_reselects_without_sampling(round_trip, tiny_model_dir, tmp_path):
    """B also profiles a few turns itself (a turn with both profiles), then switches source both ways: each
    `pivot run --stale` re-selects and never generates or scores again."""
    _, exported, b = round_trip
    import shutil

    root = tmp_path / "b"
    shutil.copytree(b, root)
    config = root / "pivot.yaml"
    config.write_text(imported_config(tiny_model_dir, exported, "imported", limit_turns=4))
    with pytest.MonkeyPatch.context() as mp:
        run_in(root, mp, "run", "--select", ",".join(PROFILING))
        imported_adv = Warehouse(root / "wh").read("pivots_adv")
        rollout_parts = sorted((root / "wh" / "rollouts").rglob("*.parquet"))
        assert rollout_parts
        config.write_text(imported_config(tiny_model_dir, exported, "sampled", limit_turns=4))
        run_in(root, mp, "run", "--stale")
        wh = Warehouse(root / "wh")
        sampled_turns = set(wh.read("turn_profiles")["turn_id"])
        assert set(wh.read("pivots_mixed")["turn_id"]) <= sampled_turns
        assert not any(fp.startswith("imported") for fp in wh.read("pivots_mixed")["policy_fp"])
        assert set(wh.read("pivot_selection_log")["rule"]) == {"pivotrl"}
        config.write_text(imported_config(tiny_model_dir, exported, "imported", limit_turns=4))
        run_in(root, mp, "run", "--stale")
    assert sorted((root / "wh" / "rollouts").rglob("*.parquet")) == rollout_parts
    home = root / "dagster_home"
    assert len(materialized(home, "rollouts")) == 1 and len(materialized(home, "rollout_rewards")) == 1
    assert len(materialized(home, "pivots_adv")) == 3  # B's selection, then one per switch
    assert Warehouse(root / "wh").read("pivots_adv").equals(imported_adv)
    both = sampled_turns & set(Warehouse(root / "wh").read("imported_profiles")["turn_id"])
    assert both, "no turn with both profiles: resize limit_turns"


# -- rows of NVIDIA's released shape, and bad rows ---------------------------------------------------

NVIDIA_ROW = {  # Conversational-Tool-Use-Pivot-v1's keys: the profile object holds no per-sample rewards
    "responses_create_params": {
        "input": [{"role": "system", "content": "You are a shop assistant."},
                  {"role": "user", "content": "Where is order 42?"}],
        "tools": [{"type": "function", "name": "get_order", "description": "Look an order up",
                   "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}]},
    "expected_action": {"type": "function_call", "name": "get_order", "arguments": "{\"order_id\": \"42\"}"},
    "agent_ref": {"type": "responses_api_agents", "name": "single_step_tool_use_with_argument_comparison_simple_agent"},
    "pass_rate": 0.375, "pass_rate_total": 16, "pass_rate_passed": 6,
    "qwen_235b_info": {"reward_mean": 0.375, "reward_std": 0.4841229182759271, "reward_var": 0.234375},
}


def test_a_row_of_nvidias_released_shape_ingests_with_its_profile(tmp_path, monkeypatch):
    rows = tmp_path / "pivots.jsonl"
    rows.write_text(json.dumps(NVIDIA_ROW) + "\n")
    (tmp_path / "pivot.yaml").write_text(f"warehouse: ./wh\ninputs: [{{path: {rows}}}]\n"
                                         "pivots: {profile_source: imported, lambda_diff: 0.5}\n")
    run_in(tmp_path, monkeypatch, "run", "--select", "*pivots_adv")
    wh = Warehouse(tmp_path / "wh")
    (profile,) = wh.read("imported_profiles").to_dicts()
    assert (profile["k"], profile["n_pass"], profile["reward_mean"]) == (16, 6, 0.375)
    assert profile["reward_var"] == 0.234375 and profile["rewards"] is None and profile["source_turn_id"] is None
    (turn,) = wh.read("turns").filter(pl.col("turn_id") == profile["turn_id"]).to_dicts()
    assert turn["message_index"] == 2 and turn["action_kind"] == "tool_call"
    assert wh.read("pivots_adv")["turn_id"].to_list() == [profile["turn_id"]]


@pytest.mark.parametrize("change, reason", [
    ({"pass_rate": 1.5}, "bad_profile: pass_rate is 1.5, outside [0, 1]"),
    ({"pass_rate_passed": 17}, "bad_profile: pass_rate_passed 17 > pass_rate_total 16"),
    ({"pass_rate_total": "16"}, "bad_profile: pass_rate_total is '16', expected an integer >= 1"),
    ({"pass_rate": 0.5}, "bad_profile: pass_rate 0.5 is not pass_rate_passed / pass_rate_total = 6/16"),
    ({"qwen_235b_info": {"reward_mean": 0.375, "reward_var": 0.3}}, "bad_profile: reward_var 0.3 outside [0, 0.25] (the variance of [0, 1] rewards)"),
    ({"qwen_235b_info": {"rewards": [1, 0]}}, "bad_profile: 2 rewards but pass_rate_total 16"),
    ({"qwen_235b_info": "high"}, "bad_profile: qwen_235b_info is a str, expected an object"),
    ({"pass_rate_total": None, "pass_rate": None, "pass_rate_passed": 6},
     "bad_profile: no sample count: pass_rate_total is missing and there are no rewards"),
])
def test_a_malformed_profile_quarantines_the_row_with_its_reason(change, reason, tmp_path):
    row = {**NVIDIA_ROW, **change}
    with pytest.raises(RecordError) as err:
        row_profile(row)
    assert str(err.value) == reason
    kind, quarantined = ingest_record(RawRecord(source="pivots.jsonl", record=0, value=row, raw=json.dumps(row)))
    assert (kind, quarantined["reason"]) == ("quarantine", reason)


def test_a_bad_row_is_quarantined_by_the_run_and_the_good_one_imported(tmp_path, monkeypatch):
    rows = tmp_path / "pivots.jsonl"
    bad = {**NVIDIA_ROW, "pass_rate_passed": 17, "expected_action": {**NVIDIA_ROW["expected_action"], "name": "find"}}
    rows.write_text(json.dumps(NVIDIA_ROW) + "\n" + json.dumps(bad) + "\n")
    (tmp_path / "pivot.yaml").write_text(f"warehouse: ./wh\ninputs: [{{path: {rows}}}]\n"
                                         "pivots: {profile_source: imported}\n")
    run_in(tmp_path, monkeypatch, "run", "--select", "quarantine,imported_profiles")
    wh = Warehouse(tmp_path / "wh")
    assert wh.read("quarantine").select("record", "reason").to_dicts() == [
        {"record": 1, "reason": "bad_profile: pass_rate_passed 17 > pass_rate_total 16"}]
    assert wh.read("imported_profiles").height == wh.read("trajectories").height == 1
    (meta,) = materialized(tmp_path / "dagster_home", "imported_profiles")
    assert meta["quarantined_rows"] == 1


def test_rows_profiled_by_two_models_are_refused_in_one_line(tmp_path, monkeypatch, capsys):
    rows = tmp_path / "pivots.jsonl"
    other = {k: v for k, v in NVIDIA_ROW.items() if k != "qwen_235b_info"}
    other = {**other, "llama_70b_info": NVIDIA_ROW["qwen_235b_info"],
             "expected_action": {**NVIDIA_ROW["expected_action"], "name": "find"}}
    rows.write_text(json.dumps(NVIDIA_ROW) + "\n" + json.dumps(other) + "\n")
    (tmp_path / "pivot.yaml").write_text(f"warehouse: ./wh\ninputs: [{{path: {rows}}}]\n"
                                         "pivots: {profile_source: imported}\n")
    monkeypatch.chdir(tmp_path)
    assert pivot(["run", "--select", "*pivots_adv"]) == 1
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert error == [("error: run failed: pivot_sets: ValueError: imported_profiles holds the profiles of 2 models "
                      "(imported:llama_70b, imported:qwen_235b): selection takes one model's; give the inputs of one "
                      "model")], error


def test_an_unprofiled_row_has_no_profile():
    assert row_profile({k: v for k, v in NVIDIA_ROW.items() if not k.startswith(("pass_rate", "qwen"))}) is None
    assert row_profile({**NVIDIA_ROW, "pass_rate": None, "pass_rate_total": None, "pass_rate_passed": None,
                        "qwen_235b_info": {"rewards": None, "reward_mean": None}}) is None
