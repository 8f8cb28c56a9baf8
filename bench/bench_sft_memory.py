"""Peak memory (RSS) of the SFT warm-up on real tau2 airline trajectories: the plain AdamW loop SFT used to be
against trl.SFTTrainer without and with gradient checkpointing (the project default).

    .venv/bin/python bench/bench_sft_memory.py [--data ../shared/data/tau2-bench] [--max-length 4096]
        [--batch-size 2] [--steps 2] [--out bench/RESULTS_sft_memory.md]

Each arm runs in its own process (its peak RSS is its own ru_maxrss), one after another, on the same examples:
the longest trajectories, rendered with the embedded model's template and cut to max_length, so every step is near
the worst case. Before each arm the run waits until `available` memory is at least --need-gb.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = {"old_loop": "the plain AdamW loop (a copy of the one SFT used before SFTTrainer)",
        "trl_no_checkpointing": "trl.SFTTrainer, gradient checkpointing off",
        "trl_defaults": "trl.SFTTrainer with the sft: defaults (gradient checkpointing on)"}
FUSED_CE = [m for m in ("liger_kernel", "cut_cross_entropy") if importlib.util.find_spec(m)]


def longest_examples(data: str, max_length: int, n: int) -> list[dict]:
    from pivot_assets.policies.models import load_tokenizer
    from pivot_assets.training.sft import build_examples
    from tests.ingest.reference import ingest_to_tables

    trajectories, _, _ = ingest_to_tables([{"path": data}])
    rows = sorted(trajectories.to_pylist(), key=lambda r: -len(str(r["messages"])))[: 3 * n]
    examples = build_examples(rows, load_tokenizer("embedded"), max_length, "trajectory")
    return sorted(examples, key=lambda e: -len(e["input_ids"]))[:n]


def old_loop(examples: list[dict], batch_size: int, steps: int) -> list[float]:
    """The SFT loop before SFTTrainer, as it was: fp32 AdamW, a padded batch, the model's own masked CE."""
    import torch

    from pivot_assets.policies.models import load_model
    from pivot_assets.training.sft import _collate

    model, tokenizer = load_model("embedded", dtype="float32")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    losses = []
    for step in range(steps):
        batch = _collate(examples[step * batch_size:(step + 1) * batch_size], tokenizer.pad_token_id or 0)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def trl_arm(examples: list[dict], batch_size: int, steps: int, checkpointing: bool, max_length: int) -> list[float]:
    import tempfile

    from pivot_assets.core.config import SFTSection
    from pivot_assets.core.hardware import Precision
    from pivot_assets.training.sft import train_sft

    options = SFTSection(steps=steps, batch_size=batch_size, max_length=max_length, learning_rate=1e-5,
                         gradient_checkpointing=checkpointing, save_steps=10 * steps)
    with tempfile.TemporaryDirectory() as tmp:
        rows = train_sft("embedded", examples, options, Path(tmp) / "sft",
                         Precision("float32", "float32", "cpu", "bench"), threads=1)
    return [r["loss"] for r in rows]


def run_arm(args) -> None:
    import torch

    torch.set_num_threads(1)
    examples = longest_examples(args.data, args.max_length, args.batch_size * args.steps)
    t0 = time.perf_counter()
    if args.arm == "old_loop":
        losses = old_loop(examples, args.batch_size, args.steps)
    else:
        losses = trl_arm(examples, args.batch_size, args.steps, args.arm == "trl_defaults", args.max_length)
    seconds = time.perf_counter() - t0
    print(json.dumps({"arm": args.arm, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      "seconds": seconds, "steps_per_s": args.steps / seconds, "losses": losses,
                      "tokens": [len(e["input_ids"]) for e in examples]}))


def available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "tau2-bench"))
    p.add_argument("--max-length", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--need-gb", type=float, default=19.0)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_sft_memory.md"))
    args = p.parse_args()
    if args.arm:
        return run_arm(args)
    results = []
    for arm in args.arms.split(","):
        while available_gb() < args.need_gb:
            print(f"waiting: {available_gb():.1f} GB available, need {args.need_gb}", flush=True)
            time.sleep(30)
        cmd = [sys.executable, __file__, "--arm", arm, "--data", args.data, "--max-length", str(args.max_length),
               "--batch-size", str(args.batch_size), "--steps", str(args.steps)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            results.append({"arm": arm, "error": done.stderr.strip().splitlines()[-1:]})
        else:
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    write_results(args, results)


def write_results(args, results: list[dict]) -> None:
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    lines = ["# SFT warm-up memory: plain loop vs trl.SFTTrainer", "",
             f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- Machine: {cpu.split(':', 1)[-1].strip()}, {os.cpu_count()} cores, "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; torch on 1 thread, fp32",
             f"- Command: `PYTHONPATH=$PWD .venv/bin/python bench/bench_sft_memory.py --max-length {args.max_length} "
             f"--batch-size {args.batch_size} --steps {args.steps}`",
             f"- Data: {Path(args.data).name}/ of the shared data (tau2 airline), the {args.batch_size * args.steps} longest trajectories as whole-"
             f"trajectory examples cut to max_length; model: the embedded SmolLM2",
             f"- Fused/chunked cross-entropy installed: {', '.join(FUSED_CE) or 'none'}",
             "", "Peak RSS is each arm's own ru_maxrss (its own process); steps/s is 2 steps over the arm's wall time after "
             "the examples are built (for the SFTTrainer arms it includes building the trainer and saving the model).",
             "", "| arm | peak RSS (GiB) | steps/s | tokens per example | losses |", "|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {ARMS[r['arm']]} | failed: {r['error']} | | | |")
            continue
        lines.append(f"| {ARMS[r['arm']]} | {r['peak_rss_gb']:.2f} | {r['steps_per_s']:.4f} | "
                     f"{', '.join(map(str, r['tokens']))} | {', '.join(f'{x:.4f}' for x in r['losses'])} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
