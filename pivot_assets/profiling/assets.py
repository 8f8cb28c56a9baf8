"""Stage 3 in Dagster: `turns` -> `rollouts` (K reference-policy samples) -> `rollout_rewards` (verifier)
-> `turn_profiles` (group `profiling`).

With `scale.shards: S` > 1 the three are static partitions '000'..: one run per shard (a run over several
partitions reports one data version for all of them), and the unpartitioned assets below read every shard.
With `scale.engine: ray` a shard run submits its generation as a Ray job (ray_job.py) through dagster-ray.

Code versions: `rollouts` = the policy identity (model, sampling, resolved dtype, seeding, adaptive stopping),
`rollout_rewards` = the verifier fingerprint, so a verifier change makes scoring and everything downstream stale but
never `rollouts`. With `profiling.adaptive` the `rollouts` step also scores each round with the configured verifier
(the rule needs rewards) into `rollout_rewards`, which then finds them scored; a verifier change re-scores the
cached samples and never generates (turns the new rewards leave open show stop_reason `unsettled`; a run of
`rollouts` tops them up).
"""

import time

import dagster as dg

from pivot_assets.core.config import PivotConfig
from pivot_assets.core.plots import histogram_png, markdown_image, save_png
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.materialization import number_table, publish, require_only_run_of_shard, reused_figures, timed
from pivot_assets.verifiers import VerifierSets

from .adaptive import rule_bounds
from .profiler import SFT_MODEL, Profiler, policy_version, profiles_version
from .ray_job import ENTRYPOINT as RAY_ENTRYPOINT
from .ray_job import job_metadata as ray_job_metadata
from .ray_job import runtime_env as ray_runtime_env
from .ray_job import stop_earlier_jobs
from .shards import parse_shard, partition_keys, shard_data_version, shard_row_count

GROUP = __package__.rsplit(".", 1)[-1]
# What generation cost: a cached rerun shows the figures of the run that did the work, marked as reused.
GENERATION_FIGURES = ("generation_s", "generated_tokens", "tokens_per_s", "rollouts_generated", "wall_s", "rounds",
                      "waves")


def pass_rate_plot(wh: Warehouse, reward_means: list[float]) -> str:
    png = histogram_png(reward_means, title="turn_profiles: reference pass rate per turn", xlabel="reward_mean")
    save_png(png, wh.root / "plots" / "turn_profiles_pass_rate.png")
    return markdown_image(png, "pass-rate histogram")


GENERATION_POOL = "pivot_generation"  # the generation fleet: `dagster instance concurrency set pivot_generation N`


def shard_partitions(cfg: PivotConfig) -> dg.StaticPartitionsDefinition | None:
    """One static partition per shard ('000'..), or none: `scale.shards: 1` keeps the unpartitioned assets."""
    return dg.StaticPartitionsDefinition(partition_keys(cfg.scale.shards)) if cfg.scale.shards > 1 else None


def build_assets(cfg: PivotConfig, wh: Warehouse, verifier_sets: VerifierSets) -> list:
    verifiers = verifier_sets.profiling
    policy_deps = ["turns"] + (["sft_policy"] if cfg.policy.model == SFT_MODEL else [])
    partitions = shard_partitions(cfg)
    rollouts_version = policy_version(cfg.policy, cfg.profiling.seeding, cfg.profiling.adaptive, rule_bounds(cfg))

    def shard_of_run(context: dg.AssetExecutionContext) -> int | None:
        if partitions is None:
            return None
        require_only_run_of_shard(context)
        return parse_shard(context.partition_key, cfg.scale.shards)

    def profiler(shard: int | None) -> Profiler:
        return Profiler.for_config(cfg, verifiers, shard, wh=wh)

    # The warm-up split decides which turns are profiled (core/split.py); a two-way split keeps the old version.
    split = [cfg.training.eval_fraction, cfg.training.warmup_fraction, cfg.training.seed]
    if cfg.training.warmup_fraction:
        rollouts_version = f"{rollouts_version}|split:{split}"

    @dg.asset(deps=policy_deps, group_name=GROUP, code_version=rollouts_version,
              kinds={"parquet", "pytorch", *(["ray"] if cfg.scale.engine == "ray" else [])},
              partitions_def=partitions, pool=GENERATION_POOL)
    def rollouts(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """K samples per turn from the frozen reference policy (cached by turn, policy, sampling and sample index);
        with profiling.adaptive, rounds of samples until each turn's pivot-set membership is settled."""
        shard = shard_of_run(context)
        if cfg.scale.engine == "ray":
            return generate_on_ray(context, cfg, shard)
        p = profiler(shard)
        with timed() as t:
            stats = p.generate(context.log.info)
        meta = {"wall_s": round(t["seconds"], 1), **{k: _rounded(v) for k, v in stats.items()
                                                    if isinstance(v, (int, float, str))}}
        if not stats["turns_generated"]:
            meta.update({k: v for k, v in reused_figures(context, GENERATION_FIGURES).items()})
            meta["cached"] = True
        return publish_profiling(p, "rollouts", meta)

    @dg.asset(deps=["rollouts"], group_name=GROUP, code_version=verifiers.fingerprint, kinds={"parquet"},
              partitions_def=partitions)
    def rollout_rewards(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """Every current rollout scored by the configured verifier (cached by rollout key + verifier_fp)."""
        p = profiler(shard_of_run(context))
        stats = p.score(context.log.info)
        context.log.info(f"scored {stats['rollouts_scored']} rollouts with verifier {stats['verifier_fp']}")
        return publish_profiling(p, "rollout_rewards", {
            "verifier_fp": stats["verifier_fp"], "rollouts_scored": stats["rollouts_scored"],
            "scores_per_s": stats["scores_per_s"], "reasons": number_table(stats["reasons"], "reason", "rollouts"),
        })

    @dg.asset(deps=["rollout_rewards"], group_name=GROUP, code_version=profiles_version(cfg),
              kinds={"parquet", "duckdb"}, partitions_def=partitions)
    def turn_profiles(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """Per turn under the current (policy, verifier): k, reward mean/var/std, n_pass, n_distinct_actions, why
        its sampling stopped (stop_reason, p_flip) and the expert action's log-likelihood."""
        p = profiler(shard_of_run(context))
        table = p.profile()
        p.write_profiles(table)
        mixed = sum(1 for v in table.column("reward_var").to_pylist() if v and v > 0)
        meta = {"turns": table.num_rows, "mixed_turns": mixed, "zero_variance_turns": table.num_rows - mixed,
                **profile_figures(table, cfg.policy.k), **(p.prior.as_metadata() if p.prior else {})}
        if p.shard is None:  # one histogram of the whole table (shards would overwrite each other's file)
            meta["pass_rate_histogram"] = dg.MetadataValue.md(pass_rate_plot(p.wh, table.column("reward_mean").to_pylist()))
        return publish_profiling(p, "turn_profiles", meta)

    return [rollouts, rollout_rewards, turn_profiles]


def profile_figures(table, k: int) -> dict:
    """What the profiles cost and say: samples used against turns x k, turns per stop reason, the expected number
    of memberships the posterior rule got wrong (the sum of p_flip)."""
    samples = sum(table.column("k").to_pylist())
    reasons: dict[str, int] = {}
    for reason in table.column("stop_reason").to_pylist():
        reasons[reason] = reasons.get(reason, 0) + 1
    flips = [v for v in table.column("p_flip").to_pylist() if v is not None]
    return {"samples": samples, "samples_fraction_of_k": round(samples / (table.num_rows * k), 4) if table.num_rows else 0.0,
            **{f"stop_reason/{r}": n for r, n in sorted(reasons.items())},
            "expected_flips": round(sum(flips), 3),
            "turns_with_expert_logprob": table.num_rows - table.column("expert_logprob").null_count}


def publish_profiling(p: Profiler, table: str, metadata: dict) -> dg.MaterializeResult:
    """Unsharded: publish as every table (views, preview). A shard: its rows, folder and data version only; it
    never opens pivot.duckdb (the unpartitioned steps refresh the views, one writer), so shards run at once."""
    if p.shard is None:
        return publish(p.wh, table, metadata)
    md = {"dagster/row_count": dg.MetadataValue.int(shard_row_count(p.wh, table, p.shard)),
          "path": dg.MetadataValue.path(str(p.wh.shard_dir(table, p.shard))), **metadata}
    return dg.MaterializeResult(metadata=md, data_version=dg.DataVersion(shard_data_version(p.wh, table, p.shard)))


def generate_on_ray(context: dg.AssetExecutionContext, cfg: PivotConfig, shard: int | None) -> dg.MaterializeResult:
    """Submit the shard's generation as a Ray job (profiling/ray_job.py) and take its reported materialization.

    One PipesRayJobClient per run: its message reader keeps the previous job's state, and a reused client can
    report success with nothing read. Dagster would also make up an empty materialization for a job that
    reported none (implicit materializations): this asks for reported results only and fails without one."""
    from dagster_ray import PipesRayJobClient

    metadata = ray_job_metadata(cfg, shard)
    stop_earlier_jobs(cfg.scale.ray_address, metadata, log=context.log.warning)
    client = PipesRayJobClient(address=cfg.scale.ray_address, poll_interval=0.5)  # stops its job if interrupted
    invocation = client.run(
        context=context,
        submit_job_params={"entrypoint": RAY_ENTRYPOINT, "runtime_env": ray_runtime_env(cfg), "metadata": metadata},
        extras={"config": cfg.model_dump(mode="json"), "shard": shard, "submitted_at": time.time()},
    )
    reported = [r for r in invocation.get_results(implicit_materializations=False)
                if isinstance(r, dg.MaterializeResult) and r.data_version is not None]
    job = invocation.metadata.get("Ray Job ID")
    if not reported:
        raise RuntimeError(f"Ray job {getattr(job, 'value', job)} finished without reporting a materialization "
                           "with a data version (see its log: `ray job logs`)")
    result = reported[-1]
    return dg.MaterializeResult(metadata={**(result.metadata or {}), **invocation.metadata},
                                data_version=result.data_version)


def _rounded(value):
    return round(value, 2) if isinstance(value, float) else value
