"""The split as training and evaluation use it (Dagster-free): thin over core/split.py, where the three-way split
by source conversation (warm-up / training pool / held out) is defined, so profiling can read it too.

Held out = hash(seed, conversation) < eval_fraction, per conversation: whatever subset of trajectories a stage
reads, every trajectory of one conversation lands on the same side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from pivot_assets.core.split import HELD_OUT, POOL, WARMUP, ConversationSplit, by_trajectory, trajectory_groups
from pivot_assets.core.warehouse import Warehouse

if TYPE_CHECKING:
    from pivot_assets.core.config import PivotConfig

__all__ = ["HELD_OUT", "POOL", "WARMUP", "ConversationSplit", "trajectory_groups", "split_by_trajectory",
           "split_by_group", "held_out_trajectories", "split_fingerprint", "config_split", "not_in_pool"]


def split_by_trajectory(trajectory_ids: Iterable[str], eval_fraction: float, seed: int = 0) -> set[str]:
    """The held-out ids among `trajectory_ids`, each its own group: those whose hash(seed, id) < eval_fraction.

    The decision is made per id, independently of which other ids are passed; the held-out share is
    eval_fraction in expectation, not exactly. For grouped trajectories use split_by_group.
    """
    return by_trajectory(trajectory_ids, ConversationSplit(eval_fraction, 0.0, seed), HELD_OUT)


def split_by_group(groups: Mapping[str, str | None], eval_fraction: float, seed: int = 0) -> set[str]:
    """The held-out trajectory ids of {trajectory_id: group key}: a trajectory is held out iff its group is
    (a missing key is the trajectory's own id), so one conversation never lands on both sides."""
    return ConversationSplit(eval_fraction, 0.0, seed).members(groups, HELD_OUT)


def held_out_trajectories(wh: Warehouse, eval_fraction: float, seed: int) -> set[str]:
    """The held-out trajectory ids of the warehouse: whole source conversations."""
    return ConversationSplit(eval_fraction, 0.0, seed).trajectories(wh, HELD_OUT)


def split_fingerprint(wh: Warehouse, split: ConversationSplit) -> str:
    """A short hash of the held-out (and warm-up) sets: part of every model key and evaluation key."""
    return split.fingerprint(wh)


def config_split(cfg: "PivotConfig") -> ConversationSplit:
    return ConversationSplit.from_config(cfg)


def not_in_pool(wh: Warehouse, cfg: "PivotConfig") -> set[str]:
    """The trajectories no GRPO run or ablation arm may train on: the held-out and the warm-up conversations."""
    return config_split(cfg).trajectories(wh, HELD_OUT, WARMUP)
