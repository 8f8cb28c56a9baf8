"""Training runs (Dagster-free): which model each run starts from, where it saves, the key of everything it
depends on, and the completion marker that lets a rerun with the same key skip the work."""

from __future__ import annotations

from pathlib import Path

from pivot_assets.core.catalog import SET_TABLES
from pivot_assets.core.config import PivotConfig
from pivot_assets.core.hardware import resolve_dtype
from pivot_assets.core.ids import canonical_json, short_hash
from pivot_assets.core.warehouse import Warehouse

MARKER = ".pivot_key"
EMBEDDED = "embedded"
SFT_DIR, GRPO_DIR = "sft_policy", "grpo_policy"


def base_model(cfg: PivotConfig) -> str:
    """The pretrained policy everything starts from: `policy.model`, or the embedded model when the
    reference policy is the SFT warm-up itself (`policy.model: sft`)."""
    return EMBEDDED if cfg.policy.model == "sft" else cfg.policy.model


def init_model(wh: Warehouse, cfg: PivotConfig) -> str:
    return str(wh.model_dir(SFT_DIR)) if cfg.training.init == "sft" else base_model(cfg)


def read_marker(path: Path) -> str | None:
    marker = path / MARKER
    return marker.read_text().strip() if marker.is_file() else None


def write_marker(path: Path, key: str) -> None:
    """Written last: a crash before it means "not done", never a model paired with stale tables."""
    (path / MARKER).write_text(key + "\n")


def is_done(path: Path, key: str) -> bool:
    return read_marker(path) == key


def sft_identity(cfg: PivotConfig) -> dict:
    """What the SFT model depends on in the config (the code version of sft_policy)."""
    return {"sft": {**cfg.sft.model_dump(), "dtype": resolve_dtype(cfg.sft.dtype).dtype},
            "split": [cfg.training.eval_fraction, cfg.training.seed]}


def sft_key(wh: Warehouse, cfg: PivotConfig) -> str:
    from pivot_assets.policies.models import policy_fingerprint

    return short_hash(canonical_json({**sft_identity(cfg), "data": wh.data_version("trajectories"),
                                      "base": policy_fingerprint(base_model(cfg))}))


def training_identity(cfg: PivotConfig) -> dict:
    """The training section minus evaluation-only keys (changing eval_k must not retrain), dtype resolved."""
    section = {k: v for k, v in cfg.training.model_dump().items() if k != "eval_k"}
    return {**section, "dtype": resolve_dtype(cfg.training.dtype).dtype}


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def grpo_key(wh: Warehouse, cfg: PivotConfig, verifier_fp: str) -> str:
    from pivot_assets.policies.models import policy_fingerprint

    return short_hash(canonical_json({
        "training": training_identity(cfg), "pivots": wh.data_version(SET_TABLES[cfg.training.set]),
        "init": policy_fingerprint(init_model(wh, cfg)), "verifier": verifier_fp, "cpu_smoke": not has_cuda(),
    }))
