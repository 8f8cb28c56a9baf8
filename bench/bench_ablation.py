"""The ablation, cold and timed, into bench/RESULTS_ablation.md (or --out).

    .venv/bin/python bench/bench_ablation.py [--config configs/ablation_cpu.yaml] [--out bench/RESULTS_ablation.md]
                                             [--keep DIR] [--report-only]
    .venv/bin/python bench/bench_ablation.py --config configs/ablation_bfcl.yaml \
        --out bench/RESULTS_ablation_bfcl.md --keep /tmp/ablation-bfcl       # BFCL single-turn, ~150 min

Runs `pivot run --config <copy> --select '*ablation_results'` (what ablation_job runs) in a fresh warehouse and
Dagster home (nothing cached but the converted embedded model): ingest, profiling, curation, the SFT warm-up
(the reference) and ablation_results (every arm trained, then all evaluated). The copy keeps the config's inputs
where they are (relative paths are made absolute). With --keep DIR, a killed run resumes where it stopped when the
same command is run again: finished arms and evaluations are read back, not redone.
Records the wall time of every Dagster step, each arm's training (pool, steps, turns, tokens, useful share), the
evaluation seconds, the load average, the `ablation_table` view on the primary set, and the paired differences
between arms (`ablation_pairs_table`) with whether each 95% interval excludes 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_demo import step_seconds, timed_pivot_run  # noqa: E402


def work_config(path: Path, warehouse: Path) -> str:
    """The config to run: the original with its warehouse in the work dir and its inputs' paths made absolute."""
    import yaml

    raw = yaml.safe_load(path.read_text())
    raw["warehouse"] = str(warehouse)
    for spec in raw.get("inputs") or []:
        for key in ("path", "tools"):
            if spec.get(key) and not Path(spec[key]).is_absolute():
                spec[key] = str((path.resolve().parent / spec[key]).resolve())
    for section, key in (("evaluation", "ood_probe"),):
        value = (raw.get(section) or {}).get(key)
        if value and not Path(value).is_absolute():
            raw[section][key] = str((path.resolve().parent / value).resolve())
    return yaml.safe_dump(raw, sort_keys=False)


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
        config.write_text(work_config(Path(args.config), work / "warehouse"))
        run = timed_pivot_run(config, "*ablation_results", env, work / "run.log")
        total, cpu = run["total_s"], run["cpu_s"]
    load_end = os.getloadavg()
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    steps = step_seconds()
    con = duckdb.connect(str(work / "warehouse" / "pivot.duckdb"), read_only=True)
    table = con.sql("select * from ablation_table")
    header, rows = table.columns, table.fetchall()
    pairs = con.sql("select * from ablation_pairs_table").fetchall()
    pair_header = con.sql("select * from ablation_pairs_table limit 0").columns
    primary = con.sql("select distinct eval_set from ablation_results where \"primary\"").fetchone()[0]
    runs = con.sql("select arm, seed, trainer, pivot_set, pool, steps, turns_trained, not_trained_on, tokens, "
                   "useful_share, cand_overlap_adv, train_s, final_metric from ablation_runs order by seed, arm").fetchall()
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
             f"## ablation_table (primary set: `{primary}`)", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    lines += ["", "## Paired differences between arms (ablation_pairs_table)", "",
              "Pooled over the seeds both arms ran, seed s against seed s on the same evaluation draws; 95% intervals "
              "from the hierarchical bootstrap (seeds, conversations, turns), the same resamples for both sides. "
              "`excludes_zero`: the interval lies wholly above or below 0.", "",
              "| " + " | ".join(pair_header) + " |", "|" + "---|" * len(pair_header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in pairs]
    lines += ["", "## Training per arm", "", "| arm | seed | trainer | set | pool turns | steps | turns trained on | "
              "not trained on | tokens | useful share (GRPO) | D_cand ∩ D_adv | train s | final loss (SFT) / reward "
              "(GRPO) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
