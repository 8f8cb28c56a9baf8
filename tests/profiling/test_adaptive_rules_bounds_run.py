"""Adaptive profiling under rule band with the embedded policy: the Profiler settles turns on the band's bounds
(the rule reaches the stopping decisions through the config), and each turn's D_adv membership from its adaptive
profile equals the one from all k samples."""

from __future__ import annotations

import shutil

import pytest

from .test_adaptive_profiling import BASE, TURNS, K, ingested, profiler  # noqa: F401  (ingested: a fixture)

pytestmark = pytest.mark.scenario
BAND = [0.5, 0.95]
ADAPTIVE_BAND = f"pivots: {{rule: band, band: {BAND}}}\nprofiling: {{adaptive: {{enabled: true, rule: exact, sets: [adv]}}}}\n"


def adv_members(table) -> dict[str, bool]:
    """selection.py's band rule on the profile rows (reward_var > 0, band[0] < reward_mean < band[1])."""
    rows = table.select(["turn_id", "reward_mean", "reward_var"]).to_pylist()
    return {r["turn_id"]: r["reward_var"] > 0 and BAND[0] < r["reward_mean"] < BAND[1] for r in rows}


def test_band_settles_on_its_bounds_and_keeps_the_k_sample_membership(tmp_path, ingested, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ingested, tmp_path / "wh")
    adaptive = profiler(tmp_path, BASE + ADAPTIVE_BAND)
    assert adaptive.adv_bounds.rule == "band"
    adaptive.generate()
    table = adaptive.profile()
    rows = table.select(["turn_id", "k", "reward_mean", "stop_reason"]).to_pylist()
    assert len(rows) == TURNS
    # all-fail turns end at most at 3/6 after 4 samples, not above 0.5: settled out; an all-pass turn can still end
    # inside (0.5, 0.95) until its last sample (under pivotrl it is the all-pass turns that stop early)
    for r in rows:
        if r["reward_mean"] == 0.0:
            assert (r["k"], r["stop_reason"]) == (4, "settled"), r
        if r["reward_mean"] == 1.0:
            assert r["k"] == K, r
    assert {r["reward_mean"] for r in rows} >= {0.0, 1.0}  # both kinds of turn are there
    assert any(r["k"] < K for r in rows)
    exhaustive = profiler(tmp_path, BASE + f"pivots: {{rule: band, band: {BAND}}}\n")  # adaptive off: tops up to k
    exhaustive.generate()
    exhaustive.score()
    full = exhaustive.profile()
    assert sorted(full.column("k").to_pylist()) == [K] * TURNS
    assert adv_members(table) == adv_members(full)
