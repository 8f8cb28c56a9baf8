"""The held-out split (Dagster-free): made once from the seed, used by SFT, GRPO and evaluation alike."""

from __future__ import annotations

from collections.abc import Iterable

from pivot_assets.core.ids import seeded_unit
from pivot_assets.core.warehouse import Warehouse


def split_by_trajectory(trajectory_ids: Iterable[str], eval_fraction: float, seed: int = 0) -> set[str]:
    """The held-out trajectory ids: those whose hash(seed, id) falls below eval_fraction.

    The decision is made per id, independently of which other ids are passed, so the SFT stage (all
    trajectories), GRPO (pivot trajectories) and pivot_eval agree on every trajectory's side, and no
    trajectory is ever on both sides. The held-out share is eval_fraction in expectation, not exactly.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    return {t for t in set(trajectory_ids) if seeded_unit(seed, str(t)) < eval_fraction}


def held_out_trajectories(wh: Warehouse, eval_fraction: float, seed: int) -> set[str]:
    ids = wh.read("trajectories", ["trajectory_id"])["trajectory_id"].to_list()
    return split_by_trajectory(ids, eval_fraction, seed)
