"""Profiles whose k varies per turn (adaptive profiling): selection's min_k takes a turn stopped early because its
membership was settled, and every contract passes; a profile past policy.k or with a hole in its samples fails."""

from __future__ import annotations

import polars as pl

from pivot_assets.core.config import PivotsSection
from pivot_assets.core.ids import canonical_json, turn_id
from pivot_assets.curation.contracts import run_contract
from pivot_assets.curation.selection import select_pivots

POLICY_K = 8
# turn -> (its profile's rewards in sample order, stop_reason, rewards stored past its k: a larger budget's samples)
TURNS = {
    "easy": ([1, 0, 1, 1, 1, 1], "settled", [0, 1]),  # mixed, too easy for D_adv for sure after 5 passes
    "hard": ([1, 0, 0, 0, 0, 0], "settled", []),  # 1 pass at most 1 + 2 of 8: D_adv for sure
    "dead": ([0, 0, 0, 0], "posterior", [0, 0, 0, 0]),  # the posterior rule stopped it
    "open": ([1, 0, 0, 1], "unsettled", []),  # fewer than k, not settled (e.g. after a verifier change)
    "full": ([0, 1, 0, 0, 0, 0, 0, 1], "k_reached", []),
}


def world():
    turns, rewards, profiles = [], [], []
    for n, (name, (values, why, beyond)) in enumerate(TURNS.items()):
        tid = turn_id(f"traj-{name}", 2)
        action = {"type": "function_call", "name": "lookup", "arguments": "{}"}
        turns.append({"turn_id": tid, "trajectory_id": f"traj-{name}", "domain": "d", "message_index": 2,
                      "turn_index": 0, "action_kind": "tool_call", "expert_action": canonical_json(action),
                      "tool_names": ["lookup"]})
        for i, r in enumerate(values + beyond):
            rewards.append({"turn_id": tid, "policy_fp": "p", "sampling_fp": "s", "sample_index": i,
                            "verifier_fp": "v", "reward": float(r)})
        k, mean = len(values), sum(values) / len(values)
        profiles.append({"turn_id": tid, "trajectory_id": f"traj-{name}", "domain": "d", "policy_fp": "p",
                         "sampling_fp": "s", "verifier_fp": "v", "k": k, "reward_mean": mean,
                         "reward_var": mean * (1 - mean), "reward_std": (mean * (1 - mean)) ** 0.5,
                         "n_pass": sum(values), "n_distinct_actions": 1, "expert_logprob": -3.0 - n,
                         "expert_tokens": 12, "stop_reason": why, "p_flip": 0.01 if why == "posterior" else 0.0})
    return pl.DataFrame(turns), pl.DataFrame(rewards), pl.DataFrame(profiles)


def tid(name):
    return turn_id(f"traj-{name}", 2)


def check(table, frame, related, k=POLICY_K):
    return run_contract(table, frame, related=related, params={"lambda_diff": 0.6, "policy_k": k})


def test_min_k_keeps_settled_turns_and_drops_open_ones():
    turns, _, profiles = world()
    out = select_pivots(profiles, turns, PivotsSection(lambda_diff=0.6, min_k=POLICY_K))
    log = out["selection_log"].filter(pl.col("set") == "mixed")
    below = set(log.filter(pl.col("reason") == "below_min_k")["turn_id"])
    assert below == {tid("open")}
    assert set(out["pivots_mixed"]["turn_id"]) == {tid("easy"), tid("hard"), tid("full")}
    assert set(out["pivots_adv"]["turn_id"]) == {tid("hard"), tid("full")}
    assert dict(zip(out["pivots_mixed"]["turn_id"], out["pivots_mixed"]["k"]))[tid("easy")] == 6


def test_contracts_pass_with_a_k_per_turn_and_samples_past_it():
    turns, rewards, profiles = world()
    result = check("turn_profiles", profiles, {"rollout_rewards": rewards})
    assert result.success, result.summary()
    out = select_pivots(profiles, turns, PivotsSection(lambda_diff=0.6, min_k=POLICY_K))
    for table in ("pivots_mixed", "pivots_adv", "pivots_cand"):
        result = check(table, out[table], {"turns": turns})
        assert result.success, result.summary()


def test_a_profile_past_policy_k_or_with_a_hole_fails():
    turns, rewards, profiles = world()
    result = check("turn_profiles", profiles, {"rollout_rewards": rewards}, k=5)
    failed = {(f["expectation"], str(f["column"])) for f in result.failures}
    assert ("expect_column_values_to_be_between", "k") in failed
    holed = rewards.filter(~((pl.col("turn_id") == tid("full")) & (pl.col("sample_index") == 3)))
    result = check("turn_profiles", profiles, {"rollout_rewards": holed})
    bad = [f for f in result.failures if f["column"] == "k_gap"]
    assert bad and bad[0]["unexpected_count"] == 1
    wrong_reason = profiles.with_columns(pl.lit("bored").alias("stop_reason"))
    result = check("turn_profiles", wrong_reason, {"rollout_rewards": rewards})
    assert any(f["column"] == "stop_reason" for f in result.failures)
