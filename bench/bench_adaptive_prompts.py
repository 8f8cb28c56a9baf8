"""Benchmark: adaptive profiling on the transformers backend with and without prompts kept across rounds, beside
exhaustive profiling, through `pivot run`, side by side in one run.

Usage: .venv/bin/python bench/bench_adaptive_prompts.py [--trajectories 12] [--k 8] [--max-new-tokens 40]

One warehouse is ingested and its SFT warm-up trained once (the reference policy); each variant profiles a copy
of it (identities are by content: a copy reuses the model), so the three see the same turns and policy:
  - exhaustive K;
  - adaptive (posterior rule, pooled prior, eps 0.1, rounds of 2) re-prefilling each turn's prompt every round
    (PROMPT_CACHE_GB = 0: how the backend ran before it kept prompts);
  - adaptive with prompts kept across rounds (the default).
Prints wall time of the profiling steps, samples, prefill tokens computed and the pivot sets' sizes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dagster as dg  # noqa: E402
import duckdb  # noqa: E402

from pivot_jobs.cli import main as pivot  # noqa: E402
from pivot_assets.policies import factory  # noqa: E402

STAGES = "rollouts,rollout_rewards,turn_profiles,pivots_mixed"
ADAPTIVE = "profiling: {seeding: per_sample, adaptive: {enabled: true, rule: posterior, prior: pooled, epsilon: 0.1, round_size: 2}}"


def config(args, adaptive: bool) -> str:
    return f"""warehouse: ./wh
sample: {{n_trajectories: {args.trajectories}, seed: 0}}
sft: {{steps: 8}}
policy: {{model: sft, k: {args.k}, max_new_tokens: {args.max_new_tokens}}}
{ADAPTIVE if adaptive else "profiling: {seeding: per_sample}"}
"""


def run_variant(base: Path, root: Path, text: str, keep_prompts: bool) -> dict:
    shutil.copytree(base / "wh", root / "wh")
    (root / "pivot.yaml").write_text(text)
    os.environ["DAGSTER_HOME"] = str(root / "dagster_home")
    (root / "dagster_home").mkdir()
    os.chdir(root)
    factory.PROMPT_CACHE_GB = 2.0 if keep_prompts else 0.0
    t0 = time.perf_counter()
    assert pivot(["run", "--select", STAGES]) == 0
    wall = time.perf_counter() - t0
    event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey("rollouts"))
    meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    con = duckdb.connect(str(root / "wh" / "pivot.duckdb"), read_only=True)
    sizes = dict(con.sql("select stage, turns from pivot_funnel").fetchall())
    con.close()
    return {"wall_s": wall, "samples": meta.get("rollouts_generated"), "prefill": meta.get("prefill_tokens_computed"),
            "generation_s": meta.get("generation_s"), "rounds": meta.get("rounds", 1), "mixed": sizes.get("mixed"),
            "adv": sizes.get("adv")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trajectories", type=int, default=12)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=40)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        base = Path(d) / "base"
        base.mkdir()
        (base / "pivot.yaml").write_text(config(args, adaptive=False))
        os.environ["DAGSTER_HOME"] = str(base / "dagster_home")
        (base / "dagster_home").mkdir()
        os.chdir(base)
        assert pivot(["run", "--select", "trajectories,turns,sft_policy"]) == 0
        rows = []
        for name, adaptive, keep in (("exhaustive", False, True), ("adaptive, re-prefill each round", True, False),
                                     ("adaptive, prompts kept", True, True)):
            rows.append((name, run_variant(base, Path(d) / name.replace(" ", "_").replace(",", ""),
                                           config(args, adaptive), keep)))
        print(f"\n{args.trajectories} trajectories, K={args.k}, max_new_tokens {args.max_new_tokens}; "
              f"load average {os.getloadavg()}\n")
        print("| variant | wall s (profiling steps) | generation s | samples | prefill tokens | rounds | mixed | adv |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, r in rows:
            print(f"| {name} | {r['wall_s']:.1f} | {r['generation_s']} | {r['samples']} | {r['prefill']} | "
                  f"{r['rounds']} | {r['mixed']} | {r['adv']} |")


if __name__ == "__main__":
    main()
