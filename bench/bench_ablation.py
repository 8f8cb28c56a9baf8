"""The ablation at CPU scale, cold and timed (configs/ablation_cpu.yaml), into bench/RESULTS_ablation.md.

    .venv/bin/python bench/bench_ablation.py [--config configs/ablation_cpu.yaml] [--out bench/RESULTS_ablation.md]
                                             [--keep DIR]

Runs `pivot run --config <copy> --select '*ablation_results'` (what ablation_job runs) in a fresh warehouse and
Dagster home (nothing cached but the converted embedded model): ingest, profiling, curation, the SFT warm-up
(the reference) and ablation_results (every arm trained, then all evaluated).
Records the wall time of every Dagster step, the training seconds of every arm, the evaluation seconds, the load
average, and the `ablation_table` view.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_demo import cpu_seconds_of_children, step_seconds  # noqa: E402


def main() -> None:
    import duckdb

    from pivot_assets.core.hardware import describe_cpu, native_bf16

    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "configs" / "ablation_cpu.yaml"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_ablation.md"))
    ap.add_argument("--keep", default=None, help="work dir to keep (warehouse, Dagster home); default: a temp dir")
    ap.add_argument("--report-only", action="store_true",
                    help="no run: write the report from the warehouse and last run already in --keep DIR")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ablation-"))
    work.mkdir(parents=True, exist_ok=True)
    config = work / "pivot.yaml"
    env = {**os.environ, "DAGSTER_HOME": str(work / "dagster_home"), "HF_HUB_OFFLINE": "1"}
    load_start = os.getloadavg()
    total = cpu = None
    if not args.report_only:
        text = Path(args.config).read_text()
        config.write_text(re.sub(r"(?m)^warehouse: .*$", f"warehouse: {work / 'warehouse'}", text))
        cpu0, t0 = cpu_seconds_of_children(), time.perf_counter()
        proc = subprocess.run([str(ROOT / ".venv" / "bin" / "pivot"), "run", "--config", str(config),
                               "--select", "*ablation_results"], env=env, capture_output=True, text=True)
        total, cpu = time.perf_counter() - t0, cpu_seconds_of_children() - cpu0
        (work / "run.log").write_text(proc.stdout + proc.stderr)
        print(f"rc {proc.returncode}, {total:.0f} s (log: {work / 'run.log'})", flush=True)
        if proc.returncode:
            print(proc.stderr[-3000:])
            sys.exit(proc.returncode)
    load_end = os.getloadavg()
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    steps = step_seconds()
    con = duckdb.connect(str(work / "warehouse" / "pivot.duckdb"), read_only=True)
    table = con.sql("select * from ablation_table")
    header, rows = table.columns, table.fetchall()
    runs = con.sql("select arm, seed, trainer, pivot_set, steps, n_train, train_s, final_metric from ablation_runs").fetchall()
    funnel = con.sql("select * from pivot_funnel").fetchall() if "pivot_funnel" in {
        r[0] for r in con.sql("select view_name from duckdb_views()").fetchall()} else []
    sets = con.sql("select eval_set, max(n) from ablation_results group by eval_set order by eval_set").fetchall()
    eval_s = con.sql("select sum(s) from (select distinct model_fp, seconds as s from ablation_results "
                     "where model_fp is not null)").fetchone()[0]
    native, why = native_bf16("cpu")
    fmt = lambda v: "" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["# The ablation at CPU scale (bench/bench_ablation.py)", "",
             f"Config: `{Path(args.config).relative_to(ROOT) if Path(args.config).is_relative_to(ROOT) else args.config}`; "
             f"CPU: {describe_cpu()}; native bf16: {native} ({why}); {os.cpu_count()} cores.",
             f"Load average at start {load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f}, at end "
             f"{load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f} (the machine is shared).", "",
             (f"**Wall time of the whole cold `pivot run` `--select '*ablation_results'` (ingest to ablation_results): "
              f"{total / 60:.1f} min; CPU time of all its processes {cpu / 60:.1f} min.**"
              if total is not None else "Report of an existing run (--report-only)."), "",
             "Evaluation sets (held out, fixed): " + ", ".join(f"{s}: {n}" for s, n in sets) + ".", "",
             "## ablation_table", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    lines += ["", "## Training per arm", "", "| arm | seed | trainer | set | steps | train examples/prompts | "
              "train s | final loss (SFT) / reward (GRPO) |", "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in runs]
    lines += ["", f"Evaluation (sampling + OOD probe, summed over distinct models): {fmt(eval_s)} s.", "",
              "## Wall time per Dagster step", "", "| step | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in sorted(steps.items(), key=lambda kv: -kv[1])]
    if funnel:
        lines += ["", "## Pivot funnel", "", *[f"- {' '.join(str(x) for x in r)}" for r in funnel]]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
