"""Training runs (Dagster-free): which model each run starts from, where it saves, the key of everything it
depends on, and the completion marker that lets a rerun with the same key skip the work."""

from __future__ import annotations

import math
from pathlib import Path

from pivot_assets.core.catalog import SET_TABLES
from pivot_assets.core.config import PivotConfig
from pivot_assets.core import hardware, identity
from pivot_assets.core.identity import fingerprint
from pivot_assets.core.warehouse import Warehouse

MARKER = ".pivot_key"
# Bounds applied when run_grpo(cpu_smoke=True): the smoke run must finish in minutes on 2 cores.
CPU_SMOKE_CAPS = {"steps": 8, "num_generations": 4, "max_completion_length": 48}
SFT_DIR, GRPO_DIR = "sft_policy", "grpo_policy"


def base_model(cfg: PivotConfig) -> str:
    """The pretrained policy everything starts from: `policy.model`, or the warm-up's own start (`sft.model`)
    when the reference policy is the SFT warm-up itself (`policy.model: sft`)."""
    return cfg.sft.model if cfg.policy.model == "sft" else cfg.policy.model


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


def sft_identity(cfg: PivotConfig) -> dict:
    """What the SFT model depends on in the config (the code version of sft_policy): its section's SFT fields and
    the split."""
    from pivot_assets.core.split import ConversationSplit

    return {"sft": identity.sft_identity(cfg.sft, hardware.sft_precision(cfg).dtype),
            "split": ConversationSplit.from_config(cfg).identity}


def sft_run_identity(cfg: PivotConfig) -> dict:
    """sft_policy's identity: the SFT model's, and the world size it is launched with (training.launcher)."""
    return {**sft_identity(cfg), **identity.launch_identity(cfg.training)}


def grpo_run_identity(cfg: PivotConfig, device: str = "cpu") -> dict:
    """grpo_run's identity: the training section's, and the world size it is launched with (training.launcher)."""
    return {**training_identity(cfg, device), **identity.launch_identity(cfg.training)}


def training_identity(cfg: PivotConfig, device: str = "cpu") -> dict:
    """The training section's identity and where GRPO's completions are sampled (a vLLM rollout only: keys of
    models sampled by the trainer itself are those made before the rollout engine existed)."""
    from .vllm_rollout import resolve_rollout_engine

    return {**identity.training_identity(cfg.training, hardware.training_precision(cfg, device).dtype),
            **resolve_rollout_engine(cfg).identity}


def model_fingerprint(model: str, cfg: PivotConfig) -> str:
    """A model's identity under the prompt format every stage renders with (policy.chat_template,
    policy.thinking): the same weights rendered with another template train and sample differently."""
    from pivot_assets.policies.models import PromptFormat, policy_fingerprint

    return policy_fingerprint(model, PromptFormat.from_policy(cfg.policy))


def trajectories_version(wh: Warehouse) -> str:
    """The trajectories' content: their ids hash messages and tools (core/ids.py). Not the file's bytes, whose
    `source` column names the input file's path, which moves with the project."""
    ids = wh.read_arrow("trajectories", ["trajectory_id"]).column("trajectory_id").to_pylist()
    return fingerprint(sorted(ids))


def sft_key(wh: Warehouse, cfg: PivotConfig) -> str:
    return fingerprint({**sft_run_identity(cfg), "data": trajectories_version(wh),
                        "base": model_fingerprint(base_model(cfg), cfg)})


def grpo_key(wh: Warehouse, cfg: PivotConfig, verifier_fp: str) -> str:
    from pivot_assets.core.split import ConversationSplit

    return fingerprint({
        "training": grpo_run_identity(cfg, hardware.training_device()), "pivots": wh.data_version(SET_TABLES[cfg.training.set]),
        "init": model_fingerprint(init_model(wh, cfg), cfg), "verifier": verifier_fp, "cpu_smoke": not hardware.has_cuda(),
        "split": ConversationSplit.from_config(cfg).fingerprint(wh),
    })


# -- the ablation's arms ------------------------------------------------------------------------------
ARM_SPECS = {  # arm -> (trainer, pivot set, reward): the paper's ablation rows
    "grpo_adv": ("grpo", "adv", "profiling"),
    "grpo_cand": ("grpo", "cand", "profiling"),
    "grpo_mixed": ("grpo", "mixed", "profiling"),
    "grpo_adv_exact": ("grpo", "adv", "exact"),
    "sft_same_data": ("sft", "adv", None),  # per-turn SFT on the same D_adv turns GRPO on D_adv trains on
}


ARM_UNUSED = ("steps", "set")  # keys of training: / sft: the ablation's arms never read (their steps: pool size)


def arm_dir(arm: str, seed: int) -> str:
    """models/<this>: one folder per (arm, seed), so no arm or seed ever overwrites another."""
    return f"ablation_{arm}_s{int(seed)}"


def prompts_per_step(cfg: PivotConfig, trainer: str) -> int:
    """Distinct turns one optimizer step trains on: the SFT batch times its accumulation steps, or the GRPO prompt
    groups of one generation (per_device_train_batch_size x gradient_accumulation_steps completions /
    num_generations, TRL's defaults)."""
    if trainer == "sft":
        return cfg.sft.batch_size * cfg.sft.gradient_accumulation_steps
    grpo = cfg.training.grpo or {}
    k = cfg.training.num_generations
    rows = int(grpo.get("per_device_train_batch_size", k)) * int(grpo.get("gradient_accumulation_steps", 1))
    if rows % k:
        raise ValueError(f"training.grpo: per_device_train_batch_size x gradient_accumulation_steps ({rows}) must be "
                         f"a multiple of num_generations ({k})")
    return rows // k


def steps_for_pool(pool: int, per_step: int, epochs: float) -> int:
    """Optimizer steps for `epochs` passes over a pool of `pool` distinct turns, `per_step` turns a step: one pass
    is ceil(pool / per_step) steps (the last batch of a pass may be padded), never fewer than one."""
    if pool < 1:
        raise ValueError("steps_for_pool: an empty pool")
    return max(1, math.ceil(epochs * math.ceil(pool / per_step)))


def arm_key(wh: Warehouse, cfg: PivotConfig, arm: str, seed: int, verifier_fp: str | None,
            pool: list[str] | None = None) -> str:
    """Everything one arm's model depends on: arm, seed, its section and passes over the pool, the pool's turns
    (for D_cand, the seed's own draw) and their pivot set's data, init, reward, split. Evaluation-only keys
    (training's EVALUATION-only fields, ablation.primary) are not in it."""
    from pivot_assets.core.split import ConversationSplit

    trainer, pivot_set, _ = ARM_SPECS[arm]
    section = training_identity(cfg, hardware.training_device()) if trainer == "grpo" else sft_identity(cfg)["sft"]
    # what the arms never read: their steps come from their pools, and training.set is grpo_run's
    section = {k: v for k, v in section.items() if k not in ARM_UNUSED}
    return fingerprint({
        "arm": arm, "seed": seed, "epochs": cfg.ablation.epochs if cfg.ablation else 1.0, "section": section,
        "sft_lr": cfg.ablation.sft_learning_rate if cfg.ablation else None,
        "pool": fingerprint(sorted(pool or [])), "pivots": wh.data_version(SET_TABLES[pivot_set]),
        "init": model_fingerprint(init_model(wh, cfg), cfg), "verifier": verifier_fp,
        "split": ConversationSplit.from_config(cfg).fingerprint(wh), "device": hardware.training_device(),
    })


def apply_trl_options(kwargs: dict, extra: dict | None, config_class, section: str, public: dict[str, str]) -> dict:
    """`kwargs` for a TRL config class with the section's passthrough options (`extra`) applied: an unknown key is
    an error, and so is a key that the section sets with its own field (`public`: TRL name -> field) to another
    value."""
    import dataclasses

    known = {f.name for f in dataclasses.fields(config_class)}
    for key, value in (extra or {}).items():
        if key not in known:
            raise ValueError(f"{section}: unknown trl.{config_class.__name__} key {key!r}")
        if key in public and value != kwargs[key]:
            raise ValueError(f"{section}.{key} duplicates {section.split('.')[0]}.{public[key]}; set it there")
        kwargs[key] = value
    return kwargs

