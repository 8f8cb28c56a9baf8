"""The held-out split: by source conversation, made per group from the seed, the same whoever asks."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pivot_assets.core.split import (
    HELD_OUT,
    POOL,
    WARMUP,
    ConversationSplit,
    by_trajectory,
    trajectory_groups,
)
from pivot_assets.core.warehouse import Warehouse


def split_by_trajectory(ids, eval_fraction, seed=0):
    return by_trajectory(ids, ConversationSplit(eval_fraction, 0.0, seed), HELD_OUT)


def split_by_group(groups, eval_fraction, seed=0):
    return ConversationSplit(eval_fraction, 0.0, seed).members(groups, HELD_OUT)


def held_out_trajectories(wh, eval_fraction, seed):
    return ConversationSplit(eval_fraction, 0.0, seed).trajectories(wh, HELD_OUT)


def test_split_is_deterministic_per_trajectory_and_near_the_fraction():
    ids = [f"traj-{i}" for i in range(2000)]
    held = split_by_trajectory(ids, 0.1, seed=0)
    assert held == split_by_trajectory(list(reversed(ids)), 0.1, seed=0)
    assert 0.07 < len(held) / len(ids) < 0.13
    # a subset (e.g. the pivots' trajectories) gets the same decision for every id it holds
    subset = ids[::7]
    assert split_by_trajectory(subset, 0.1, seed=0) == held & set(subset)
    assert split_by_trajectory(ids, 0.1, seed=1) != held
    assert split_by_trajectory(ids, 0.0) == set()
    with pytest.raises(ValueError):
        split_by_trajectory(ids, 1.0)


def test_pivot_rows_of_one_conversation_land_on_one_side():
    groups = {f"row-{i}": f"conv-{i // 5}" for i in range(1000)}  # NeMo-Gym: 5 pivot rows cut from each conversation
    held = split_by_group(groups, 0.3, seed=0)
    for conv in {g for g in groups.values()}:
        members = {t for t, g in groups.items() if g == conv}
        assert members <= held or not (members & held), conv
    assert 0.2 < len(held) / len(groups) < 0.4
    # an ungrouped row (no key) is its own group: the same decision split_by_trajectory makes
    assert split_by_group({"a": None, "b": ""}, 0.5, seed=3) == split_by_trajectory(["a", "b"], 0.5, seed=3)


def test_the_warehouse_split_reads_conversation_id_and_falls_back_without_it(tmp_path):
    wh = Warehouse(tmp_path / "old")
    wh.write_table("trajectories", pa.table({"trajectory_id": [f"t{i}" for i in range(200)]}))
    assert trajectory_groups(wh)["t3"] == "t3"
    assert held_out_trajectories(wh, 0.25, 0) == split_by_trajectory([f"t{i}" for i in range(200)], 0.25, 0)

    wh = Warehouse(tmp_path / "new")
    wh.write_table("trajectories", pa.table({"trajectory_id": [f"t{i}" for i in range(200)],
                                             "conversation_id": [f"c{i // 4}" if i % 10 else None for i in range(200)]}))
    groups = trajectory_groups(wh)
    assert groups["t1"] == "c0" and groups["t10"] == "t10"  # a null key falls back to the trajectory id
    held = held_out_trajectories(wh, 0.25, 0)
    assert held == split_by_group(groups, 0.25, 0)
    for conv in {g for g in groups.values() if g.startswith("c")}:
        members = {t for t, g in groups.items() if g == conv}
        assert members <= held or not (members & held)


def test_three_way_split_is_disjoint_by_conversation_and_stable_under_subsets():
    groups = {f"t{i}": f"c{i // 3}" for i in range(3000)}
    split = ConversationSplit(eval_fraction=0.3, warmup_fraction=0.3, seed=5)
    roles = split.roles(groups)
    sides = {r: {t for t, x in roles.items() if x == r} for r in (HELD_OUT, WARMUP, POOL)}
    assert set().union(*sides.values()) == set(groups) and sum(map(len, sides.values())) == len(groups)
    for role, share in ((HELD_OUT, 0.3), (WARMUP, 0.3), (POOL, 0.4)):
        assert abs(len(sides[role]) / len(groups) - share) < 0.05, role
    for conv in {g for g in groups.values()}:  # a conversation never spans two sides
        assert len({roles[t] for t, g in groups.items() if g == conv}) == 1
    # a subset of trajectories (what one stage reads) gets the same decisions
    subset = {t: g for t, g in list(groups.items())[::7]}
    assert split.roles(subset) == {t: roles[t] for t in subset}
    # the held-out side is the two-way split's: adding a warm-up split never moves an evaluation turn
    assert sides[HELD_OUT] == split_by_group(groups, 0.3, seed=5)
    assert ConversationSplit(0.3, 0.0, 5).members(groups, WARMUP) == set()
    with pytest.raises(ValueError, match="training pool"):
        ConversationSplit(0.5, 0.5, 0)


def test_not_in_pool_is_the_held_out_and_the_warm_up_conversations(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    wh.write_table("trajectories", pa.table({"trajectory_id": [f"t{i}" for i in range(300)],
                                             "conversation_id": [f"c{i // 3}" for i in range(300)]}))
    split = ConversationSplit(0.3, 0.3, 5)
    excluded = split.not_in_pool(wh)
    assert excluded == split.trajectories(wh, HELD_OUT) | split.trajectories(wh, WARMUP)
    assert excluded.isdisjoint(split.trajectories(wh, POOL)) and excluded


def test_profiling_skips_the_warm_up_conversations(tmp_path):
    from pivot_assets.core.split import WARMUP, ConversationSplit
    from pivot_assets.profiling.profiler import select_turns

    wh = Warehouse(tmp_path / "wh")
    ids = [f"t{i}" for i in range(200)]
    wh.write_table("trajectories", pa.table({"trajectory_id": ids, "conversation_id": [f"c{i // 2}" for i in range(200)]}))
    wh.write_table("turns", pa.table({"turn_id": [f"u{i:03d}" for i in range(200)], "trajectory_id": ids}))
    split = ConversationSplit(0.2, 0.4, 1)
    warmup = split.trajectories(wh, WARMUP)
    assert 40 < len(warmup) < 120
    wanted = select_turns(wh, None, split)
    assert set(wanted) == {f"u{i:03d}" for i in range(200) if f"t{i}" not in warmup}
    assert select_turns(wh, None, ConversationSplit(0.2, 0.0, 1)) == select_turns(wh, None) == sorted(
        f"u{i:03d}" for i in range(200))
    assert select_turns(wh, 5, split) == wanted[:5]
