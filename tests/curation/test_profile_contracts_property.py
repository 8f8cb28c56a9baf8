"""Valid data always passes its contracts: the profiler's statistics for every k in 1..64 and every pass count,
and for fractional rewards, pass every expectation of turn_profiles and of the pivot sets.

The rows come from the real profiler SQL (profiling/profiler.build_profiles over a real warehouse) and the real
selection, not from a hand-written formula: a rounding in either (3 passes of 6 once gave reward_var
0.25000000000000006 and stopped valid runs) fails here.
"""

from __future__ import annotations

import random

import polars as pl
import pyarrow as pa

from pivot_assets.core.catalog import REWARDS_SCHEMA
from pivot_assets.core.config import AdaptiveSection, PivotsSection
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.curation.contracts import run_contract
from pivot_assets.curation.selection import select_pivots
from pivot_assets.profiling.adaptive import annotate
from pivot_assets.profiling.profiler import build_profiles

MAX_K = 64
FRACTIONS = [0.1, 0.2, 0.3, 1 / 3, 0.5, 2 / 3, 0.7, 0.9, 0.99, 1e-9, 1 - 1e-9]


def _reward_lists() -> list[list[float]]:
    binary = [[1.0] * n + [0.0] * (k - n) for k in range(1, MAX_K + 1) for n in range(k + 1)]
    rng = random.Random(0)
    fractional = [[rng.choice(FRACTIONS + [0.0, 1.0]) for _ in range(k)] for k in range(1, MAX_K + 1) for _ in range(4)]
    fractional += [[x] * k for x in FRACTIONS for k in (1, 6, 64)]  # all equal: variance exactly 0
    fractional += [[0.5 - d, 0.5 + d] * (k // 2) for d in (1e-17, 1e-9, 0.25) for k in (2, 6, 64)]
    return binary + fractional


def _world(tmp_path) -> tuple[Warehouse, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    wh = Warehouse(tmp_path / "wh")
    lists = _reward_lists()
    turns, rewards = [], []
    for i, values in enumerate(lists):
        tid = f"t{i:05d}"
        turns.append({"turn_id": tid, "trajectory_id": f"traj{i:05d}", "domain": "d", "message_index": 2,
                      "turn_index": 0, "action_kind": "message",
                      "expert_action": '{"content":"ok","type":"message"}', "tool_names": []})
        rewards += [{"turn_id": tid, "policy_fp": "pol", "sampling_fp": "samp", "sample_index": s,
                     "verifier_fp": "ver", "domain": "d", "reward": r, "reason": "ok", "detail": None, "action": "a"}
                    for s, r in enumerate(values)]
    turns_frame = pl.DataFrame(turns)
    wh.write_table("turns", turns_frame.to_arrow())
    wh.append_part("rollout_rewards", pa.Table.from_pylist(rewards, schema=REWARDS_SCHEMA))
    counts = build_profiles(wh, "pol", "samp", "ver", [t["turn_id"] for t in turns])
    profiles, _ = annotate(counts, AdaptiveSection(), MAX_K, 0.6)
    return wh, turns_frame, pl.from_arrow(profiles), pl.DataFrame(rewards)


def test_every_pass_count_and_fractional_rewards_pass_every_contract(tmp_path):
    wh, turns, profiles, rewards = _world(tmp_path)
    assert profiles.height == len(_reward_lists())
    assert profiles["reward_var"].max() <= 0.25 and profiles.filter(pl.col("reward_var") == 0.25).height > 0
    params = {"lambda_diff": 0.6, "policy_k": MAX_K}
    result = run_contract("turn_profiles", profiles, related={"rollout_rewards": rewards}, params=params)
    assert result.success, result.summary()
    selected = select_pivots(profiles, turns, PivotsSection(lambda_diff=0.6, max_per_trajectory=None))
    for table in ("pivots_cand", "pivots_mixed", "pivots_adv"):
        assert selected[table].height > 0, table
        result = run_contract(table, selected[table], related={"turns": turns}, params=params)
        assert result.success, result.summary()


def test_half_of_six_is_exactly_a_quarter(tmp_path):
    """The case that stopped the demo's runs: 3 passes of 6."""
    _, _, profiles, _ = _world(tmp_path)
    row = profiles.filter(pl.col("turn_id") == "t00023").row(0, named=True)  # k=6 starts at index 20; n=3
    assert (row["k"], row["n_pass"]) == (6, 3)
    assert row["reward_var"] == 0.25 and row["reward_std"] == 0.5
