"""How many torch threads? SFT steps and batched decode at 1..N threads, on an idle and on a busy machine.

    .venv/bin/python bench/bench_threads.py [--seconds 20] [--out bench/RESULTS_threads.md]

Each (threads, load) cell runs in a fresh process (torch's thread pool is per process). "busy" starts one
CPU-bound competitor process per core minus one beside the measured process, the situation of a shared CI
box or of a Dagster run next to a webserver. The default `runtime.threads: auto` (core/hardware.py) is
chosen from this table: the fastest setting that is never pathological under load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x = (x * 31 + 7) % 1_000_003


def measure(threads: int, dtype: str) -> dict:
    """In this process: s per SFT step (batch 2 x 384 tokens) and decode tokens/s (32 rows x 32 steps)."""
    import torch

    from pivot_assets.core.hardware import configure_torch
    from pivot_assets.policies.models import load_model

    configure_torch(threads)
    model, _ = load_model("embedded", dtype="float32")
    ids = torch.randint(100, 40000, (2, 384))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    bf16 = dtype == "bfloat16"

    def sft_step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    sft_step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(2):
        sft_step()
    sft_s = (time.perf_counter() - t0) / 2
    model.eval()
    rows = torch.randint(100, 40000, (32, 64))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(input_ids=rows, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        for _ in range(32):
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        decode_tok_s = 32 * 32 / (time.perf_counter() - t0)
    return {"sft_s_per_step": round(sft_s, 2), "decode_tok_s": round(decode_tok_s, 1)}


def cell(threads: int, busy: bool, dtype: str) -> dict:
    competitors = []
    if busy:
        n = max(1, (os.cpu_count() or 2) - 1)
        stop_at = time.time() + 600
        competitors = [mp.Process(target=_burn, args=(stop_at,), daemon=True) for _ in range(n)]
        for p in competitors:
            p.start()
    try:
        out = subprocess.run([sys.executable, __file__, "--child", str(threads), dtype], capture_output=True,
                             text=True, check=True, cwd=ROOT, timeout=1200)
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for p in competitors:
            p.terminate()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2, default=None)
    ap.add_argument("--max-threads", type=int, default=None)
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_threads.md"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(int(args.child[0]), args.child[1])))
        return
    from pivot_assets.core.hardware import default_threads, describe_cpu, resolve_dtype, usable_cores

    dtype = resolve_dtype("auto").dtype
    counts = sorted({1, default_threads(), min(usable_cores(), args.max_threads or usable_cores())})
    lines = [
        "# Torch threads (bench/bench_threads.py)", "",
        f"CPU: {describe_cpu()}; dtype {dtype} (auto); load average at start {os.getloadavg()[0]:.2f}.",
        "SFT: s per AdamW step, batch 2 x 384 tokens, embedded SmolLM2-135M. Decode: tokens/s, 32 rows x 32 steps.",
        "busy: one CPU-bound competitor process per core minus one.", "",
        "| threads | load | SFT s/step | decode tokens/s |", "|---|---|---|---|",
    ]
    for busy in (False, True):
        for n in counts:
            r = cell(n, busy, dtype)
            lines.append(f"| {n} | {'busy' if busy else 'idle'} | {r['sft_s_per_step']} | {r['decode_tok_s']} |")
            print(lines[-1], flush=True)
    lines += ["", f"Default chosen: `runtime.threads: auto` = max(1, usable cores // 2) = {default_threads()} here."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
