"""The selection rules (pivots.rule) on handmade profiles: each rule's D_adv, its log reasons and rule column, caps
after the rule, D_cand the size of D_adv; the rule's config errors; and a change of rule re-selects without
re-profiling (only the pivot sets' identity moves); the rules side by side (`pivot sql selection_rules`)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest

from pivot_assets.core.catalog import RULE_COMPARISON_SCHEMA
from pivot_assets.core.config import ConfigError, PivotsSection, load_config
from pivot_assets.core.identity import pivots_version
from pivot_assets.curation.contracts import run_contract
from pivot_assets.curation.selection import REJECT_REASONS, compare_rules, funnel_counts, rejection_counts, select_pivots

from .test_contracts import build_world
from .test_pivot_selection import make_tables, tid

REPO = Path(__file__).resolve().parents[2]
# The mixed turns of test_pivot_selection.SPEC: (id, reward mean, binary variance)
MIXED = {tid("trajA", 2): .5, tid("trajA", 4): .25, tid("trajA", 6): .75, tid("trajB", 4): .125, tid("trajB", 6): .5,
         tid("trajC", 2): .375}


def adv_of(**rule) -> set[str]:
    return set(select_pivots(*make_tables(), PivotsSection(**rule))["pivots_adv"]["turn_id"])


def dropped(result, reason: str) -> set[str]:
    log = result["selection_log"]
    return set(log.filter((pl.col("set") == "adv") & (pl.col("reason") == reason))["turn_id"])


def test_an_unset_rule_is_pivotrl_and_the_log_names_the_rule_in_force():
    profiles, turns = make_tables()
    default, explicit = select_pivots(profiles, turns), select_pivots(profiles, turns, PivotsSection(rule="pivotrl"))
    for name in default:
        assert default[name].equals(explicit[name]), name
    assert default["selection_log"]["rule"].unique().to_list() == ["pivotrl"]
    assert dropped(default, "too_easy") == {tid("trajA", 6)}  # mean .75 > lambda_diff .6


@pytest.mark.parametrize("rule, expected, reason", [
    ({"rule": "band", "band": [0.2, 0.7]}, {t for t, m in MIXED.items() if 0.2 < m < 0.7}, "outside_band"),
    ({"rule": "band", "band": [0.25, 0.5]}, {tid("trajC", 2)}, "outside_band"),  # both ends excluded
    # ranked by variance: .25 (trajA 2), .25 (trajB 6), .234 (trajC 2) hold .734 of 1.219 >= half; two hold .5 < half
    ({"rule": "variance_top_p", "top_p": 0.5}, {tid("trajA", 2), tid("trajB", 6), tid("trajC", 2)}, "below_variance_mass"),
    ({"rule": "variance_top_p", "top_p": 1.0}, set(MIXED), "below_variance_mass"),
    # the first alone: of the two at .25 and mean .5, the lower turn_id
    ({"rule": "variance_top_p", "top_p": 0.01}, {min(tid("trajA", 2), tid("trajB", 6))}, "below_variance_mass"),
    ({"rule": "std_min", "min_std": 0.45}, {t for t, m in MIXED.items() if (m * (1 - m)) ** 0.5 >= 0.45}, "below_min_std"),
    ({"rule": "std_min", "min_std": 0.0}, set(MIXED), "below_min_std"),
])
def test_each_rule_picks_its_adv_set_from_the_mixed_turns_and_logs_the_rest(rule, expected, reason):
    result = select_pivots(*make_tables(), PivotsSection(**rule))
    adv = result["pivots_adv"]
    assert set(adv["turn_id"]) == expected
    assert dropped(result, reason) == set(MIXED) - expected  # in the rule's own words
    assert dropped(result, "zero_variance") == {tid("trajA", 8), tid("trajB", 2)}
    assert set(result["pivots_mixed"]["turn_id"]) == set(MIXED)  # D_mixed is reward_var > 0 whatever the rule
    assert result["pivots_cand"].height == adv.height
    assert adv["selection_rank"].to_list() == list(range(1, adv.height + 1))
    assert result["selection_log"]["rule"].unique().to_list() == [rule["rule"]]
    assert reason in REJECT_REASONS


def test_every_turn_is_accounted_for_once_per_set_under_every_rule():
    for rule in ({"rule": "band"}, {"rule": "variance_top_p"}, {"rule": "std_min"}):
        result = select_pivots(*make_tables(), PivotsSection(**rule, max_per_trajectory=2))
        funnel, log = funnel_counts(result), result["selection_log"]
        for name in ("mixed", "adv", "cand"):
            per_set = log.filter(pl.col("set") == name)
            assert per_set["turn_id"].n_unique() == per_set.height == funnel["turns"], (rule, name)
            assert per_set["kept"].sum() == funnel[name]
            assert per_set.filter(~pl.col("kept"))["reason"].null_count() == 0
        assert funnel["mixed"] >= funnel["adv"]


def test_caps_apply_after_the_rule():
    result = select_pivots(*make_tables(), PivotsSection(rule="band", band=[0.2, 0.7], max_per_trajectory=1))
    # the band keeps trajA 2 and 4, trajB 6, trajC 2; the cap keeps trajA's best-ranked (variance .25 over .1875)
    assert set(result["pivots_adv"]["turn_id"]) == {tid("trajA", 2), tid("trajB", 6), tid("trajC", 2)}
    assert dropped(result, "over_trajectory_cap") == {tid("trajA", 4)}
    assert dropped(result, "outside_band") == {tid("trajA", 6), tid("trajB", 4)}
    quotas = select_pivots(*make_tables(), PivotsSection(rule="std_min", min_std=0.4, domain_quotas={"retail": 1}))
    assert rejection_counts(quotas["selection_log"])[("adv", "over_domain_quota")] == 1
    assert quotas["pivots_adv"].filter(pl.col("domain") == "retail").height == 1
    assert quotas["pivots_cand"].height == quotas["pivots_adv"].height


@pytest.mark.parametrize("pivots, message", [
    ({"rule": "band", "band": [0.7, 0.2]}, "pivots.band: [0.7, 0.2]: the low end must be below the high end"),
    ({"rule": "band", "band": [0.2]}, "pivots.band: List should have at least 2 items"),
    ({"rule": "band", "band": [0.2, 1.5]}, "pivots.band.1: Input should be less than or equal to 1"),
    ({"rule": "variance_top_p", "top_p": 0}, "pivots.top_p: Input should be greater than 0"),
    ({"rule": "variance_top_p", "top_p": 1.5}, "pivots.top_p: Input should be less than or equal to 1"),
    ({"rule": "std_min", "min_std": -0.1}, "pivots.min_std: Input should be greater than or equal to 0"),
    ({"rule": "hardest"}, "pivots.rule: Input should be 'pivotrl', 'band', 'variance_top_p' or 'std_min'"),
])
def test_bad_rule_parameters_are_one_line_errors(pivots, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "pivot.yaml", overrides={"warehouse": str(tmp_path), "pivots": pivots})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_adaptive_profiling_refuses_a_rule_it_cannot_settle(tmp_path):
    overrides = {"warehouse": str(tmp_path), "pivots": {"rule": "variance_top_p"},
                 "profiling": {"adaptive": {"enabled": True}}}
    with pytest.raises(ConfigError, match="pivots.rule variance_top_p with profiling.adaptive.enabled: .*cannot be "
                                          "settled turn by turn") as err:
        load_config(REPO / "pivot.yaml", overrides=overrides)
    assert "\n" not in str(err.value)
    for rule in ("pivotrl", "band", "std_min"):  # settled on their own bounds (profiling/adaptive.AdvBounds)
        load_config(REPO / "pivot.yaml", overrides={**overrides, "pivots": {"rule": rule}})


# -- identity: a change of rule re-selects, never re-profiles ----------------------------------------


def test_the_default_rule_keeps_the_pivot_sets_version_and_idle_parameters_stay_out():
    default = pivots_version(PivotsSection())
    assert default == "63d9166f4e0e4719"  # the version before there was a choice of rule (tests/core/test_identity)
    assert pivots_version(PivotsSection(rule="pivotrl", band=[0.1, 0.9], top_p=0.2, min_std=0.1)) == default
    versions = {pivots_version(PivotsSection(rule=r)) for r in ("band", "variance_top_p", "std_min")}
    assert len(versions) == 3 and default not in versions
    assert pivots_version(PivotsSection(rule="band", band=[0.1, 0.9])) != pivots_version(PivotsSection(rule="band"))
    assert pivots_version(PivotsSection(rule="band", top_p=0.2)) == pivots_version(PivotsSection(rule="band"))


def code_versions(tmp_path, pivots: dict) -> dict[str, str]:
    from pivot_assets.shared import resolve_shared
    from pivot_jobs.definitions import stage_builders

    cfg = load_config(REPO / "pivot.yaml", overrides={"warehouse": str(tmp_path / "wh"), "pivots": pivots})
    shared = resolve_shared(cfg)
    return {spec.key.to_user_string(): spec.code_version for build in stage_builders()
            for d in build(cfg, shared.warehouse, shared.verifiers) for spec in getattr(d, "specs", [])}


def test_a_change_of_rule_moves_only_the_pivot_sets_identity(tmp_path):
    pivotrl = code_versions(tmp_path, {"lambda_diff": 0.7, "rule": "pivotrl"})
    band = code_versions(tmp_path, {"lambda_diff": 0.7, "rule": "band", "band": [0.2, 0.7]})
    for upstream in ("rollouts", "rollout_rewards", "turn_profiles"):
        assert pivotrl[upstream] == band[upstream], upstream
    for pivot_set in ("pivots_mixed", "pivots_adv", "pivots_cand", "pivot_selection_log"):
        assert pivotrl[pivot_set] != band[pivot_set], pivot_set


# -- the D_adv contract checks the rule in force -----------------------------------------------------


def test_the_adv_contract_checks_the_rule_in_force():
    world = build_world()
    related = {"turns": world["turns"]}
    band = {"rule": "band", "band": [0.3, 0.6]}
    in_band = select_pivots(world["turn_profiles"], world["turns"], PivotsSection(**band))["pivots_adv"]
    assert in_band.height >= 1
    assert run_contract("pivots_adv", in_band, related=related, params=band).success
    pivotrl = select_pivots(world["turn_profiles"], world["turns"], PivotsSection(lambda_diff=0.6))["pivots_adv"]
    outside = pivotrl.filter(~((pl.col("reward_mean") > 0.3) & (pl.col("reward_mean") < 0.6))).height
    assert outside >= 1
    result = run_contract("pivots_adv", pivotrl, related=related, params=band)
    failure = next(f for f in result.failures if f["column"] == "reward_mean")
    assert failure["unexpected_count"] == outside and "band" in failure["notes"]
    std_min = {"rule": "std_min", "min_std": 0.45}
    result = run_contract("pivots_adv", pivotrl, related=related, params=std_min)
    low_std = pivotrl.filter(pl.col("reward_std") < 0.45).height
    assert low_std >= 1
    assert next(f for f in result.failures if f["column"] == "reward_std")["unexpected_count"] == low_std


# -- the rules side by side (`pivot sql selection_rules`) ---------------------------------------------


def test_the_rule_comparison_is_each_rules_selected_set():
    profiles, turns = make_tables()
    options = PivotsSection(rule="band", max_per_trajectory=2)
    table = compare_rules(profiles, turns, options)
    assert table.schema == pl.from_arrow(RULE_COMPARISON_SCHEMA.empty_table()).schema
    pivotrl = adv_of(max_per_trajectory=2)
    for row in table.iter_rows(named=True):
        adv = select_pivots(profiles, turns, options.model_copy(update={"rule": row["rule"]}))["pivots_adv"]
        assert row["pivots"] == adv.height and row["in_force"] == (row["rule"] == "band"), row
        assert row["overlap_with_pivotrl"] == len(pivotrl & set(adv["turn_id"]))
        assert row["mean_reward"] == pytest.approx(adv["reward_mean"].mean())
        assert row["mean_variance"] == pytest.approx(adv["reward_var"].mean())
    assert json.loads(table.filter(pl.col("rule") == "band")["parameters"][0]) == {"band": [0.2, 0.8]}
    assert table["rule"].to_list() == ["pivotrl", "band", "variance_top_p", "std_min"]


def test_the_selection_rules_query_reads_the_comparison():
    profiles, turns = make_tables()
    con = duckdb.connect()
    con.register("selection_rule_comparison", compare_rules(profiles, turns).to_arrow())
    con.execute(f"create view selection_rules as {(REPO / 'sql' / 'selection_rules.sql').read_text()}")
    rows = con.execute("select rule, in_force, pivots, overlap_with_pivotrl, overlap_share from selection_rules").fetchall()
    assert [r[0] for r in rows] == ["pivotrl", "band", "variance_top_p", "std_min"]
    assert rows[0][1:] == (True, 5, 5, 1.0)
