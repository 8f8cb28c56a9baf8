"""What a small `pivot run` costs beside the model's work: this tree against a baseline commit, side by side.

Both code versions run the same small project (the curation chain, ingest to pivot sets, on a tiny random-weight
policy, so the model costs almost nothing and what is left is the pipeline's own work: imports, Dagster's run and
event log, the data contracts, the DuckDB views): a first run, a rerun with everything cached, and `pivot check`.
The baseline runs from a `git worktree` of its commit with the same interpreter (PYTHONPATH puts it first).
Each step is repeated and the median wall time reported.

    .venv/bin/python bench/bench_cli_overhead.py --baseline e56db34 [--repeats 3] --out bench/RESULTS_cli_overhead.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHAIN = "trajectories,turns,rollouts,rollout_rewards,turn_profiles,pivots_mixed,pivots_adv,pivots_cand,pivot_selection_log"


def project(root: Path, model: Path) -> Path:
    root.mkdir(parents=True)
    (root / "pivot.yaml").write_text("warehouse: ./wh\nsample: {n_trajectories: 3, seed: 3}\n"
                                     f"policy: {{model: {model}, k: 2, max_new_tokens: 8, limit_turns: 6, "
                                     "batch_size: 4, dtype: float32}\nruntime: {threads: 1}\n")
    return root


def timed(argv: list[str], cwd: Path, code: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(code), "DAGSTER_HOME": str(cwd / "dagster_home"), "HF_HUB_OFFLINE": "1"}
    env.pop("PIVOT_CONFIG", None)
    (cwd / "dagster_home").mkdir(exist_ok=True)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pivot_jobs.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} in {cwd} ({code}): exit {done.returncode}\n{done.stderr[-2000:]}")
    return time.perf_counter() - t0


def measure(code: Path, model: Path, scratch: Path, repeats: int) -> dict[str, float]:
    rows: dict[str, list[float]] = {"first run": [], "rerun, all cached": [], "pivot check": []}
    for i in range(repeats):
        root = project(scratch / f"{code.name}-{i}", model)
        rows["first run"].append(timed(["run", "--in-process", "--select", CHAIN], root, code))
        rows["rerun, all cached"].append(timed(["run", "--in-process", "--select", CHAIN], root, code))
        rows["pivot check"].append(timed(["check"], root, code))
    return {step: statistics.median(times) for step, times in rows.items()}


def main() -> None:
    sys.path.insert(0, str(REPO))
    from pivot_assets.core.hardware import describe_cpu
    from pivot_assets.policies.models import ensure_embedded_hf_dir
    from tests.tiny_model import build_tiny_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="a commit of this repository")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "RESULTS_cli_overhead.md"))
    args = ap.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix="pivot-cli-bench-"))
    base = scratch / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=REPO, check=True,
                   capture_output=True)
    try:
        model = build_tiny_model(ensure_embedded_hf_dir(), scratch / "tiny-llama")
        load_start = os.getloadavg()
        results = {}
        for name, code in ((f"baseline {args.baseline}", base), (f"this tree ({head})", REPO)):
            results[name] = measure(code, model, scratch, args.repeats)
            print(name, results[name], flush=True)
        load_end = os.getloadavg()
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
    (before, b), (after, a) = results.items()
    lines = ["# What a small `pivot run` costs beside the model (bench/bench_cli_overhead.py)", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {describe_cpu()}; {os.cpu_count()} cores. "
             f"Load average at start {load_start[0]:.2f} / {load_start[1]:.2f}, at end {load_end[0]:.2f} / "
             f"{load_end[1]:.2f}.", "", f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`", "",
             "The curation chain (ingest to the pivot sets, 9 assets with their contracts) on 6 turns x K=2 of a tiny "
             f"random-weight policy; `pivot run --in-process` (no supervisor); median of {args.repeats} projects.", "",
             f"| step | {before} (s) | {after} (s) | ratio |", "|---|---|---|---|"]
    lines += [f"| {step} | {b[step]:.1f} | {a[step]:.1f} | {b[step] / a[step]:.2f}x |" for step in b]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
