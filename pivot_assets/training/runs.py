"""Training runs (Dagster-free): which model each run starts from, where it saves, the key of everything it
depends on, and the completion marker that lets a rerun with the same key skip the work."""

from __future__ import annotations

from pathlib import Path

from pivot_assets.core.catalog import SET_TABLES
from pivot_assets.core.config import PivotConfig
from pivot_assets.core.hardware import resolve_dtype
from pivot_assets.core.ids import canonical_json, seeded_int, short_hash
from pivot_assets.core.warehouse import Warehouse

MARKER = ".pivot_key"
# Bounds applied when run_grpo(cpu_smoke=True): the smoke run must finish in minutes on 2 cores.
CPU_SMOKE_CAPS = {"steps": 8, "num_generations": 4, "max_completion_length": 48}
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


def reference_model(wh: Warehouse, cfg: PivotConfig) -> str:
    """The policy that profiled (the reference of every comparison): the SFT warm-up when policy.model is
    `sft`, else policy.model (a served model is evaluated as the same name/dir through transformers)."""
    return str(wh.model_dir(SFT_DIR)) if cfg.policy.model == "sft" else cfg.policy.model


# Evaluation-only keys of the training section: changing them never retrains a model.
EVAL_ONLY = ("eval_k", "eval_seed", "eval_max_turns", "bootstrap", "ood_probe", "ood_max_items")
EVAL_SEED_NAMESPACE = "pivot-eval"


def eval_seed(cfg: PivotConfig) -> int:
    """The sampling seed of every evaluation: seeded_int("pivot-eval", training.eval_seed).

    Backends seed each turn's generator with seeded_int(seed, turn_id), so evaluation draws are a stream
    apart from profiling's (seed = policy.seed, a small integer) and the same for every policy evaluated:
    a turn picked because the reference scored low on it is re-drawn fresh, for the reference too.
    """
    seed = seeded_int(EVAL_SEED_NAMESPACE, str(cfg.training.eval_seed))
    if seed == cfg.policy.seed:  # astronomically unlikely; never reuse profiling's draws
        seed = seeded_int(EVAL_SEED_NAMESPACE, f"{cfg.training.eval_seed}+1")
    return seed


def sft_identity(cfg: PivotConfig) -> dict:
    """What the SFT model depends on in the config (the code version of sft_policy): the dtype as resolved on
    the device SFT runs on (policy.device)."""
    return {"sft": {**cfg.sft.model_dump(), "dtype": resolve_dtype(cfg.sft.dtype, cfg.policy.device).dtype},
            "split": [cfg.training.eval_fraction, cfg.training.seed]}


def model_fingerprint(model: str, cfg: PivotConfig) -> str:
    """A model's identity under the prompt format every stage renders with (policy.chat_template,
    policy.thinking): the same weights rendered with another template train and sample differently."""
    from pivot_assets.policies.models import PromptFormat, policy_fingerprint

    return policy_fingerprint(model, PromptFormat.from_policy(cfg.policy))


def sft_key(wh: Warehouse, cfg: PivotConfig) -> str:
    return short_hash(canonical_json({**sft_identity(cfg), "data": wh.data_version("trajectories"),
                                      "base": model_fingerprint(base_model(cfg), cfg)}))


def training_identity(cfg: PivotConfig) -> dict:
    """The training section minus evaluation-only keys (changing eval_k must not retrain), dtype resolved."""
    section = {k: v for k, v in cfg.training.model_dump().items() if k not in EVAL_ONLY}
    if section.get("reward_verifier") is None:
        section.pop("reward_verifier", None)  # the default keeps the keys of models trained before it existed
    return {**section, "dtype": resolve_dtype(cfg.training.dtype).dtype}


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def grpo_key(wh: Warehouse, cfg: PivotConfig, verifier_fp: str) -> str:
    from .split import split_fingerprint

    return short_hash(canonical_json({
        "training": training_identity(cfg), "pivots": wh.data_version(SET_TABLES[cfg.training.set]),
        "init": model_fingerprint(init_model(wh, cfg), cfg), "verifier": verifier_fp, "cpu_smoke": not has_cuda(),
        "split": split_fingerprint(wh, cfg.training.eval_fraction, cfg.training.seed),
    }))


# -- the ablation's arms ------------------------------------------------------------------------------
ARM_SPECS = {  # arm -> (trainer, pivot set, reward): the paper's ablation rows
    "grpo_adv": ("grpo", "adv", "profiling"),
    "grpo_cand": ("grpo", "cand", "profiling"),
    "grpo_mixed": ("grpo", "mixed", "profiling"),
    "grpo_adv_exact": ("grpo", "adv", "exact"),
    "sft_same_data": ("sft", "adv", None),  # per-turn SFT on the same D_adv turns GRPO on D_adv trains on
}


def arm_dir(arm: str, seed: int) -> str:
    """models/<this>: one folder per (arm, seed), so no arm or seed ever overwrites another."""
    return f"ablation_{arm}_s{int(seed)}"


def ablation_steps(cfg: PivotConfig) -> int:
    """The update budget of every arm: ablation.steps or training.steps, with the CPU GRPO cap applied to all
    arms alike (the same number of optimizer steps for SFT and GRPO)."""
    steps = (cfg.ablation.steps if cfg.ablation and cfg.ablation.steps else None) or cfg.training.steps
    return min(steps, CPU_SMOKE_CAPS["steps"]) if not has_cuda() else steps


def arm_key(wh: Warehouse, cfg: PivotConfig, arm: str, seed: int, verifier_fp: str | None) -> str:
    """Everything one arm's model depends on: arm, seed, budget, its pivot set's data, init, reward, split."""
    from .split import split_fingerprint

    trainer, pivot_set, _ = ARM_SPECS[arm]
    section = training_identity(cfg) if trainer == "grpo" else sft_identity(cfg)
    return short_hash(canonical_json({
        "arm": arm, "seed": seed, "steps": ablation_steps(cfg), "section": section,
        "sft_lr": cfg.ablation.sft_learning_rate if cfg.ablation else None,
        "pivots": wh.data_version(SET_TABLES[pivot_set]), "init": model_fingerprint(init_model(wh, cfg), cfg),
        "verifier": verifier_fp, "split": split_fingerprint(wh, cfg.training.eval_fraction, cfg.training.seed),
        "cpu_smoke": not has_cuda(),
    }))
