"""The held-out split: made per trajectory from the seed, the same whoever asks."""

from __future__ import annotations

import pytest

from pivot_assets.training.split import split_by_trajectory

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


