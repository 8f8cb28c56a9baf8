"""A shard's generation as a Ray job (`scale.engine: ray`); Dagster-free, it speaks Pipes via dagster_pipes.

The `rollouts` asset submits `python -m pivot_assets.profiling.ray_job` through dagster-ray's PipesRayJobClient
with the config and the shard in the Pipes extras. Here, Ray Data feeds the shard's pending rows to the policy
backend in actors (one model per actor):

- rows, not turns: each turn is expanded into K (turn_id, sample_index) rows, each sampled with its own seed
  (`ray.data.llm` keeps only the first sample of n > 1, and one seed per row makes a row's draw independent of
  which other rows share its batch); resume skips the (turn_id, sample_index) keys already on disk. The
  transformers backend decodes a turn's rows together, one generator per row (one prefill per turn, the same
  draws as one single-sample call per seed); the others make one call per sample index;
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
from pivot_assets.core.parallel import process_started_at
from pivot_assets.core.warehouse import HOLD_AFTER_PART_ENV
from pivot_assets.shared import Shared, resolve_shared

from .profiler import Profiler, policy_model, turn_chunks
from .shards import shard_data_version, shard_row_count

ENTRYPOINT = "python -m pivot_assets.profiling.ray_job"
# Environment the job's processes need from the submitter's: offline model loading, where converted models are
# cached, torch threads, a kill test's hold point. Credentials are not forwarded (a Ray job's runtime_env is visible
# in the dashboard).
FORWARDED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "PIVOT_CACHE_DIR",
                 "PIVOT_TORCH_THREADS", "TOKENIZERS_PARALLELISM", HOLD_AFTER_PART_ENV)


def job_metadata(cfg: PivotConfig, shard: int | None) -> dict[str, str]:
    """What marks a shard's Ray job: the shard and the warehouse (its s3:// URI or its dir; never a credential)."""
    where = cfg.warehouse if cfg.warehouse.startswith("s3://") else str(cfg.warehouse_dir)
    return {"pivot_shard": str(shard), "pivot_warehouse": where}


# A head's job server can answer badly for a few seconds while it (re)starts its job module (measured: a head that
# answered /api/version, then gave an empty body to the next client): a client waits this long for a good answer.
JOB_SERVER_WAIT_S = 30.0


def job_client(address: str | None, wait_s: float = JOB_SERVER_WAIT_S):
    """A JobSubmissionClient for `address`, retried until the job server answers (its version check passes) or
    `wait_s` has passed; then the last error is raised."""
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return JobSubmissionClient(address)
        except Exception:  # noqa: BLE001  (refused, a non-JSON body, a 5xx: all mean "not answering yet")
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def stop_earlier_jobs(address: str | None, metadata: dict[str, str], log=print, timeout_s: float = 120) -> list[str]:
    """Stop the jobs of this shard still running from an earlier run, and wait until they have stopped.

    A shard run stops its job when it is interrupted, but a SIGKILL (of it, or of everything) gives it no chance:
    the job would go on writing while the rerun's job writes the same rows batched otherwise (other part names,
    so duplicate keys). Only one Dagster run of a shard is in flight at a time, so any such job is an orphan."""
    client = job_client(address)

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

        init_at = time.time()
        cfg = PivotConfig.model_validate(config)
        self.profiler = Profiler.for_config(cfg, shard=shard)
        if self.profiler.engine.torch_in_process:
            configure_torch(cfg.runtime.threads)
        backend_at = time.time()
        self.backend = build_backend(cfg.policy, model=policy_model(cfg.policy, self.profiler.wh),
                                     threads=cfg.runtime.threads, keep_prompts=cfg.profiling.adaptive.enabled)
        # when this actor's process started, entered __init__, began building the backend and was ready
        self.clock = {"process_at": process_started_at() or init_at, "init_at": init_at, "backend_at": backend_at,
                      "ready_at": time.time()}

    def __call__(self, batch: dict) -> dict:
        rows = [{"turn_id": str(t), "sample_index": int(i)} for t, i in zip(batch["turn_id"], batch["sample_index"])]
        started_at = time.time()
        stats = self.profiler.generate_samples(self.backend, rows)
        return {"rows": [stats["rows"]], "tokens": [stats["tokens"]], "seconds": [stats["seconds"]],
                "pid": [os.getpid()], "started_at": [started_at], **{k: [v] for k, v in self.clock.items()}}


def startup_figures(clock: dict, out: list[dict]) -> dict:
    """Where a job's start-up went, in seconds, from the driver's clock and its first actor's (one node here; on a
    cluster the node clocks are NTP-close): submission -> driver process -> driver code -> rows pending -> Ray
    Data started -> actor process -> actor code -> backend built (imports, model load) -> first batch."""
    first = min(out, key=lambda r: r["ready_at"])
    marks = [("submitted_to_driver_s", clock.get("submitted_at"), clock["process_at"]),
             ("driver_boot_s", clock["process_at"], clock["main_at"]),
             ("pending_rows_s", clock["main_at"], clock["pending_at"]),
             ("ray_data_start_s", clock["pending_at"], clock["dataset_at"]),
             ("actor_spawn_s", clock["dataset_at"], first["process_at"]),
             ("actor_boot_s", first["process_at"], first["init_at"]),
             ("actor_setup_s", first["init_at"], first["backend_at"]),
             ("backend_build_s", first["backend_at"], first["ready_at"]),
             ("to_first_batch_s", first["ready_at"], min(r["started_at"] for r in out))]
    figures = {name: round(b - a, 2) for name, a, b in marks if a is not None}
    figures["startup_s"] = round(min(r["started_at"] for r in out) - (clock.get("submitted_at") or clock["process_at"]), 2)
    return figures


def generate_shard(shared: Shared, shard: int | None, log=print, clock: dict | None = None) -> dict:
    """Generate every pending row of the shard on the Ray cluster this process is attached to. `clock`: when the
    job was submitted and its driver started (epoch seconds), for the start-up figures."""
    cfg = shared.cfg

    clock = {"process_at": process_started_at() or time.time(), "main_at": time.time(), **(clock or {})}
    profiler = Profiler.for_config(cfg, shared.verifiers.profiling, shard=shard, wh=shared.warehouse)
    t0 = time.perf_counter()
    skipped = profiler.guard_prompts(log)  # before the actors start: their profilers leave out what it lists
    rows = profiler.pending_samples()
    clock["pending_at"] = time.time()
    log(f"shard {shard}: {len(profiler.turns)} turns x K={profiler.sampling.k}, {len(rows)} rows to generate "
        f"{'at most, in adaptive rounds ' if profiler.adaptive.enabled else ''}"
        f"({cfg.scale.ray_actors} actor(s), {cfg.scale.ray_batch_rows} rows per part)")
    stats = {"turns_profiled": len(profiler.turns), "turns_prompt_too_long": len(skipped),
             "samples_per_turn": profiler.sampling.k,
             "rollouts_generated": 0, "generated_tokens": 0, "parts_written": 0,
             "policy_fp": profiler.policy_fp, "sampling_fp": profiler.sampling_fp, "seeding": profiler.seeding}
    out: list[dict] = []
    if profiler.adaptive.enabled:
        stats.update(_adaptive_rounds(cfg, shard, profiler, clock, out, log))
    elif rows:
        out = _generate_rows(cfg, shard, rows, clock)
    if out:
        stats.update(rollouts_generated=sum(r["rows"] for r in out), generated_tokens=sum(r["tokens"] for r in out),
                     parts_written=len(out), actor_processes=len({r["pid"] for r in out}),
                     # actor seconds in generate_samples (summed over actors): generation alone, no start-up
                     generation_s=round(sum(r["seconds"] for r in out), 2), **startup_figures(clock, out))
    wall = time.perf_counter() - t0
    stats.update(wall_s=round(wall, 2), rows_per_s=round(stats["rollouts_generated"] / wall, 3) if wall else 0.0,
                 tokens_per_s=round(stats["generated_tokens"] / wall, 1) if wall else 0.0)
    return stats


class ActorPool:
    """The shard's generator actors, alive for every round of an adaptive job (each loads its engine once, as
    long-lived vLLM actors do in NeMo-RL, verl and OpenRLHF); a round's rows go to them in batches of whole turns
    (scale.ray_batch_rows), round-robin. With ray_batch_rows = policy.batch_size the batches are the local engine's,
    so even a batched bf16 decode draws the same tokens."""

    def __init__(self, cfg: PivotConfig, shard: int | None):
        import ray

        _attach()
        remote = ray.remote(num_cpus=cfg.scale.ray_actor_cpus, num_gpus=cfg.scale.ray_actor_gpus or None)(ShardGenerator)
        self.actors = [remote.remote(cfg.model_dump(mode="json"), shard) for _ in range(cfg.scale.ray_actors)]
        self.batch = cfg.scale.ray_batch_rows

    def run(self, rows: list[dict]) -> list[dict]:
        """One output record per written part (what ShardGenerator returns), the round's rows all written."""
        import ray

        chunks = list(turn_chunks(rows, self.batch))  # whole turns, as the local engine batches a round
        calls = [self.actors[j % len(self.actors)].__call__.remote(
            {"turn_id": [r["turn_id"] for r in chunk], "sample_index": [r["sample_index"] for r in chunk]})
            for j, chunk in enumerate(chunks)]
        return [{k: v[0] for k, v in record.items()} for record in ray.get(calls)]

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


def _adaptive_rounds(cfg: PivotConfig, shard: int | None, profiler: Profiler, clock: dict, out: list[dict],
                     log) -> dict:
    """Adaptive profiling of the shard: the rounds run here (scoring between them, the prior fitted on this shard's
    first rounds), each round's rows generated by the same actors."""
    clock["dataset_at"] = time.time()
    pool = ActorPool(cfg, shard)

    def generate_rows(rows: list[dict]) -> dict:
        records = pool.run(rows)
        out.extend(records)
        return {"rollouts_generated": sum(r["rows"] for r in records),
                "generated_tokens": sum(r["tokens"] for r in records),
                "generation_s": round(sum(r["seconds"] for r in records), 2)}

    try:
        stats = profiler.adaptive_rounds(generate_rows, log)
    finally:
        pool.close()
    return {k: v for k, v in stats.items() if k not in ("rollouts_generated", "generated_tokens", "generation_s")}


def _attach() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(logging_level="WARNING")  # inside a Ray job: attaches to the job's cluster


def _generate_rows(cfg: PivotConfig, shard: int | None, rows: list[dict], clock: dict) -> list[dict]:
    """Feed the rows through Ray Data to the ShardGenerator actors; one output record per written part."""
    import ray

    _attach()
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the job log is the Pipes channel: keep it readable
    batch = cfg.scale.ray_batch_rows
    clock["dataset_at"] = time.time()
    ds = ray.data.from_items(rows, override_num_blocks=max(1, math.ceil(len(rows) / batch)))
    return ds.map_batches(
        ShardGenerator, fn_constructor_kwargs={"config": cfg.model_dump(mode="json"), "shard": shard},
        batch_size=batch, compute=ray.data.ActorPoolStrategy(size=cfg.scale.ray_actors),
        num_cpus=cfg.scale.ray_actor_cpus,
        num_gpus=cfg.scale.ray_actor_gpus or None, batch_format="numpy",
    ).take_all()


def main() -> None:
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        shared = resolve_shared(PivotConfig.model_validate(pipes.get_extra("config")))
        shard = pipes.get_extra("shard")
        stats = generate_shard(shared, shard, log=pipes.log.info, clock={"submitted_at": pipes.get_extra("submitted_at")})
        wh = shared.warehouse
        version = shard_data_version(wh, "rollouts", shard) if shard is not None else wh.data_version("rollouts")
        rows = shard_row_count(wh, "rollouts", shard) if shard is not None else None
        metadata = {**stats, **({"dagster/row_count": rows} if rows is not None else {})}
        pipes.report_asset_materialization(metadata=metadata, data_version=version)


if __name__ == "__main__":
    main()
