"""What every stage of one run shares, resolved once from its config and passed down: the warehouse and the verifier
sets (profiling, GRPO's reward, the ablation's exact match; a bad verifier is a one-line ConfigError here).

Built once per process that runs a stage: the Dagster definitions and every `pivot` command (pivot_jobs), a launched
training rank (training/launched.py), a Ray shard job (profiling/ray_job.py) and the ablation's and evaluation's
worker processes. Each takes it from `resolve_shared(cfg)` and never opens the warehouse or builds verifiers again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pivot_assets.core.config import PivotConfig
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.verifiers import VerifierSets


@dataclass(frozen=True)
class Shared:
    cfg: PivotConfig
    warehouse: Warehouse
    verifiers: VerifierSets


def resolve_shared(cfg: PivotConfig, warehouse_root: str | Path | None = None) -> Shared:
    """`warehouse_root`: the warehouse a worker process was handed (else the config's)."""
    root = cfg.warehouse_dir if warehouse_root is None else warehouse_root
    return Shared(cfg, Warehouse(root), VerifierSets.from_config(cfg))
