"""Shard runs, local engine vs Ray engine, on this CPU: the same turns, the same embedded policy, 2 shards.

Starts a single-node Ray head on 127.0.0.1 (free ports, its own temp dir; stopped at the end), then profiles the
same sample twice with `pivot run` (rollouts only, after ingest): `scale.engine: local` (each shard's generation
in its Dagster run's process, K samples per turn from one generator) and `scale.engine: ray` (each shard run
submits a Ray job; Ray Data feeds (turn, sample) rows to one actor). Reports the Ray head's start time, every
shard run's wall time, and rollouts/s: generation alone (local: generation_s; Ray: the job's own wall, actor start
and model load included) and per shard run (Dagster run start to end). Writes bench/RESULTS_shards_ray.md.

    .venv/bin/python bench/bench_shards_ray.py [--trajectories 8 --turns 16 --k 4 --max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PIVOT_TORCH_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.scale.ray_head import start_ray_head  # noqa: E402

PIVOT = [sys.executable, "-m", "pivot_jobs.cli"]
# A Ray job's start-up, step by step (profiling/ray_job.startup_figures), then the total to its first batch
STARTUP = ("submitted_to_driver_s", "driver_boot_s", "pending_rows_s", "ray_data_start_s", "actor_spawn_s",
           "actor_boot_s", "actor_setup_s", "backend_build_s", "to_first_batch_s", "startup_s")


def project(root: Path, args, engine: str, dashboard: str) -> Path:
    root.mkdir(parents=True)
    (root / "home").mkdir()
    (root / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (root / "pivot.yaml").write_text(f"""warehouse: ./wh
sample: {{n_trajectories: {args.trajectories}, seed: 3}}
policy: {{model: embedded, k: {args.k}, max_new_tokens: {args.max_new_tokens}, limit_turns: {args.turns}, batch_size: 32}}
runtime: {{threads: 1}}
scale: {{shards: 2, engine: {engine}, ray_address: "{dashboard}", ray_batch_rows: {args.batch_rows}, max_shard_runs: 1}}
""")
    return root


def run(root: Path, *argv: str) -> float:
    env = {**os.environ, "DAGSTER_HOME": str(root / "home")}
    t0 = time.perf_counter()
    subprocess.run([*PIVOT, *argv], cwd=root, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def shard_figures(root: Path) -> list[dict]:
    os.environ["DAGSTER_HOME"] = str(root / "home")
    import dagster as dg

    instance = dg.DagsterInstance.get()
    out = []
    for r in instance.fetch_materializations(dg.AssetKey("rollouts"), limit=100).records:
        meta = {k: v.value for k, v in r.asset_materialization.metadata.items()}
        stats = instance.get_run_stats(r.run_id)
        rows = meta.get("rollouts_generated", 0)
        out.append({"shard": r.partition_key, "rows": rows, "tokens": meta.get("generated_tokens", 0),
                    "generation_s": meta["generation_s"], "job_s": meta.get("wall_s"),
                    "run_s": stats.end_time - stats.start_time,
                    "startup": {k: meta[k] for k in STARTUP if k in meta}})
    return sorted(out, key=lambda f: f["shard"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, default=8)
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-rows", type=int, default=16)
    ap.add_argument("--nice", type=int, default=19, help="niceness of the Ray head and its workers (local: 0)")
    args = ap.parse_args()
    load = os.getloadavg()
    head = start_ray_head(num_cpus=2, nice=args.nice)
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
            for engine in ("local", "ray"):
                root = project(Path(tmp) / engine, args, engine, head.dashboard)
                run(root, "run", "--in-process", "--select", "trajectories,turns")
                wall = run(root, "run", "--in-process", "--select", "rollouts")
                results[engine] = {"pivot_run_s": wall, "shards": shard_figures(root)}
    finally:
        head.stop()
    lines = ["# Shard runs: local engine vs Ray engine (2 shards, one at a time, this CPU)", "",
             f"{args.trajectories} sample trajectories, first {args.turns} turns, K={args.k}, max_new_tokens="
             f"{args.max_new_tokens}, Ray batch {args.batch_rows} rows, torch 1 thread; load average at start "
             f"{load[0]:.2f}. Ray head (`ray start --head --block`, 127.0.0.1, nice {args.nice}) answered after "
             f"{head.start_s:.1f} s.", "",
             "| engine | shard | rows | tokens | generation s | rollouts/s (generation) | Ray job s | shard run s | rollouts/s (run) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for engine, res in results.items():
        for f in res["shards"]:
            lines.append(f"| {engine} | {f['shard']} | {f['rows']} | {f['tokens']} | {f['generation_s']:.1f} | "
                         f"{f['rows'] / f['generation_s']:.2f} | {f['job_s'] if engine == 'ray' else '-'} | {f['run_s']:.1f} | "
                         f"{f['rows'] / f['run_s']:.2f} |")
        rows = sum(f["rows"] for f in res["shards"])
        lines.append(f"| {engine} | all | {rows} | | | | | `pivot run` {res['pivot_run_s']:.1f} | "
                     f"{rows / res['pivot_run_s']:.2f} |")
    lines += ["", "Generation seconds: local, the backend's generation time in the run's process; Ray, the actor's "
              "time in generate_samples (own seed per row; the transformers backend decodes a turn's rows together). The Ray job's wall adds the "
              "driver, Ray Data and actor start-up and the model load; a shard run adds the Dagster run (process "
              "start, imports) and, for Ray, job submission and log tailing."]
    lines += ["", "Ray job start-up, seconds, per shard (`profiling/ray_job.startup_figures`: the driver's and the "
              "first actor's clocks):", "", "| shard | " + " | ".join(STARTUP) + " |",
              "|---|" + "---|" * len(STARTUP)]
    for f in results["ray"]["shards"]:
        lines.append(f"| {f['shard']} | " + " | ".join(str(f["startup"].get(k, "-")) for k in STARTUP) + " |")
    text = "\n".join(lines) + "\n"
    (REPO / "bench" / "RESULTS_shards_ray.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
