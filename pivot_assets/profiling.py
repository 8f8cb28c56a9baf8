"""Stage 3: `turns` -> `rollouts` (K reference-policy samples) -> `rollout_rewards` (verifier) -> `turn_profiles`.

Code versions: `rollouts` = the policy section (model + sampling), `rollout_rewards` = the verifier
fingerprint, so a verifier change makes scoring and everything downstream stale but never `rollouts`.
"""


import dagster as dg

from pivot_assets.config import PivotConfig
from pivot_assets.profiler import (
    Progress,
    build_profiles,
    done_turns,
    generate_rollouts,
    generation_requests,
    score_rollouts,
    select_turns,
)
from pivot_assets.resources import PivotSettings, publish, timed
from pivot_assets.schema import canonical_json, short_hash
from pivot_assets.warehouse import Warehouse

PROFILES_VERSION = "1"
POLICY_IDENTITY = ("backend", "model", "base_url", "dtype", "k", "temperature", "top_p", "max_new_tokens", "seed", "limit_turns")
SFT_MODEL = "sft"


def policy_model(cfg: PivotConfig, wh: Warehouse) -> str:
    """`policy.model: sft` is the warm-up model the `sft_policy` asset saved in the warehouse."""
    return str(wh.root / "models" / "sft_policy") if cfg.policy.model == SFT_MODEL else cfg.policy.model


def sampling_config(cfg: PivotConfig):
    from pivot_assets.policies.base import sampling_from_section

    return sampling_from_section(cfg.section("policy"))


def current_fingerprints(cfg: PivotConfig, wh: Warehouse) -> tuple[str, str]:
    """(policy_fp, sampling_fp) of the configured reference policy, without loading it."""
    from pivot_assets.policies.models import policy_fingerprint

    if cfg.policy.backend == "openai":
        policy_fp = f"openai|{cfg.policy.base_url}|{cfg.policy.model}"
    else:
        # bf16 and fp32 sample slightly different tokens: the dtype is part of the policy's identity
        policy_fp = f"{policy_fingerprint(policy_model(cfg, wh))}|{cfg.policy.backend}:{cfg.policy.dtype}"
    return policy_fp, sampling_config(cfg).fingerprint


def verifier_set(cfg: PivotConfig):
    from pivot_assets.verifiers import DomainVerifiers

    return DomainVerifiers(cfg.verifier)


def build_profiling_assets(cfg: PivotConfig) -> list:
    policy_deps = ["turns"] + (["sft_policy"] if cfg.policy.model == SFT_MODEL else [])
    # Only what changes the samples: speed knobs (batch_size, threads, concurrency) must not make it stale.
    policy_version = short_hash(canonical_json({k: v for k, v in cfg.section("policy").items() if k in POLICY_IDENTITY}))

    @dg.asset(deps=policy_deps, group_name="profiling", code_version=policy_version, kinds={"parquet", "pytorch"})
    def rollouts(context: dg.AssetExecutionContext, settings: PivotSettings) -> dg.MaterializeResult:
        """K samples per turn from the frozen reference policy (cached by turn, policy and sampling)."""
        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        wh.clean_temp_files("rollouts")
        policy_fp, sampling_fp = current_fingerprints(cfg, wh)
        wanted = select_turns(wh, cfg.policy.limit_turns)
        done = done_turns(wh, policy_fp, sampling_fp)
        pending = [t for t in wanted if t not in done]
        context.log.info(f"{len(wanted)} turns wanted, {len(wanted) - len(pending)} cached, {len(pending)} to generate")
        stats: dict = {"rollouts_generated": 0, "generated_tokens": 0}
        with timed() as t:
            if pending:
                from pivot_assets.policies.base import build_backend

                backend = build_backend({**cfg.section("policy"), "model": policy_model(cfg, wh)})
                sampling = sampling_config(cfg)
                progress = Progress(total=len(pending) * sampling.k, log=context.log.info)
                stats = generate_rollouts(wh, backend, policy_fp, sampling, generation_requests(wh, pending), progress)
                stats.update({k: v for k, v in backend.stats.items() if isinstance(v, (int, float))})
        return publish(
            wh,
            "rollouts",
            {
                "turns_profiled": len(wanted),
                "turns_generated": len(pending),
                "cache_hits_turns": len(wanted) - len(pending),
                "samples_per_turn": cfg.policy.k,
                "policy_fp": policy_fp,
                "sampling_fp": sampling_fp,
                "wall_s": round(t["seconds"], 2),
                **{k: v for k, v in stats.items() if isinstance(v, (int, float))},
            },
        )

    @dg.asset(
        deps=["rollouts"], group_name="profiling", code_version=verifier_set(cfg).fingerprint, kinds={"parquet"}
    )
    def rollout_rewards(context: dg.AssetExecutionContext, settings: PivotSettings) -> dg.MaterializeResult:
        """Every current rollout scored by the configured verifier (cached by rollout key + verifier_fp)."""
        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        wh.clean_temp_files("rollout_rewards")
        policy_fp, sampling_fp = current_fingerprints(cfg, wh)
        verifiers = verifier_set(cfg)
        wanted = select_turns(wh, cfg.policy.limit_turns)
        stats = score_rollouts(wh, verifiers, policy_fp, sampling_fp, wanted, progress_log=context.log.info)
        context.log.info(f"scored {stats['rollouts_scored']} rollouts with verifier {verifiers.fingerprint}")
        return publish(
            wh,
            "rollout_rewards",
            {
                "verifier_fp": verifiers.fingerprint,
                "rollouts_scored": stats["rollouts_scored"],
                "scores_per_s": stats["scores_per_s"],
                "reasons": dg.MetadataValue.json(stats["reasons"]),
            },
        )

    @dg.asset(deps=["rollout_rewards"], group_name="profiling", code_version=PROFILES_VERSION, kinds={"parquet", "duckdb"})
    def turn_profiles(context: dg.AssetExecutionContext, settings: PivotSettings) -> dg.MaterializeResult:
        """Per turn under the current (policy, verifier): k, reward mean/var/std, n_pass, n_distinct_actions."""
        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        policy_fp, sampling_fp = current_fingerprints(cfg, wh)
        table = build_profiles(
            wh, policy_fp, sampling_fp, verifier_set(cfg).fingerprint, select_turns(wh, cfg.policy.limit_turns)
        )
        wh.write_table("turn_profiles", table)
        var = table.column("reward_var").to_pylist()
        mixed = sum(1 for v in var if v and v > 0)
        return publish(
            wh,
            "turn_profiles",
            {"turns": table.num_rows, "mixed_turns": mixed, "zero_variance_turns": table.num_rows - mixed},
        )

    return [rollouts, rollout_rewards, turn_profiles]
