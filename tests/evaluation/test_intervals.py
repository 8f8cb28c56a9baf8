"""Intervals (the hierarchical bootstrap), paired differences (evaluation.compare, pair_rows), and the fixed
evaluation sets."""

from __future__ import annotations

import pyarrow as pa
import pytest
import yaml

from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.evaluation.heldout import (
    Policy,
    compare,
    evaluation_sets,
    hierarchical_resamples,
    pair_rows,
    resampled_mean,
)


def _cfg(tmp_path, **sections):
    path = tmp_path / "pivot.yaml"
    path.write_text(yaml.safe_dump({"warehouse": "./wh", **sections}))
    return load_config(path)


def _interval(values, groups, name="adv", resamples=1000):
    import numpy as np

    values = np.asarray(values, dtype=float)
    values = values if values.ndim == 2 else values[None, :]
    return resampled_mean(values, hierarchical_resamples(groups, values.shape[0], resamples, name))


def test_bootstrap_interval_brackets_the_mean_is_seeded_and_narrows_with_n():
    values = [1.0, 0.0] * 10
    groups = [f"c{i}" for i in range(20)]
    mean, low, high = _interval(values, groups)
    assert mean == 0.5 and low < 0.5 < high
    assert (low, high) == _interval(values, groups)[1:]  # fixed by (set, seeds, groups)
    big = [1.0, 0.0] * 200
    _, low2, high2 = _interval(big, [f"c{i}" for i in range(400)])
    assert high2 - low2 < (high - low) / 3


def test_the_middle_level_is_the_conversation():
    """Turns of one conversation move together: 10 conversations of 8 identical turns give the interval of 10
    units, not of 80; the bootstrap over turns alone would claim far more certainty."""
    import numpy as np

    rng = np.random.default_rng(0)
    per_conversation = rng.random(10).round(2)
    values = np.repeat(per_conversation, 8)
    grouped = _interval(values, [f"c{i // 8}" for i in range(80)])
    as_turns = _interval(values, [f"t{i}" for i in range(80)])
    ten = _interval(per_conversation, [f"c{i}" for i in range(10)])
    assert grouped[2] - grouped[1] > 1.8 * (as_turns[2] - as_turns[1])
    assert abs((grouped[2] - grouped[1]) - (ten[2] - ten[1])) < 0.25 * (ten[2] - ten[1])


def test_intervals_shrink_with_more_seeds_and_more_conversations():
    import numpy as np

    def width(seeds, conversations, seed_effect=0.2, conversation_effect=0.3):
        # seed effects of +-seed_effect, conversation effects of +-conversation_effect, 3 turns per conversation
        seed = np.array([seed_effect * (-1) ** i for i in range(seeds)])[:, None]
        conv = np.repeat([conversation_effect * (-1) ** i for i in range(conversations)], 3)[None, :]
        _, low, high = _interval(0.5 + seed + conv, [f"c{i // 3}" for i in range(conversations * 3)])
        return high - low

    assert width(8, 40) < 0.75 * width(2, 40)
    assert width(4, 160, seed_effect=0.02) < 0.6 * width(4, 20, seed_effect=0.02)


def test_pairs_resample_the_same_units_and_find_a_known_difference():
    import numpy as np

    rng = np.random.default_rng(2)
    groups = [f"c{i // 4}" for i in range(200)]
    b = rng.random((4, 200))
    # a shift by a constant: with the same seeds, conversations and turns on both sides the paired interval has
    # no width at all; resampling each side on its own would give a wide one
    draws = hierarchical_resamples(groups, 4, 500, "adv")
    mean, low, high = resampled_mean((b + 0.2) - b, draws)
    assert (mean, low, high) == pytest.approx((0.2, 0.2, 0.2))
    _, a_low, a_high = resampled_mean(b + 0.2, draws)
    assert a_high - a_low > 0.05
    same = hierarchical_resamples(groups, 4, 500, "adv")
    assert (draws.seeds == same.seeds).all() and (draws.units == same.units).all()
    assert not (hierarchical_resamples(groups, 4, 500, "mixed").units == draws.units).all()
    # a known difference under noise: a = b + 0.1 + noise; the interval covers 0.1 and excludes 0
    a = b + 0.1 + rng.normal(0, 0.2, size=b.shape)
    mean, low, high = resampled_mean(a - b, draws)
    assert low < 0.1 < high and low > 0
    # no difference: the interval covers 0
    c = b + rng.normal(0, 0.2, size=b.shape)
    _, low, high = resampled_mean(c - b, draws)
    assert low < 0 < high


def _scores(turns: dict, ood: list, draws=(0,)) -> dict:
    return {"turns": {d: turns for d in draws}, "ood": ood, "seconds": 1.0, "model_fp": "fp"}


def test_compare_gives_paired_deltas_against_the_reference_pooled_arms_and_pairs(tmp_path):
    cfg = _cfg(tmp_path)
    sets = {"profiled": ["a", "b", "c", "d"], "mixed": ["a", "b", "c"], "adv": ["a", "b"]}
    ref = _scores({"a": 0.0, "b": 0.5, "c": 1.0, "d": 0.25}, [1.0, 0.0, 1.0, 0.0], draws=(0, 1))
    better = _scores({"a": 0.5, "b": 1.0, "c": 1.0, "d": 0.75}, [1.0, 0.0, 1.0, 0.0])
    other = _scores({"a": 0.0, "b": 1.0, "c": 1.0, "d": 0.25}, [1.0, 1.0, 1.0, 0.0], draws=(1,))
    policies = [(Policy("reference", "r", draws=(0, 1)), ref), (Policy("x/s0", "m0", "x", 0, (0,)), better),
                (Policy("x/s1", "m1", "x", 1, (1,)), other), (Policy("y/s0", "n0", "y", 0, (0,)), ref),
                (Policy("y/s1", "n1", "y", 1, (1,)), ref)]
    pooled = {"x": ["x/s0", "x/s1"], "y": ["y/s0", "y/s1"]}
    groups = {"a": "c1", "b": "c1", "c": "c2", "d": "c3"}
    rows = compare(cfg, policies, sets, "key", pooled=pooled, groups=groups)
    by = {(r["policy"], r["eval_set"]): r for r in rows}
    assert {s for _, s in by} == {"profiled", "mixed", "adv", "ood"}
    assert by[("reference", "adv")]["delta"] == 0.0 and by[("reference", "adv")]["delta_low"] == 0.0
    assert by[("reference", "adv")]["n_seeds"] == 2 and by[("x/s0", "adv")]["n_seeds"] == 1
    assert by[("x/s0", "adv")]["accuracy"] == 0.75 and by[("x/s0", "adv")]["delta"] == 0.5
    assert by[("x/s0", "profiled")]["delta"] == pytest.approx(0.375)
    assert by[("x/s0", "profiled")]["n_conversations"] == 3 and by[("x/s0", "ood")]["n_conversations"] == 4
    # every turn improved by the same amount: the paired interval has no width, the unpaired one does
    assert by[("x/s0", "adv")]["delta_low"] == by[("x/s0", "adv")]["delta_high"] == 0.5
    assert by[("x/s0", "adv")]["ci_low"] < by[("x/s0", "adv")]["ci_high"]
    pooled_row = by[("x", "adv")]
    assert pooled_row["seed"] is None and pooled_row["arm"] == "x" and pooled_row["accuracy"] == pytest.approx(0.625)
    assert by[("x", "ood")]["accuracy"] == pytest.approx(0.625) and by[("x", "ood")]["n"] == 4
    pairs = pair_rows(cfg, policies, sets, "key", pooled, [("x", "y"), ("x", "missing")], groups, primary="adv")
    assert {(p["arm_a"], p["arm_b"]) for p in pairs} == {("x", "y")}
    adv = next(p for p in pairs if p["eval_set"] == "adv")
    assert adv["primary"] and adv["n_seeds"] == 2 and adv["delta"] == pytest.approx(0.625 - 0.25)
    # x - y on the same draws equals (x - reference) - (y - reference): y is the reference here
    assert adv["delta"] == pytest.approx(by[("x", "adv")]["delta"])
    assert (adv["delta_low"], adv["delta_high"]) == pytest.approx((by[("x", "adv")]["delta_low"],
                                                                   by[("x", "adv")]["delta_high"]))


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
    from pivot_assets.core.split import HELD_OUT, ConversationSplit

    wh = _profile_warehouse(tmp_path)
    sets = evaluation_sets(wh, _cfg(tmp_path, training={"eval_fraction": 0.5, "set": "adv"}))
    assert sets == evaluation_sets(wh, _cfg(tmp_path, training={"eval_fraction": 0.5, "set": "cand"}))
    held = ConversationSplit(0.5, 0.0, 0).trajectories(wh, HELD_OUT)
    assert sets["profiled"] == sorted(f"u{t[1:]}" for t in held)
    assert set(sets["adv"]) <= set(sets["mixed"]) <= set(sets["profiled"])
    assert sets["adv"] == [u for u in sets["profiled"] if int(u[1:]) % 4 == 0]
    capped = evaluation_sets(wh, _cfg(tmp_path, training={"eval_fraction": 0.5}, evaluation={"max_turns": 2}))
    assert len(capped["mixed"]) <= 2 and set(capped["adv"]) <= set(capped["profiled"])


def test_pivot_eval_plot_has_a_panel_for_every_evaluation_set(tmp_path):
    """adv, mixed, profiled and ood each get a panel (420 px wide each at the plot's size)."""
    import struct

    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.evaluation.assets import intervals_plot

    rows = [{"policy": p, "eval_set": s, "accuracy": 0.5, "ci_low": 0.4, "ci_high": 0.6}
            for p in ("reference", "grpo") for s in ("adv", "mixed", "profiled", "ood")]
    wh = Warehouse(str(tmp_path / "wh"))
    intervals_plot(wh, rows, name="pivot_eval")
    png = (wh.root / "plots" / "pivot_eval.png").read_bytes()
    width = struct.unpack(">I", png[16:20])[0]
    assert width == 4 * 420
