"""Shard planning for `pivot run` on a sharded config (scale.shards > 1): one run per shard, each in its own
`pivot run --shard NNN` process.

The unpartitioned assets the shards need run first, then one run per shard (engine local: one after another;
engine ray: up to scale.max_shard_runs at once, the work being on the cluster), then, once every shard succeeded,
the unpartitioned rest (the pivot sets read every shard). A shard run never opens pivot.duckdb; the views are
refreshed once at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from pivot_jobs.runner import (
    cancel_run,
    parse_selection,
    print_report,
    run_assets,
    stale_targets,
)
from pivot_jobs.supervisor import CHILD, PARENT_PID, RUN_ID, SUPERVISED, stop_children, stop_requested

RAY_HEAD_CHECKED = "PIVOT_RAY_HEAD_CHECKED"  # set by `pivot run` for its shard runs: the Ray head passed the preflight


def run_one_shard(cfg, defs, instance, shard: str, select: str | None) -> int:
    """`pivot run --shard NNN`: the sharded assets of the selection, for that shard's partition."""
    from pivot_assets.profiling.shards import parse_shard, partition_key

    if cfg.scale.shards == 1:
        raise ValueError("--shard needs scale.shards > 1 (nothing is sharded with shards: 1)")
    key = partition_key(parse_shard(shard, cfg.scale.shards))
    graph = defs.resolve_asset_graph()
    keys = [k for k in parse_selection(defs, select) if graph.get(k).partitions_def is not None]
    if not keys:
        raise ValueError(f"--shard runs sharded assets only; {select!r} selects none")
    if not os.environ.get(RAY_HEAD_CHECKED) and submits_ray_jobs(cfg, {key: keys}):
        check_ray_head(cfg)
    print(f"shard {key}: materializing {', '.join(k.to_user_string() for k in keys)}", file=sys.stderr)
    report = run_assets(defs, keys, instance, run_id=os.environ.get(RUN_ID), partition_key=key)
    return 0 if print_report(report, f"shard {key} run", stopped=stop_requested()) else 1


def run_sharded(cfg, defs, instance, plan, config_path: str | None, forced: bool) -> int:
    """The plan's unpartitioned assets before, every shard that needs a run (all of them when `forced`), then the
    unpartitioned assets after."""
    from pivot_assets.core.warehouse import Warehouse

    print(f"materializing {plan.describe()}", file=sys.stderr)
    if plan.before and not print_report(run_assets(defs, plan.before, instance), stopped=stop_requested()):
        return 1
    shards = plan.shards if forced else shards_needing_a_run(defs, instance, plan.shards)
    fresh = sorted(set(plan.shards) - set(shards))
    if fresh:
        print(f"shards fresh, not run: {', '.join(fresh)} (`pivot run --shard NNN` forces one)", file=sys.stderr)
    if submits_ray_jobs(cfg, shards):
        check_ray_head(cfg)
    failed = shard_runs(cfg, shards, config_path)
    if failed:
        print(f"error: shard run(s) failed: {', '.join(failed)}; the assets after them were not run "
              "(`pivot run --stale` reruns what is left)", file=sys.stderr)
        return 1
    if plan.after:
        if not print_report(run_assets(defs, plan.after, instance), stopped=stop_requested()):
            return 1
    else:  # no unpartitioned step ran after the shards: refresh the views over their parts here, once
        Warehouse(cfg.warehouse_dir).refresh_views()
    print(f"warehouse: {cfg.warehouse_dir} (duckdb {cfg.warehouse_dir / 'pivot.duckdb'})")
    return 0


def check_ray_head(cfg) -> None:
    from pivot_assets.profiling.ray_preflight import check_ray_head as preflight

    preflight(cfg, log=lambda line: print(line, file=sys.stderr))


def submits_ray_jobs(cfg, shards: dict) -> bool:
    """True when a shard run will submit a Ray job (engine ray, and `rollouts` among its assets)."""
    return cfg.scale.engine == "ray" and any(k.to_user_string() == "rollouts" for keys in shards.values() for k in keys)


def shards_needing_a_run(defs, instance, shards: dict) -> dict:
    """Each shard's selected assets that are stale or missing (asked after the unpartitioned assets before them
    ran, so a change there shows); a shard whose selected assets are all fresh needs no run."""
    stale = {(r.key, r.partition) for r in stale_targets(defs, instance, include_missing=True)}
    out = {p: [k for k in keys if (k, p) in stale] for p, keys in shards.items()}
    return {p: keys for p, keys in out.items() if keys}


def shard_runs(cfg, shards: dict, config_path: str | None) -> list[str]:
    """Run every shard's run in its own `pivot run --shard` process; the shards that failed."""
    in_flight = cfg.scale.max_shard_runs if cfg.scale.engine == "ray" else 1
    env = {k: v for k, v in os.environ.items() if k != RUN_ID}
    env[SUPERVISED] = "1"  # SIGTERM stops a shard run cleanly (Dagster records it as failed)
    env[PARENT_PID] = str(os.getpid())  # a shard run dies with this process, even on kill -9
    env[RAY_HEAD_CHECKED] = "1"  # checked once by the caller, not again by every shard run
    pending = list(shards.items())
    running: dict[str, tuple[subprocess.Popen, str]] = {}
    failed: list[str] = []
    try:
        while pending or running:
            while pending and len(running) < in_flight:
                key, keys = pending.pop(0)
                argv = ["run", "--in-process", "--shard", key, "--select", ",".join(k.to_user_string() for k in keys)]
                argv += ["--config", config_path] if config_path else []
                run_id = str(uuid.uuid4())
                running[key] = (subprocess.Popen([*CHILD, *argv], env={**env, RUN_ID: run_id}), run_id)
            for key, (proc, _) in list(running.items()):
                if proc.poll() is not None:
                    del running[key]
                    if proc.returncode != 0:
                        failed.append(key)
            time.sleep(0.2)
    finally:  # interrupted: stop the shard runs still going (each keeps the parts it wrote)
        stop_shard_runs(list(running.values()))
    return sorted(failed)


def stop_shard_runs(runs: list[tuple[subprocess.Popen, str]]) -> None:
    """Stop every shard run (each stops its Ray job, Dagster marks its run failed) and mark the Dagster runs of
    those that had to be killed canceled (a run left STARTED would block its shard)."""
    for run_id in stop_children(runs):
        try:
            cancel_run(run_id, "its `pivot run` was interrupted and the shard run killed")
        except Exception as e:  # best effort: the interrupt itself must still be reported
            print(f"warning: could not mark shard run {run_id} canceled: {str(e).splitlines()[0] if str(e) else e!r}",
                  file=sys.stderr)
