"""The three-way split by source conversation (Dagster-free): warm-up / training pool / held out.

The unit is the *source conversation*: `trajectories.conversation_id`, the group key every format adapter fills
(NeMo-Gym pivot rows cut from one conversation share it; one BFCL item is one conversation). A warehouse written
before that column existed (or a row where it is null) falls back to the trajectory's own id.

One uniform number u = seeded_unit(seed, conversation key) places a conversation:

    u < eval_fraction                                    held out   evaluation only: no stage trains on it
    eval_fraction <= u < eval_fraction + warmup_fraction warm-up    the SFT warm-up (the reference) trains on it;
                                                                    profiling skips it
    otherwise                                            pool       profiled; the pivot sets and every GRPO/SFT
                                                                    arm train on it

The decision is per conversation and depends on nothing else, so every stage, whatever subset of trajectories it
reads, puts every trajectory of one conversation on the same side; the held-out side of a config is the same with
and without a warm-up split. warmup_fraction 0 is the two-way split: the warm-up then trains on the pool.
Profiling lives below training, so the split lives here, where both read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pivot_assets.core.ids import canonical_json, seeded_unit, short_hash

if TYPE_CHECKING:
    from pivot_assets.core.config import PivotConfig
    from pivot_assets.core.warehouse import Warehouse

HELD_OUT, WARMUP, POOL = "held_out", "warmup", "pool"
GROUP_COLUMN = "conversation_id"


@dataclass(frozen=True)
class ConversationSplit:
    """Where each source conversation goes (see the module docstring)."""

    eval_fraction: float
    warmup_fraction: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if not 0.0 <= self.warmup_fraction < 1.0 or self.eval_fraction + self.warmup_fraction >= 1.0:
            raise ValueError(f"warmup_fraction {self.warmup_fraction} + eval_fraction {self.eval_fraction} must "
                             "leave a training pool (their sum below 1)")

    @classmethod
    def from_config(cls, cfg: "PivotConfig") -> "ConversationSplit":
        return cls(cfg.training.eval_fraction, cfg.training.warmup_fraction, cfg.training.seed)

    def role(self, group_key: str) -> str:
        u = seeded_unit(self.seed, str(group_key))
        if u < self.eval_fraction:
            return HELD_OUT
        return WARMUP if u < self.eval_fraction + self.warmup_fraction else POOL

    def roles(self, groups: Mapping[str, str | None]) -> dict[str, str]:
        """{trajectory_id: role} for {trajectory_id: group key} (a missing key is the trajectory's own id)."""
        return {t: self.role(g or t) for t, g in groups.items()}

    def members(self, groups: Mapping[str, str | None], *roles: str) -> set[str]:
        """The trajectory ids of `groups` whose conversation has one of `roles`."""
        return {t for t, r in self.roles(groups).items() if r in roles}

    @property
    def identity(self) -> list:
        """What a model or evaluation keyed by this split depends on (a two-way split keeps its old identity)."""
        return [self.eval_fraction, self.seed] + ([self.warmup_fraction] if self.warmup_fraction else [])

    # -- over a warehouse ---------------------------------------------------------------------------
    def trajectories(self, wh: "Warehouse", *roles: str) -> set[str]:
        """The warehouse's trajectory ids with one of `roles` (whole source conversations)."""
        return self.members(trajectory_groups(wh), *roles)

    def not_in_pool(self, wh: "Warehouse") -> set[str]:
        """The trajectories no GRPO run or ablation arm may train on: the held-out and the warm-up conversations."""
        return self.trajectories(wh, HELD_OUT, WARMUP)

    def fingerprint(self, wh: "Warehouse") -> str:
        """A short hash of the warehouse's held-out (and warm-up) sets: part of every model and evaluation key."""
        groups = trajectory_groups(wh)
        sides = sorted(self.members(groups, HELD_OUT))
        if self.warmup_fraction:
            return short_hash(canonical_json({"held_out": sides, "warmup": sorted(self.members(groups, WARMUP))}))
        return short_hash(canonical_json(sides))


def trajectory_groups(wh: "Warehouse") -> dict[str, str]:
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


def by_trajectory(trajectory_ids: Iterable[str], split: ConversationSplit, *roles: str) -> set[str]:
    """The ids among `trajectory_ids` with one of `roles`, each id its own conversation."""
    return split.members({t: t for t in set(trajectory_ids)}, *roles)
