"""What `make demo` costs on this machine: wall time per stage, with and without native bf16, in one run.

    .venv/bin/python bench/bench_demo.py [--modes native,fp32] [--out bench/RESULTS_demo.md]
    .venv/bin/python bench/bench_demo.py --modes native,vllm --out bench/RESULTS_demo_engines.md

`vllm` runs the same config with `policy.backend: vllm` (profiling and evaluation on vLLM's engine; needs
`make setup-vllm`): what `backend: auto` would pick where vLLM is installed.

Each mode runs `pivot run` on the shipped pivot.yaml in a fresh warehouse and Dagster home (a cold demo:
nothing cached but the converted embedded model). `fp32` rehearses a CPU without native bf16 on any CPU:
PIVOT_NATIVE_BF16=0 makes `dtype: auto` resolve to float32 everywhere, which is what such a CPU gets.
Stage times come from the run's Dagster step events; the CPU's flags are printed beside them.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_demo(mode: str, work: Path) -> dict:
    """One cold `pivot run` of the demo config; returns {total_s, steps: {step: seconds}, rc}."""
    config = work / "pivot.yaml"
    text = (ROOT / "pivot.yaml").read_text().replace("warehouse: ./warehouse", f"warehouse: {work / 'warehouse'}")
    if mode == "vllm":
        text = text.replace("  backend: transformers", "  backend: vllm")
    config.write_text(text)
    env = {**os.environ, "DAGSTER_HOME": str(work / "dagster_home"), "HF_HUB_OFFLINE": "1"}
    if mode == "fp32":
        env["PIVOT_NATIVE_BF16"] = "0"
    load = os.getloadavg()[0]
    cpu0, t0 = cpu_seconds_of_children(), time.perf_counter()
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "pivot"), "run", "--config", str(config)], env=env,
                          capture_output=True, text=True)
    total, cpu = time.perf_counter() - t0, cpu_seconds_of_children() - cpu0
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    return {"total_s": total, "cpu_s": cpu, "load": (load, os.getloadavg()[0]), "steps": step_seconds(),
            "rc": proc.returncode, "tail": proc.stderr[-2000:]}


def cpu_seconds_of_children() -> float:
    """User + system CPU seconds of every finished child process tree so far (workers included once reaped).

    On a shared machine wall time measures the neighbours too; the CPU seconds of the run do not (much): a
    single-threaded run on an idle machine takes about its CPU seconds of wall time, less where it runs
    several workers at once."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_pivot_run(config: Path, select: str, env: dict, log: Path) -> dict:
    """`pivot run --config CONFIG --select SELECT`, timed (wall and CPU seconds of its process tree), its output in
    `log`; exits with the run's code when it failed."""
    cpu0, t0 = cpu_seconds_of_children(), time.perf_counter()
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "pivot"), "run", "--config", str(config), "--select", select],
                          env=env, capture_output=True, text=True)
    total, cpu = time.perf_counter() - t0, cpu_seconds_of_children() - cpu0
    log.write_text(proc.stdout + proc.stderr)
    print(f"rc {proc.returncode}, {total:.0f} s (log: {log})", flush=True)
    if proc.returncode:
        print(proc.stderr[-3000:])
        sys.exit(proc.returncode)
    return {"total_s": total, "cpu_s": cpu}


def step_seconds() -> dict[str, float]:
    """Seconds per step of the last run in $DAGSTER_HOME (from its STEP_START / STEP_SUCCESS events)."""
    import dagster as dg

    instance = dg.DagsterInstance.get()
    run = instance.get_runs(limit=1)[0]
    starts, out = {}, {}
    for record in instance.all_logs(run.run_id):
        event = record.dagster_event
        if event is None:
            continue
        if event.event_type_value == "STEP_START":
            starts[event.step_key] = record.timestamp
        elif event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE") and event.step_key in starts:
            out[event.step_key] = record.timestamp - starts[event.step_key]
    return out


def main() -> None:
    from pivot_assets.core.hardware import describe_cpu, native_bf16

    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="native,fp32")
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_demo.md"))
    args = ap.parse_args()
    results = {}
    for mode in args.modes.split(","):
        work = Path(tempfile.mkdtemp(prefix=f"demo-{mode}-"))
        try:
            results[mode] = run_demo(mode, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        r = results[mode]
        print(f"{mode}: rc {r['rc']}, {r['total_s']:.0f} s", flush=True)
        if r["rc"]:
            print(r["tail"])
    native, why = native_bf16("cpu")
    steps = sorted({s for r in results.values() for s in r["steps"]},
                   key=lambda s: -max(r["steps"].get(s, 0) for r in results.values()))
    lines = ["# `make demo` per stage (bench/bench_demo.py)", "",
             f"CPU: {describe_cpu()}; native bf16: {native} ({why}); load average at end {os.getloadavg()[0]:.2f}.",
             "`native`: `dtype: auto` as shipped; `fp32`: PIVOT_NATIVE_BF16=0, what a CPU without bf16 runs; "
             "`vllm`: native with `policy.backend: vllm`. "
             "Cold runs of `pivot run` (install and the one-time GGUF conversion not included).", "",
             "| stage | " + " | ".join(f"{m} (s)" for m in results) + " |", "|---|" + "---|" * len(results)]
    for step in steps:
        lines.append(f"| {step} | " + " | ".join(f"{r['steps'].get(step, 0):.0f}" for r in results.values()) + " |")
    lines.append("| **total `pivot run`** | " + " | ".join(f"**{r['total_s']:.0f}**" for r in results.values()) + " |")
    lines.append("| CPU seconds of the run (all processes) | " + " | ".join(f"{r['cpu_s']:.0f}" for r in results.values())
                 + " |")
    lines.append("| load average at start / end | " + " | ".join(f"{r['load'][0]:.1f} / {r['load'][1]:.1f}"
                                                              for r in results.values()) + " |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
