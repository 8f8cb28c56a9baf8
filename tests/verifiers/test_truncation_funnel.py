"""sql/truncation_funnel.sql: turns that look hard only because their samples ran out of tokens."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from pivot_assets.core.catalog import REWARDS_SCHEMA

SQL = (Path(__file__).resolve().parents[2] / "sql" / "truncation_funnel.sql").read_text()
K = 4
# turn -> the reasons of its K samples (reward 1 for OK, 0 otherwise)
TURNS = {
    "ok": ["OK"] * 4,
    "wrong": ["OK", "UNEXPECTED_TOOL", "OK", "OK"],
    "cut": ["OK", "TRUNCATED", "TRUNCATED", "OK"],  # hard only by truncation
    "all_cut": ["TRUNCATED"] * 4,  # hard only by truncation, and every sample truncated
    "both": ["TRUNCATED", "PARSE_ERROR", "OK", "OK"],  # truncated, but also a wrong answer
}


def test_truncation_funnel_counts():
    rewards = [{"turn_id": t, "policy_fp": "p", "sampling_fp": "s", "sample_index": i, "verifier_fp": "v",
                "domain": "d", "reward": 1.0 if r == "OK" else 0.0, "reason": r, "detail": "", "action": None}
               for t, reasons in TURNS.items() for i, r in enumerate(reasons)]
    # an older verifier generation of the same samples is not counted
    rewards += [{**r, "verifier_fp": "old", "reason": "PARSE_ERROR"} for r in rewards if r["turn_id"] == "cut"]
    profiles = pa.table({"turn_id": list(TURNS), "policy_fp": ["p"] * 5, "sampling_fp": ["s"] * 5,
                         "verifier_fp": ["v"] * 5, "k": [K] * 5})
    con = duckdb.connect()
    con.register("rollout_rewards", pa.Table.from_pylist(rewards, schema=REWARDS_SCHEMA))
    con.register("turn_profiles", profiles)
    rows = {stage: (turns, share) for _, stage, turns, share in con.sql(SQL).fetchall()}
    assert rows == {"profiled": (5, 1.0), "with_truncated_samples": (3, 0.6), "all_samples_truncated": (1, 0.2),
                    "hard_only_by_truncation": (2, 0.4)}
