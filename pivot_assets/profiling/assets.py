"""Stage 3 in Dagster: `turns` -> `rollouts` (K reference-policy samples) -> `rollout_rewards` (verifier)
-> `turn_profiles` (group `profiling`).

Code versions: `rollouts` = the policy identity (model, sampling, resolved dtype), `rollout_rewards` = the
verifier fingerprint, so a verifier change makes scoring and everything downstream stale but never `rollouts`.
"""

import dagster as dg

from pivot_assets.core.config import PivotConfig
from pivot_assets.core.plots import histogram_png, markdown_image, save_png
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.resources import number_table, publish, reused_figures, timed
from pivot_assets.verifiers import DomainVerifiers

from .profiler import SFT_MODEL, Profiler, policy_version

GROUP = __package__.rsplit(".", 1)[-1]
PROFILES_VERSION = "1"
# What generation cost: a cached rerun shows the figures of the run that did the work, marked as reused.
GENERATION_FIGURES = ("generation_s", "generated_tokens", "tokens_per_s", "rollouts_generated", "wall_s")


def pass_rate_plot(wh: Warehouse, reward_means: list[float]) -> str:
    png = histogram_png(reward_means, title="turn_profiles: reference pass rate per turn", xlabel="reward_mean")
    save_png(png, wh.root / "plots" / "turn_profiles_pass_rate.png")
    return markdown_image(png, "pass-rate histogram")


def build_assets(cfg: PivotConfig) -> list:
    verifiers = DomainVerifiers(cfg.verifier)
    policy_deps = ["turns"] + (["sft_policy"] if cfg.policy.model == SFT_MODEL else [])

    def profiler() -> Profiler:
        return Profiler(Warehouse(cfg.warehouse_dir), cfg.policy, verifiers, cfg.runtime.threads)

    @dg.asset(deps=policy_deps, group_name=GROUP, code_version=policy_version(cfg.policy), kinds={"parquet", "pytorch"})
    def rollouts(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """K samples per turn from the frozen reference policy (cached by turn, policy and sampling)."""
        p = profiler()
        with timed() as t:
            stats = p.generate(context.log.info)
        meta = {"wall_s": round(t["seconds"], 1), **{k: _rounded(v) for k, v in stats.items()
                                                    if isinstance(v, (int, float, str))}}
        if not stats["turns_generated"]:
            meta.update({k: v for k, v in reused_figures(context, GENERATION_FIGURES).items()})
            meta["cached"] = True
        return publish(p.wh, "rollouts", meta)

    @dg.asset(deps=["rollouts"], group_name=GROUP, code_version=verifiers.fingerprint, kinds={"parquet"})
    def rollout_rewards(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """Every current rollout scored by the configured verifier (cached by rollout key + verifier_fp)."""
        p = profiler()
        stats = p.score(context.log.info)
        context.log.info(f"scored {stats['rollouts_scored']} rollouts with verifier {stats['verifier_fp']}")
        return publish(p.wh, "rollout_rewards", {
            "verifier_fp": stats["verifier_fp"], "rollouts_scored": stats["rollouts_scored"],
            "scores_per_s": stats["scores_per_s"], "reasons": number_table(stats["reasons"], "reason", "rollouts"),
        })

    @dg.asset(deps=["rollout_rewards"], group_name=GROUP, code_version=PROFILES_VERSION, kinds={"parquet", "duckdb"})
    def turn_profiles(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """Per turn under the current (policy, verifier): k, reward mean/var/std, n_pass, n_distinct_actions."""
        p = profiler()
        table = p.profile()
        p.wh.write_table("turn_profiles", table)
        mixed = sum(1 for v in table.column("reward_var").to_pylist() if v and v > 0)
        plot = pass_rate_plot(p.wh, table.column("reward_mean").to_pylist())
        return publish(p.wh, "turn_profiles", {
            "turns": table.num_rows, "mixed_turns": mixed, "zero_variance_turns": table.num_rows - mixed,
            "pass_rate_histogram": dg.MetadataValue.md(plot)})

    return [rollouts, rollout_rewards, turn_profiles]


def _rounded(value):
    return round(value, 2) if isinstance(value, float) else value
