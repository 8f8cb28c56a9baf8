"""What each ablation arm trains on: its pivot set in the training pool, D_cand redrawn per seed and size-matched to
D_adv's pool, its overlap with D_adv reported (no model is trained here)."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import yaml

from pivot_assets.core.config import load_config
from pivot_assets.core.split import HELD_OUT, POOL, WARMUP, ConversationSplit
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.curation.tables import select_and_write
from pivot_assets.evaluation.ablation import arm_pool, cand_overlap, pool_trajectories

N = 300  # trajectories, one turn each, 3 per conversation


def _cfg(tmp_path, **training):
    path = tmp_path / "pivot.yaml"
    path.write_text(yaml.safe_dump({"warehouse": "./wh", "ablation": {"seeds": [0, 1, 2]},
                                    "training": {"eval_fraction": 0.2, "warmup_fraction": 0.3, **training}}))
    return load_config(path)


def _warehouse(tmp_path, cfg) -> Warehouse:
    """Profiles of every turn outside the warm-up split (as profiling writes them), then the pivot sets."""
    wh = Warehouse(tmp_path / "wh")
    ids = [f"t{i:03d}" for i in range(N)]
    wh.write_table("trajectories", pa.table({"trajectory_id": ids, "conversation_id": [f"c{i // 3}" for i in range(N)]}))
    turns = pl.DataFrame({"turn_id": [f"u{i:03d}" for i in range(N)], "trajectory_id": ids, "domain": ["shop"] * N,
                          "message_index": [1] * N, "turn_index": [0] * N, "action_kind": ["tool_call"] * N,
                          "expert_action": ["{}"] * N, "tool_names": [["f"]] * N})
    wh.write_table("turns", turns.to_arrow())
    warmup = ConversationSplit.from_config(cfg).trajectories(wh, WARMUP)
    profiled = turns.filter(~pl.col("trajectory_id").is_in(sorted(warmup)))
    means = [(int(t[1:]) % 10) / 10 for t in profiled["turn_id"]]  # 0.0 .. 0.9: a tenth zero-variance turns
    wh.write_table("turn_profiles", pl.DataFrame({
        "turn_id": profiled["turn_id"], "policy_fp": "P", "verifier_fp": "V", "k": 8, "reward_mean": means,
        "reward_var": [m * (1 - m) for m in means]}).to_arrow())
    select_and_write(wh, cfg.pivots)
    return wh


def test_arms_train_on_their_set_in_the_pool_and_d_cand_is_redrawn_per_seed_size_matched(tmp_path):
    cfg = _cfg(tmp_path)
    wh = _warehouse(tmp_path, cfg)
    split = ConversationSplit.from_config(cfg)
    pool = pool_trajectories(wh, cfg)
    assert pool == split.trajectories(wh, POOL) and not pool & split.trajectories(wh, HELD_OUT, WARMUP)
    adv = arm_pool(wh, cfg, "grpo_adv", 0, pool)
    assert set(adv["trajectory_id"]) <= pool and adv.height == wh.read("pivots_adv").filter(
        pl.col("trajectory_id").is_in(sorted(pool))).height
    assert arm_pool(wh, cfg, "sft_same_data", 0, pool)["turn_id"].to_list() == adv["turn_id"].to_list()
    assert arm_pool(wh, cfg, "grpo_adv", 2, pool)["turn_id"].to_list() == adv["turn_id"].to_list()
    mixed = arm_pool(wh, cfg, "grpo_mixed", 0, pool)
    assert set(adv["turn_id"]) < set(mixed["turn_id"]) and set(mixed["trajectory_id"]) <= pool
    draws = [arm_pool(wh, cfg, "grpo_cand", s, pool) for s in (0, 1, 2)]
    assert draws[0].columns == wh.read("pivots_cand").columns  # the rows GRPO's export takes, as pivots_cand has them
    for cand in draws:  # size-matched to D_adv in the pool, drawn from the pool only
        assert cand.height == adv.height and set(cand["trajectory_id"]) <= pool
    assert len({tuple(c["turn_id"].to_list()) for c in draws}) == 3  # every seed its own draw
    assert draws[1]["turn_id"].to_list() == arm_pool(wh, cfg, "grpo_cand", 1, pool)["turn_id"].to_list()
    overlap = cand_overlap(wh, cfg, 1, pool)
    assert overlap == {"cand": adv.height, "adv": adv.height,
                       "overlap": len(set(draws[1]["turn_id"]) & set(adv["turn_id"]))}
    # candidates are every profiled pool turn, D_adv those with mean <= 0.6 and variance: the overlap is partial
    assert 0 < overlap["overlap"] < adv.height


def test_every_policy_is_scored_with_the_draws_it_is_compared_on(tmp_path, monkeypatch):
    """arm/s with seed s's draw; the reference with every seed's (each arm/s is paired with it on draw s); the base
    model with the first seed's; a model asked for by several policies is scored once with all their draws."""
    from pivot_assets.evaluation.ablation import ablation_policies
    from pivot_assets.evaluation.heldout import _draws_by_model, local_key
    from pivot_assets.verifiers import DomainVerifiers

    monkeypatch.setattr("pivot_assets.policies.models.policy_fingerprint", lambda model, fmt=None: f"fp:{model}")
    cfg = _cfg(tmp_path)
    wh = Warehouse(tmp_path / "wh")
    policies, pooled = ablation_policies(wh, cfg)
    by = {p.name: p for p in policies}
    assert by["base"].draws == (0,) and by["reference"].draws == (0, 1, 2)
    assert by["grpo_adv/s1"].draws == (1,) and by["grpo_adv/s1"].seed == 1
    assert pooled["grpo_cand"] == ["grpo_cand/s0", "grpo_cand/s1", "grpo_cand/s2"]
    wanted = _draws_by_model(cfg, policies)  # policy.model embedded: base and reference are one model
    assert len(wanted) == 1 + 5 * 3 and wanted["fp:embedded"] == ("embedded", [0, 1, 2])
    verifiers = DomainVerifiers(cfg.verifier)
    keys = {local_key(cfg, ["u1"], verifiers, d) for d in (0, 1, 2)}
    assert len(keys) == 3  # every draw its own cache entry
