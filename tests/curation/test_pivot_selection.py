"""Pivot selection on small handmade profiles: set definitions, ranking, caps, quotas, sampling, funnel."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest

from pivot_assets.core.catalog import SKIPPED_TURNS, SKIPPED_TURNS_SCHEMA
from pivot_assets.core.config import PivotsSection
from pivot_assets.curation.selection import funnel_counts, rejection_counts, select_pivots
from pivot_assets.core.ids import canonical_json, turn_id

# (trajectory, domain, message_index, k, rewards as n_pass out of k -> mean, binary variance)
SPEC = [
    ("trajA", "airline", 2, 8, 4),  # mean .5   var .25   -> mixed, adv
    ("trajA", "airline", 4, 8, 2),  # mean .25  var .1875 -> mixed, adv
    ("trajA", "airline", 6, 8, 6),  # mean .75  var .1875 -> mixed only (too easy)
    ("trajA", "airline", 8, 8, 8),  # mean 1    var 0     -> zero variance (all pass)
    ("trajB", "retail", 2, 8, 0),   # mean 0    var 0     -> zero variance (all fail)
    ("trajB", "retail", 4, 8, 1),   # mean .125 var .109  -> mixed, adv
    ("trajB", "retail", 6, 4, 2),   # k=4, mean .5 var .25 -> mixed, adv unless min_k > 4
    ("trajC", "retail", 2, 8, 3),   # mean .375 var .234  -> mixed, adv
]
UNPROFILED = ("trajC", "retail", 4)


def make_tables(spec=SPEC):
    turn_rows, profile_rows = [], []
    for traj, domain, index, k, n_pass in spec:
        tid = turn_id(traj, index)
        turn_rows.append(_turn(tid, traj, domain, index))
        mean = n_pass / k
        profile_rows.append(
            {
                "turn_id": tid, "trajectory_id": traj, "domain": domain, "policy_fp": "p1", "verifier_fp": "v1",
                "k": k, "reward_mean": mean, "reward_var": mean * (1 - mean), "reward_std": (mean * (1 - mean)) ** 0.5,
                "n_pass": n_pass, "n_distinct_actions": 2,
            }
        )
    traj, domain, index = UNPROFILED
    turn_rows.append(_turn(turn_id(traj, index), traj, domain, index))
    return pl.DataFrame(profile_rows), pl.DataFrame(turn_rows)


def _turn(tid, traj, domain, index):
    action = {"type": "function_call", "name": "lookup", "arguments": "{}"}
    return {
        "turn_id": tid, "trajectory_id": traj, "domain": domain, "message_index": index, "turn_index": index // 2 - 1,
        "action_kind": "tool_call", "expert_action": canonical_json(action), "tool_names": ["lookup"],
    }


def tid(traj, index):
    return turn_id(traj, index)


def test_sets_satisfy_their_definitions_and_carry_turn_columns():
    profiles, turns = make_tables()
    result = select_pivots(profiles, turns, PivotsSection(lambda_diff=0.6))
    mixed, adv, cand = result["pivots_mixed"], result["pivots_adv"], result["pivots_cand"]
    assert mixed.height == 6 and (mixed["reward_var"] > 0).all()
    assert adv.height == 5 and ((adv["reward_var"] > 0) & (adv["reward_mean"] <= 0.6)).all()
    assert set(adv["turn_id"]) <= set(mixed["turn_id"])
    assert tid("trajA", 6) in set(mixed["turn_id"]) and tid("trajA", 6) not in set(adv["turn_id"])
    for frame, name in ((mixed, "mixed"), (adv, "adv"), (cand, "cand")):
        assert {"expert_action", "message_index", "action_kind", "tool_names", "trajectory_id", "domain"} <= set(frame.columns)
        assert frame["pivot_set"].unique().to_list() == [name]
        assert frame["selection_rank"].to_list() == list(range(1, frame.height + 1))


def test_ranking_variance_desc_then_lower_mean_then_turn_id():
    profiles, turns = make_tables()
    adv = select_pivots(profiles, turns)["pivots_adv"]
    rows = adv.select("reward_var", "reward_mean", "turn_id").rows()
    assert rows == sorted(rows, key=lambda r: (-r[0], r[1], r[2]))
    # The two var=.25 turns tie on variance and mean: turn_id breaks the tie.
    top_two = adv["turn_id"].head(2).to_list()
    assert sorted(top_two) == top_two and set(top_two) == {tid("trajA", 2), tid("trajB", 6)}


def test_max_per_trajectory_keeps_best_ranked_and_logs_the_rest():
    profiles, turns = make_tables()
    result = select_pivots(profiles, turns, PivotsSection(max_per_trajectory=1))
    mixed = result["pivots_mixed"]
    assert mixed.group_by("trajectory_id").len()["len"].max() == 1
    assert set(mixed["turn_id"]) == {tid("trajA", 2), tid("trajB", 6), tid("trajC", 2)}
    log = result["selection_log"]
    capped = log.filter((pl.col("set") == "mixed") & (pl.col("reason") == "over_trajectory_cap"))
    assert set(capped["turn_id"]) == {tid("trajA", 4), tid("trajA", 6), tid("trajB", 4)}


def test_domain_quotas_cap_listed_domains_only():
    profiles, turns = make_tables()
    result = select_pivots(profiles, turns, PivotsSection(domain_quotas={"retail": 1}))
    adv = result["pivots_adv"]
    assert adv.filter(pl.col("domain") == "retail").height == 1
    assert adv.filter(pl.col("domain") == "airline").height == 2  # not listed: not capped
    assert rejection_counts(result["selection_log"])[("adv", "over_domain_quota")] == 2


def test_min_k_filters_every_set():
    profiles, turns = make_tables()
    result = select_pivots(profiles, turns, PivotsSection(min_k=8, cand_size=100))
    for name in ("pivots_mixed", "pivots_adv", "pivots_cand"):
        assert tid("trajB", 6) not in set(result[name]["turn_id"])
    reasons = rejection_counts(result["selection_log"])
    assert reasons[("mixed", "below_min_k")] == reasons[("cand", "below_min_k")] == 1
    assert funnel_counts(result)["candidates"] == 7


def test_cand_is_seeded_reproducible_and_sized_like_adv():
    profiles, turns = make_tables()
    first = select_pivots(profiles, turns, PivotsSection(seed=7))["pivots_cand"]
    shuffled_input = select_pivots(profiles.reverse(), turns.reverse(), PivotsSection(seed=7))["pivots_cand"]
    assert first.height == 5  # len(pivots_adv)
    assert first["turn_id"].to_list() == shuffled_input["turn_id"].to_list()
    others = {tuple(select_pivots(profiles, turns, PivotsSection(seed=s))["pivots_cand"]["turn_id"]) for s in range(8)}
    assert len(others) > 1, "different seeds should give different samples"
    everything = select_pivots(profiles, turns, PivotsSection(cand_size=100))["pivots_cand"]
    assert everything.height == 8  # all profiled turns, zero-variance ones included (no filter)


def test_funnel_adds_up_and_every_turn_is_accounted_for():
    profiles, turns = make_tables()
    result = select_pivots(profiles, turns, PivotsSection(max_per_trajectory=2))
    funnel = funnel_counts(result)
    assert funnel["turns"] == 9 and funnel["profiled"] == 8
    assert funnel["turns"] >= funnel["profiled"] >= funnel["candidates"] >= funnel["mixed"] >= funnel["adv"]
    log = result["selection_log"]
    for name in ("mixed", "adv", "cand"):
        per_set = log.filter(pl.col("set") == name)
        assert per_set["turn_id"].n_unique() == per_set.height == funnel["turns"], name
        assert per_set["kept"].sum() == funnel[name]
        assert per_set.filter(~pl.col("kept"))["reason"].null_count() == 0
    assert log.filter(pl.col("reason") == "not_profiled")["turn_id"].unique().to_list() == [tid(*UNPROFILED[::2])]


def test_profiles_of_missing_turns_are_logged_not_selected():
    profiles, turns = make_tables()
    turns = turns.filter(pl.col("turn_id") != tid("trajA", 2))
    result = select_pivots(profiles, turns)
    assert tid("trajA", 2) not in set(result["pivots_mixed"]["turn_id"])
    assert rejection_counts(result["selection_log"])[("mixed", "turn_missing")] == 1


def test_bad_inputs_are_clear_errors():
    profiles, turns = make_tables()
    two_generations = pl.concat([profiles, profiles.with_columns(pl.lit("v2").alias("verifier_fp"))])
    with pytest.raises(ValueError, match="one \\(policy_fp, verifier_fp\\)"):
        select_pivots(two_generations, turns)
    with pytest.raises(ValueError, match="lacks columns"):
        select_pivots(profiles.drop("reward_var"), turns)
    with pytest.raises(ValueError, match="lambda_diff"):
        PivotsSection(lambda_diff=1.5)


# -- the named SQL statistics over the selected sets ---------------------------------------------

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
STAT_QUERIES = ("pivot_funnel", "pass_rate_histogram", "difficulty_by_tool", "difficulty_by_domain",
                "difficulty_by_turn_depth", "zero_variance_share", "pivots_per_trajectory")


@pytest.fixture()
def sql_world():
    """In-memory DuckDB with one view per table, and each sql/ statistic as a view (as the warehouse does)."""
    profiles, turns = make_tables()
    result = select_pivots(profiles, turns, PivotsSection(max_per_trajectory=2))
    con = duckdb.connect()
    tables = {"turns": turns, "turn_profiles": profiles, **{k: v for k, v in result.items() if k.startswith("pivots_")},
              SKIPPED_TURNS: pl.from_arrow(SKIPPED_TURNS_SCHEMA.empty_table())}
    for name, frame in tables.items():
        con.register(f"{name}_df", frame.to_arrow())
        con.execute(f"create view {name} as select * from {name}_df")
    for name in STAT_QUERIES:
        con.execute(f"create view {name} as {(SQL_DIR / f'{name}.sql').read_text()}")
    return con, result


def rows(con, sql):
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, r)) for r in cursor.fetchall()]


def test_sql_definitions_hold_and_funnel_reconciles(sql_world):
    con, result = sql_world
    assert con.execute("select count(*) from pivots_adv where not (reward_var > 0 and reward_mean <= 0.6)").fetchone()[0] == 0
    assert con.execute("select count(*) from pivots_mixed where not (reward_var > 0)").fetchone()[0] == 0
    funnel = {r["stage"]: r["turns"] for r in rows(con, "select * from pivot_funnel")}
    expected = funnel_counts(result)
    assert funnel == {"prompt_too_long": 0, **{k: expected[k] for k in ("turns", "profiled", "mixed", "adv", "cand")}}
    assert rows(con, "select * from pivot_funnel")[0]["share_of_turns"] == 1.0


def test_sql_statistics_count_every_turn(sql_world):
    con, result = sql_world
    histogram = rows(con, "select * from pass_rate_histogram")
    assert sum(r["turns"] for r in histogram) == 8
    assert {r["bin"] for r in histogram} == {0, 1, 2, 3, 5, 7, 9}
    assert sum(r["zero_variance_turns"] for r in histogram) == 2
    zero = {r["domain"]: r for r in rows(con, "select * from zero_variance_share")}
    assert zero["(all)"]["zero_variance"] == 2 and zero["(all)"]["all_pass"] == 1 and zero["(all)"]["all_fail"] == 1
    assert zero["retail"]["all_fail"] == 1 and zero["airline"]["all_pass"] == 1
    by_domain = {r["domain"]: r for r in rows(con, "select * from difficulty_by_domain")}
    assert by_domain["retail"]["turns"] == 5 and by_domain["retail"]["profiled_turns"] == 4
    assert sum(r["adv_pivots"] for r in by_domain.values()) == funnel_counts(result)["adv"]
    by_tool = rows(con, "select * from difficulty_by_tool")
    assert [r["tool_name"] for r in by_tool] == ["lookup"] and by_tool[0]["profiled_turns"] == 8
    depth = rows(con, "select * from difficulty_by_turn_depth")
    assert sum(r["turns"] for r in depth) == 9 and depth[0]["depth"] == 0
    per_trajectory = {r["trajectory_id"]: r for r in rows(con, "select * from pivots_per_trajectory")}
    assert per_trajectory["trajA"]["mixed_pivots"] == 2 and per_trajectory["trajA"]["turns"] == 4
    assert sum(r["cand_pivots"] for r in per_trajectory.values()) == funnel_counts(result)["cand"]


def test_action_kinds_keeps_replies_out_of_every_set_with_a_reason():
    """pivots.action_kinds: users without a judge keep message turns out of the pivot sets; nothing is lost."""
    profiles, turns = make_tables()
    replies = {tid("trajA", 2), tid("trajB", 4)}  # two mixed, hard turns become replies
    turns = turns.with_columns(
        pl.when(pl.col("turn_id").is_in(sorted(replies))).then(pl.lit("message")).otherwise(pl.col("action_kind"))
        .alias("action_kind"))
    kinds = dict(zip(turns["turn_id"], turns["action_kind"]))
    assert set(select_pivots(profiles, turns)["pivots_adv"]["turn_id"]) >= replies
    result = select_pivots(profiles, turns, PivotsSection(action_kinds=["tool_call", "tool_call_batch"]))
    for table in ("pivots_mixed", "pivots_adv", "pivots_cand"):
        assert "message" not in set(result[table]["action_kind"])
    log = result["selection_log"].filter(pl.col("reason") == "action_kind_excluded")
    excluded = {t for t, k in kinds.items() if k == "message" and t in set(profiles["turn_id"])}
    for pivot_set in ("mixed", "adv", "cand"):
        assert set(log.filter(pl.col("set") == pivot_set)["turn_id"]) == excluded
