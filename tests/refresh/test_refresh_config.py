"""Refresh rounds without a model: the config section, the asset graph it adds, the seeded skip and replay draws,
and the buckets (the whole loop runs in test_refresh_rounds.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pivot_assets.core.config import ConfigError, PivotConfig, RefreshSection, load_config
from pivot_assets.refresh import rounds

REPO = Path(__file__).resolve().parents[2]


def test_off_by_default_and_every_field_described():
    assert PivotConfig().refresh.rounds == 0
    assert all(f.description for f in RefreshSection.model_fields.values())


def graph(tmp_path, refresh: dict, **extra):
    from pivot_jobs.definitions import build_definitions

    cfg = load_config(REPO / "pivot.yaml", overrides={"warehouse": str(tmp_path / "wh"), "refresh": refresh, **extra})
    g = build_definitions(cfg).resolve_asset_graph()
    return {k.to_user_string(): sorted(p.to_user_string() for p in g.get(k).parent_keys)
            for k in g.get_all_asset_keys() if g.get(k).group_name == "refresh"}


def test_one_asset_per_round_each_below_the_one_before(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    assert graph(tmp_path, {"rounds": 0}) == {}
    assets = graph(tmp_path, {"rounds": 3, "steps_per_round": 2})
    assert assets["refresh_round_1"] == ["refresh_round_0", "turns"]
    assert assets["refresh_round_2"] == ["refresh_round_1", "turns"]
    assert "grpo_run" in assets["refresh_round_0"] and "turn_profiles" in assets["refresh_round_0"]
    assert assets["refresh_report"] == ["refresh_round_0", "refresh_round_1", "refresh_round_2"]
    with pytest.raises(ConfigError, match="refresh.rounds needs scale.shards 1"):
        graph(tmp_path, {"rounds": 2}, scale={"shards": 2})


def test_round_code_versions_follow_the_refresh_identity(tmp_path, monkeypatch):
    from pivot_jobs.definitions import build_definitions

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))

    def versions(refresh):
        cfg = load_config(REPO / "pivot.yaml", overrides={"warehouse": str(tmp_path / "wh"), "refresh": refresh})
        g = build_definitions(cfg).resolve_asset_graph()
        return {k.to_user_string(): g.get(k).code_version for k in g.get_all_asset_keys()
                if k.to_user_string().startswith("refresh_round")}

    base = versions({"rounds": 2})
    assert versions({"rounds": 3})["refresh_round_1"] == base["refresh_round_1"]  # more rounds: round 1 unchanged
    changed = versions({"rounds": 2, "replay_fraction": 0.5})
    assert changed["refresh_round_0"] == base["refresh_round_0"] and changed["refresh_round_1"] != base["refresh_round_1"]


def test_definitions_with_rounds_import_no_model_stack(tmp_path):
    (tmp_path / "pivot.yaml").write_text("refresh: {rounds: 2}\n")
    code = ("import sys; from pivot_jobs.definitions import build_definitions; build_definitions(sys.argv[1]); "
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "pivot.yaml")], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "DAGSTER_HOME": str(tmp_path / "dh")}, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def previous_round(n: int) -> pl.DataFrame:
    """n settled and mastered turns (2 of 2 passed), n unsolved (0 of 2), n mixed."""
    ids = [f"t{i:03d}" for i in range(3 * n)]
    return pl.DataFrame({"turn_id": ids, "k": [2] * (3 * n), "n_pass": [2] * n + [0] * n + [1] * n,
                         "reward_var": [0.0] * (2 * n) + [0.25] * n})


def cfg_with(**refresh) -> PivotConfig:
    return PivotConfig(refresh=RefreshSection(rounds=3, **refresh))


def test_skip_draw_is_seeded_per_round_and_only_settled_turns():
    prev = previous_round(200)
    settled = set(prev.filter(pl.col("reward_var") == 0)["turn_id"])
    half = rounds.skipped_turns(prev, 1, cfg_with(skip_settled_prob=0.5))
    assert half <= settled and 150 < len(half) < 250  # about half of 400
    assert half == rounds.skipped_turns(prev, 1, cfg_with(skip_settled_prob=0.5))  # seeded: the same draw
    assert half != rounds.skipped_turns(prev, 2, cfg_with(skip_settled_prob=0.5))  # a draw per round
    assert half != rounds.skipped_turns(prev, 1, cfg_with(skip_settled_prob=0.5, seed=1))
    assert rounds.skipped_turns(prev, 1, cfg_with(skip_settled_prob=0.0)) == set()
    assert rounds.skipped_turns(prev, 1, cfg_with(skip_settled_prob=1.0)) == settled


def test_replay_draws_a_fraction_of_the_mastered_pool_turns():
    prev = previous_round(10)
    mastered = [f"t{i:03d}" for i in range(10)]
    pool = set(mastered[:8]) | {"t015"}
    picked = rounds.replayed_turns(prev, 1, cfg_with(replay_fraction=0.5), pool)
    assert len(picked) == 4 and set(picked) <= set(mastered[:8])  # half of the 8 mastered in the pool
    assert picked == rounds.replayed_turns(prev, 1, cfg_with(replay_fraction=0.5), pool)
    assert rounds.replayed_turns(prev, 1, cfg_with(replay_fraction=0.0), pool) == []
    assert sorted(rounds.replayed_turns(prev, 1, cfg_with(replay_fraction=1.0), pool)) == mastered[:8]


def test_buckets():
    frame = pl.DataFrame({"reward_var": [0.1, 0.1, 0.0, 0.0, 0.0], "reward_mean": [0.3, 0.97, 1.0, 0.0, 0.5]})
    got = frame.select(rounds.bucket_expr(0.6).alias("b"))["b"].to_list()
    assert got == ["adv", "mixed", "easy", "unsolved", "unsolved"]


def test_grpo_spend_counts_completions_and_their_tokens():
    steps = [{"step": 1, "completion_mean_length": 8.0}, {"step": 2, "completion_mean_length": 5.0}]
    completions = [{"step": 1}] * 4 + [{"step": 2}] * 4
    assert rounds.grpo_spend(steps, completions, 2) == {"samples": 8, "generated_tokens": 52, "grpo_steps": 2,
                                                        "num_generations": 2, "prompts_per_step": 2}
    assert rounds.grpo_spend([], [], 4)["samples"] == 0
