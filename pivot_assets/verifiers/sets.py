"""The verifier sets of one config, resolved once (Dagster-free).

`profiling` scores the rollouts (`verifier:`), `reward` rewards GRPO (training.reward_verifier, else the profiling
set: decided here only), `exact` is the ablation's exact-match reward (ablation.exact_verifier; None without an
ablation section). The pipeline resolves them when it loads the definitions; the ablation's and the evaluation's
worker processes resolve them from the config they are given. A spec that does not build is a ConfigError naming
its key, so a typo in a verifier name reads like every other config error.
"""

from __future__ import annotations

from dataclasses import dataclass

from pivot_assets.core.config import ConfigError, PivotConfig, VerifierSection

from .domains import DomainVerifiers, VerifierSpecError
from .user_verifiers import search_config_dir


@dataclass(frozen=True)
class VerifierSets:
    profiling: DomainVerifiers
    reward: DomainVerifiers
    exact: DomainVerifiers | None

    @classmethod
    def from_config(cls, cfg: PivotConfig) -> "VerifierSets":
        search_config_dir(cfg.base_dir)  # a user's module:Class next to the config
        profiling = build_set(cfg.verifier, "verifier", cfg.source)
        reward = profiling
        if cfg.training.reward_verifier is not None:  # a training reward apart from the profiling verifier
            reward = build_set(cfg.training.reward_verifier, "training.reward_verifier", cfg.source)
        exact = build_set(cfg.ablation.exact_verifier, "ablation.exact_verifier", cfg.source) if cfg.ablation else None
        return cls(profiling, reward, exact)


def build_set(section: VerifierSection, key: str, source: str) -> DomainVerifiers:
    """One section's DomainVerifiers; a bad spec -> ConfigError "<source>: <key>.<part>: <why>"."""
    try:
        return DomainVerifiers(section)
    except VerifierSpecError as e:
        message = str(e).split(": ", 1)[1] if e.part.startswith("domains.") else str(e)
        raise ConfigError(f"{source}: {key}.{e.part}: {message}") from None
