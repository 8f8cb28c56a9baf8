"""A shard's generation as a Ray job (`scale.engine: ray`); Dagster-free, it speaks Pipes via dagster_pipes.

The `rollouts` asset submits `python -m pivot_assets.profiling.ray_job` through dagster-ray's PipesRayJobClient
with the config and the shard in the Pipes extras. Here, Ray Data feeds the shard's pending rows to the policy
backend in actors (one model per actor):

- rows, not turns: each turn is expanded into K (turn_id, sample_index) rows, each sampled with its own seed
  (`ray.data.llm` keeps only the first sample of n > 1, and one seed per row makes a row's draw independent of
  which other rows share its batch); resume skips the (turn_id, sample_index) keys already on disk;
- keyed writes: an actor writes each batch as ONE atomic part named by its rows (Ray Data's own file names are
  not deterministic, so a retried task would add a second copy); a retried or rerun batch overwrites its part;
- the job reports one materialization with the shard's data version (the asset fails if none comes back).

The worker must import this package: a cluster image with pivot-curation installed, or `scale.ray_runtime_env`
(e.g. {"py_modules": [...]} or {"pip": [...]}); a local head started from this venv imports it as is.
"""

from __future__ import annotations

import math
import os
import time

from pivot_assets.core.config import PivotConfig
from pivot_assets.core.warehouse import Warehouse

from .profiler import Profiler, policy_model
from .shards import shard_data_version, shard_row_count

ENTRYPOINT = "python -m pivot_assets.profiling.ray_job"
# Environment the job's processes need from the submitter's: offline model loading, where converted models are
# cached, torch threads. Credentials are not forwarded (a Ray job's runtime_env is visible in the dashboard).
FORWARDED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "PIVOT_CACHE_DIR",
                 "PIVOT_TORCH_THREADS", "TOKENIZERS_PARALLELISM")


def job_metadata(cfg: PivotConfig, shard: int | None) -> dict[str, str]:
    """What marks a shard's Ray job: the shard and the warehouse (its s3:// URI or its dir; never a credential)."""
    where = cfg.warehouse if cfg.warehouse.startswith("s3://") else str(cfg.warehouse_dir)
    return {"pivot_shard": str(shard), "pivot_warehouse": where}


def stop_earlier_jobs(address: str | None, metadata: dict[str, str], log=print, timeout_s: float = 120) -> list[str]:
    """Stop the jobs of this shard still running from an earlier run, and wait until they have stopped.

    A shard run stops its job when it is interrupted, but a SIGKILL (of it, or of everything) gives it no chance:
    the job would go on writing while the rerun's job writes the same rows batched otherwise (other part names,
    so duplicate keys). Only one Dagster run of a shard is in flight at a time, so any such job is an orphan."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)

    def earlier() -> list[str]:
        return [j.submission_id for j in client.list_jobs() if not j.status.is_terminal()
                and all((j.metadata or {}).get(k) == v for k, v in metadata.items())]

    orphans = earlier()
    for job_id in orphans:
        log(f"stopping Ray job {job_id}, left running by an earlier run of shard {metadata['pivot_shard']}")
        client.stop_job(job_id)
    deadline = time.monotonic() + timeout_s
    while orphans and earlier():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray job(s) {', '.join(earlier())} of shard {metadata['pivot_shard']} did not stop "
                               f"within {timeout_s:.0f} s (`ray job stop`), so the shard cannot be rerun yet")
        time.sleep(0.5)
    return orphans


def runtime_env(cfg: PivotConfig) -> dict:
    """The job's runtime_env: the configured one plus the forwarded environment variables."""
    env = dict(cfg.scale.ray_runtime_env or {})
    env["env_vars"] = {**{k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}, **env.get("env_vars", {})}
    return env


class ShardGenerator:
    """A Ray Data actor: loads the policy once, then generates and writes one keyed part per batch."""

    def __init__(self, config: dict, shard: int | None):
        from pivot_assets.core.hardware import configure_torch
        from pivot_assets.policies.factory import build_backend

        cfg = PivotConfig.model_validate(config)
        self.profiler = Profiler.for_config(cfg, shard=shard)
        if cfg.policy.backend == "transformers":
            configure_torch(cfg.runtime.threads)
        self.backend = build_backend(cfg.policy, model=policy_model(cfg.policy, self.profiler.wh))

    def __call__(self, batch: dict) -> dict:
        rows = [{"turn_id": str(t), "sample_index": int(i)} for t, i in zip(batch["turn_id"], batch["sample_index"])]
        stats = self.profiler.generate_samples(self.backend, rows)
        return {"rows": [stats["rows"]], "tokens": [stats["tokens"]], "seconds": [stats["seconds"]],
                "pid": [os.getpid()]}


def generate_shard(cfg: PivotConfig, shard: int | None, log=print) -> dict:
    """Generate every pending row of the shard on the Ray cluster this process is attached to."""
    import ray

    profiler = Profiler.for_config(cfg, shard=shard)
    t0 = time.perf_counter()
    rows = profiler.pending_samples()
    log(f"shard {shard}: {len(profiler.turns)} turns x K={profiler.sampling.k}, {len(rows)} rows to generate "
        f"({cfg.scale.ray_actors} actor(s), {cfg.scale.ray_batch_rows} rows per part)")
    stats = {"turns_profiled": len(profiler.turns), "samples_per_turn": profiler.sampling.k,
             "rollouts_generated": 0, "generated_tokens": 0, "parts_written": 0,
             "policy_fp": profiler.policy_fp, "sampling_fp": profiler.sampling_fp, "seeding": profiler.seeding}
    if rows:
        if not ray.is_initialized():
            ray.init(logging_level="WARNING")  # inside a Ray job: attaches to the job's cluster
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # the job log is the Pipes channel: keep it readable
        batch = cfg.scale.ray_batch_rows
        ds = ray.data.from_items(rows, override_num_blocks=max(1, math.ceil(len(rows) / batch)))
        out = ds.map_batches(
            ShardGenerator, fn_constructor_kwargs={"config": cfg.model_dump(mode="json"), "shard": shard},
            batch_size=batch, compute=ray.data.ActorPoolStrategy(size=cfg.scale.ray_actors),
            num_cpus=cfg.scale.ray_actor_cpus,
            num_gpus=cfg.scale.ray_actor_gpus or None, batch_format="numpy",
        ).take_all()
        stats.update(rollouts_generated=sum(r["rows"] for r in out), generated_tokens=sum(r["tokens"] for r in out),
                     parts_written=len(out), actor_processes=len({r["pid"] for r in out}),
                     # actor seconds in generate_samples (summed over actors): generation alone, no start-up
                     generation_s=round(sum(r["seconds"] for r in out), 2))
    wall = time.perf_counter() - t0
    stats.update(wall_s=round(wall, 2), rows_per_s=round(stats["rollouts_generated"] / wall, 3) if wall else 0.0,
                 tokens_per_s=round(stats["generated_tokens"] / wall, 1) if wall else 0.0)
    return stats


def main() -> None:
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        cfg = PivotConfig.model_validate(pipes.get_extra("config"))
        shard = pipes.get_extra("shard")
        stats = generate_shard(cfg, shard, log=pipes.log.info)
        wh = Warehouse(cfg.warehouse_dir)
        version = shard_data_version(wh, "rollouts", shard) if shard is not None else wh.data_version("rollouts")
        rows = shard_row_count(wh, "rollouts", shard) if shard is not None else None
        metadata = {**stats, **({"dagster/row_count": rows} if rows is not None else {})}
        pipes.report_asset_materialization(metadata=metadata, data_version=version)


if __name__ == "__main__":
    main()
