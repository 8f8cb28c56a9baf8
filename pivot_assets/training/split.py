"""The held-out split (Dagster-free): by source conversation, made once from the seed, used by SFT, GRPO and
evaluation alike.

The unit is the *source conversation*: `trajectories.conversation_id`, the group key every format adapter
fills (NeMo-Gym pivot rows cut from one conversation share it). A warehouse written before that column
existed (or a row where it is null) falls back to the trajectory's own id, so the split works before and after.
Whether a group is held out is decided from hash(seed, group key) alone, so every stage, whatever subset of
trajectories it reads, puts every trajectory of one conversation on the same side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pivot_assets.core.ids import seeded_unit
from pivot_assets.core.warehouse import Warehouse

GROUP_COLUMN = "conversation_id"


def _check_fraction(eval_fraction: float) -> None:
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")


def is_held_out(group_key: str, eval_fraction: float, seed: int = 0) -> bool:
    return seeded_unit(seed, str(group_key)) < eval_fraction


def split_by_trajectory(trajectory_ids: Iterable[str], eval_fraction: float, seed: int = 0) -> set[str]:
    """The held-out ids among `trajectory_ids`, each its own group: those whose hash(seed, id) < eval_fraction.

    The decision is made per id, independently of which other ids are passed; the held-out share is
    eval_fraction in expectation, not exactly. For grouped trajectories use split_by_group.
    """
    _check_fraction(eval_fraction)
    return {t for t in set(trajectory_ids) if is_held_out(t, eval_fraction, seed)}


def split_by_group(groups: Mapping[str, str | None], eval_fraction: float, seed: int = 0) -> set[str]:
    """The held-out trajectory ids of {trajectory_id: group key}: a trajectory is held out iff its group is
    (a missing key is the trajectory's own id), so one conversation never lands on both sides."""
    _check_fraction(eval_fraction)
    return {t for t, g in groups.items() if is_held_out(g or t, eval_fraction, seed)}


def trajectory_groups(wh: Warehouse) -> dict[str, str]:
    """{trajectory_id: source-conversation key} from the trajectories table (conversation_id when the column
    exists and is set, else the trajectory id)."""
    import pyarrow.parquet as pq

    columns = ["trajectory_id"]
    if wh.table_path("trajectories").exists():
        names = pq.read_schema(wh.table_path("trajectories")).names
    else:
        names = wh.read_arrow("trajectories").column_names
    if GROUP_COLUMN in names:
        columns.append(GROUP_COLUMN)
    table = wh.read_arrow("trajectories", columns).to_pydict()
    groups = table.get(GROUP_COLUMN) or [None] * len(table["trajectory_id"])
    return {t: (g or t) for t, g in zip(table["trajectory_id"], groups)}


def held_out_trajectories(wh: Warehouse, eval_fraction: float, seed: int) -> set[str]:
    """The held-out trajectory ids of the warehouse: whole source conversations (see the module docstring)."""
    return split_by_group(trajectory_groups(wh), eval_fraction, seed)


def split_fingerprint(wh: Warehouse, eval_fraction: float, seed: int) -> str:
    """A short hash of the held-out set: part of every model key and evaluation key."""
    from pivot_assets.core.ids import canonical_json, short_hash

    return short_hash(canonical_json(sorted(held_out_trajectories(wh, eval_fraction, seed))))
