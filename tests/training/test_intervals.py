"""Intervals and paired differences (evaluation.compare), and the fixed evaluation sets."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import yaml

from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.training.evaluation import (
    Policy,
    bootstrap_indices,
    compare,
    evaluation_sets,
    mean_ci,
)


def _cfg(tmp_path, **sections):
    path = tmp_path / "pivot.yaml"
    path.write_text(yaml.safe_dump({"warehouse": "./wh", **sections}))
    return load_config(path)


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_n():
    values = [1.0, 0.0] * 10
    idx = bootstrap_indices(len(values), 1000, "adv")
    mean, low, high = mean_ci(values, idx)
    assert mean == 0.5 and low < 0.5 < high
    assert (low, high) == mean_ci(values, bootstrap_indices(len(values), 1000, "adv"))[1:]  # seeded
    big = [1.0, 0.0] * 200
    _, low2, high2 = mean_ci(big, bootstrap_indices(len(big), 1000, "adv"))
    assert high2 - low2 < (high - low) / 3


def _scores(turns: dict, ood: list) -> dict:
    return {"turns": turns, "ood": ood, "seconds": 1.0, "model_fp": "fp"}


def test_compare_gives_paired_deltas_against_the_reference_and_pooled_arms(tmp_path):
    cfg = _cfg(tmp_path)
    sets = {"profiled": ["a", "b", "c", "d"], "mixed": ["a", "b", "c"], "adv": ["a", "b"]}
    ref = _scores({"a": 0.0, "b": 0.5, "c": 1.0, "d": 0.25}, [1.0, 0.0, 1.0, 0.0])
    better = _scores({"a": 0.5, "b": 1.0, "c": 1.0, "d": 0.75}, [1.0, 0.0, 1.0, 0.0])
    other = _scores({"a": 0.0, "b": 1.0, "c": 1.0, "d": 0.25}, [1.0, 1.0, 1.0, 0.0])
    policies = [(Policy("reference", "r"), ref), (Policy("x/s0", "m0", "x", 0), better), (Policy("x/s1", "m1", "x", 1), other)]
    rows = compare(cfg, policies, sets, "key", pooled={"x": ["x/s0", "x/s1"]})
    by = {(r["policy"], r["eval_set"]): r for r in rows}
    assert {s for _, s in by} == {"profiled", "mixed", "adv", "ood"}
    assert by[("reference", "adv")]["delta"] == 0.0 and by[("reference", "adv")]["delta_low"] == 0.0
    assert by[("x/s0", "adv")]["accuracy"] == 0.75 and by[("x/s0", "adv")]["delta"] == 0.5
    assert by[("x/s0", "profiled")]["delta"] == pytest.approx(0.375)
    # every turn improved by the same amount: the paired interval has no width, the unpaired one does
    assert by[("x/s0", "adv")]["delta_low"] == by[("x/s0", "adv")]["delta_high"] == 0.5
    assert by[("x/s0", "adv")]["ci_low"] < by[("x/s0", "adv")]["ci_high"]
    pooled = by[("x", "adv")]
    assert pooled["seed"] is None and pooled["arm"] == "x" and pooled["accuracy"] == pytest.approx(0.625)
    assert by[("x", "ood")]["accuracy"] == pytest.approx(0.625) and by[("x", "ood")]["n"] == 4


def _profile_warehouse(tmp_path) -> Warehouse:
    """Trajectories t0..t19 in conversations of two; one turn each; every turn profiled; mixed/adv subsets."""
    wh = Warehouse(tmp_path / "wh")
    ids = [f"t{i}" for i in range(20)]
    wh.write_table("trajectories", pa.table({"trajectory_id": ids, "conversation_id": [f"c{i // 2}" for i in range(20)],
                                             "messages": [[{"role": "user", "content": "hi"}]] * 20,
                                             "tools": ["[]"] * 20}))
    wh.write_table("turns", pa.table({"turn_id": [f"u{i}" for i in range(20)], "trajectory_id": ids}))
    gen = {"policy_fp": "P", "verifier_fp": "V"}
    profiles = {"turn_id": [f"u{i}" for i in range(20)], **{k: [v] * 20 for k, v in gen.items()}}
    wh.write_table("turn_profiles", pa.table(profiles))
    wh.write_table("pivots_mixed", pa.table({"turn_id": [f"u{i}" for i in range(0, 20, 2)],
                                             **{k: [v] * 10 for k, v in gen.items()}}))
    wh.write_table("pivots_adv", pa.table({"turn_id": [f"u{i}" for i in range(0, 20, 4)],
                                           **{k: [v] * 5 for k, v in gen.items()}}))
    wh.write_table("pivots_cand", pa.table({"turn_id": ["u1"], **{k: [v] for k, v in gen.items()}}))
    return wh


def test_evaluation_sets_are_held_out_nested_and_independent_of_the_trained_set(tmp_path):
    from pivot_assets.training.split import held_out_trajectories

    wh = _profile_warehouse(tmp_path)
    sets = evaluation_sets(wh, _cfg(tmp_path, training={"eval_fraction": 0.5, "set": "adv"}))
    assert sets == evaluation_sets(wh, _cfg(tmp_path, training={"eval_fraction": 0.5, "set": "cand"}))
    held = held_out_trajectories(wh, 0.5, 0)
    assert sets["profiled"] == sorted(f"u{t[1:]}" for t in held)
    assert set(sets["adv"]) <= set(sets["mixed"]) <= set(sets["profiled"])
    assert sets["adv"] == [u for u in sets["profiled"] if int(u[1:]) % 4 == 0]
    capped = evaluation_sets(wh, _cfg(tmp_path, training={"eval_fraction": 0.5, "eval_max_turns": 2}))
    assert len(capped["mixed"]) <= 2 and set(capped["adv"]) <= set(capped["profiled"])
