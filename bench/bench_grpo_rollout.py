"""GRPO step time with completions from the trainer's own `generate` against the project's vLLM engine (TRL's
rollout_func, training/vllm_rollout.py), side by side in one run, into bench/RESULTS_grpo_rollout.md.

    .venv/bin/python bench/bench_grpo_rollout.py [--model DIR] [--turns 16] [--steps 12] [--threads 1]
                                                 [--variants trl,vllm-only,shared,vllm+shared] [--out bench/RESULTS_grpo_rollout.md]

The policy: `--model` (e.g. a pipeline's models/sft_policy), else a short SFT warm-up of the embedded model on
BFCL items apart from the GRPO prompts (bench_ablation_sizing.warm_up: a policy that writes calls and stops, as the
ablation's reference does). The GRPO prompts: `--turns` BFCL single-turn items (simple_python + live_simple),
rendered with their tools as the pipeline renders pivots. Four variants: `trl` (TRL's GRPOTrainer as it comes: its
own generate, each completion scored with its prompt: the baseline), `vllm-only` (completions from the vLLM engine),
`shared` (each group's prompt run once in the loss, training/shared_prompt.py) and `vllm+shared` (both). Each trains the same policy on the same prompts
with the same seed, `training:` as configs/decisive_bfcl.yaml sets it (4 completions of <= 80 tokens a step, lr
1e-5), the tool_call verifier as reward. Measured per variant: wall seconds per optimizer step (TRL's step, the
first one apart: it compiles and warms caches), of which generation (GRPOTrainer._generate, timed around the
call; on vLLM it includes loading the trainer's weights into the engine, also given alone), the engine's start,
and the completions' mean length. Run it on an idle box: the engines alternate with the trainer, each using
`--threads` threads.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CATEGORIES = ["simple_python", "live_simple"]
TRAINING = {"num_generations": 4, "max_completion_length": 80, "learning_rate": 1e-5, "eval_fraction": 0.0,
            "grpo": {"gradient_checkpointing": False}}


def grpo_dataset(items: list[dict]):
    from datasets import Dataset

    return Dataset.from_dict({
        "prompt": [it["messages"] for it in items], "tools": [json.dumps(it["tools"]) for it in items],
        "expert_action": [json.dumps(it["action"]) for it in items], "turn_id": [it["id"] for it in items],
        "trajectory_id": [it["id"] for it in items], "domain": ["bfcl"] * len(items)})


class GenerationTimer:
    """Wall seconds inside GRPOTrainer._generate, per call (one call per optimizer step here)."""

    def __init__(self):
        from trl import GRPOTrainer

        self.calls: list[float] = []
        self._trainer, self._original = GRPOTrainer, GRPOTrainer._generate
        timer = self

        def timed(trainer, prompts):
            t0 = time.perf_counter()
            try:
                return timer._original(trainer, prompts)
            finally:
                timer.calls.append(time.perf_counter() - t0)

        GRPOTrainer._generate = timed

    def close(self):
        self._trainer._generate = self._original


# variant -> (where completions are sampled, the group's prompt run once in the loss)
VARIANTS = {"trl": ("transformers", False),          # TRL as it comes: the baseline
            "vllm-only": ("vllm", False),             # the engine alone
            "shared": ("transformers", True),         # the shared prompt alone
            "vllm+shared": ("vllm", True)}            # both: what training.rollout_engine vllm runs


def run_engine(variant: str, model: str, items: list[dict], steps: int, threads: int) -> dict:
    from pivot_assets.core.config import PivotConfig
    from pivot_assets.core.hardware import resolve_dtype
    from pivot_assets.training.grpo import run_grpo
    from pivot_assets.training.vllm_rollout import RolloutEngine
    from pivot_assets.verifiers import DomainVerifiers

    engine, share = VARIANTS[variant]
    cfg = PivotConfig(training={**TRAINING, "steps": steps, "seed": 0, "share_prompt": share},
                      verifier={"default": {"name": "tool_call", "strings": "bfcl"}})
    rollout = None if engine == "transformers" else RolloutEngine(
        "vllm", "cpu", resolve_dtype("auto", "cpu").dtype, threads, {"enforce_eager": True})
    timer = GenerationTimer()
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run = run_grpo(model, grpo_dataset(items), DomainVerifiers(cfg.verifier), cfg.training, Path(tmp) / "m",
                           cpu_smoke=False, precision=resolve_dtype(cfg.training.dtype, "cpu"), threads=threads,
                           held_out=set(), rollout=rollout)
    finally:
        timer.close()
    wall = time.perf_counter() - t0
    step_s = [r["seconds"] for r in run.steps]
    gen_s = timer.calls
    later = slice(1, None)  # the first step warms caches (and on vLLM pays no weight load)
    sync = run.rollout.get("sync_s")
    return {"variant": variant, "engine": engine, "share_prompt": share, "steps": len(step_s),
            "wall_s": round(wall, 1),
            "setup_s": round(wall - sum(step_s), 1),
            "first_step_s": round(step_s[0], 2), "step_s": round(statistics.median(step_s[later]), 2),
            "generate_s": round(statistics.median(gen_s[later]), 2),
            "train_s": round(statistics.median(s - g for s, g in zip(step_s[later], gen_s[later])), 2),
            "sync_s_per_step": round(sync / max(1, len(step_s) - 1), 2) if sync else None,
            "completion_mean_length": round(statistics.mean(r["completion_mean_length"] for r in run.steps), 1),
            "reward_mean": round(statistics.mean(r["reward_mean"] for r in run.steps), 3),
            "dtype": run.rollout.get("dtype", "float32 weights, " + resolve_dtype("auto", "cpu").dtype + " autocast")}


def markdown(rows: list[dict], args, policy: str, cmd: str) -> str:
    from pivot_assets.core.hardware import describe_cpu, native_bf16

    base = next((r for r in rows if r["variant"] == "trl"), None)
    lines = ["# GRPO steps: the trainer's own generate against the vLLM engine (rollout_func)", "",
             f"Measured {datetime.date.today()} on {describe_cpu()} (native bf16: {native_bf16('cpu')[0]}), "
             f"`{args.threads}` thread(s) per engine; command: `{cmd}`.", "",
             f"Policy: {policy}. {args.turns} BFCL single-turn prompts ({', '.join(CATEGORIES)}), {args.steps} "
             "optimizer steps per engine, one prompt x 4 completions of <= 80 tokens a step, lr 1e-5, seed 0, reward: "
             "tool_call (BFCL strings). Seconds are medians over steps 2..N (step 1 apart: warm-up).", "",
             "| variant | completions from | prompt once in the loss | s / step | of it: generation | training (rest) | "
             "weight load / step | engine start + setup | first step | completion mean tokens | reward mean | "
             "dtype sampled in | step speed-up vs trl |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speed = f"{base['step_s'] / r['step_s']:.2f}x" if base else ""
        lines.append(f"| {r['variant']} | {r['engine']} | {'yes' if r['share_prompt'] else 'no'} | {r['step_s']} | {r['generate_s']} | {r['train_s']} | "
                     f"{r['sync_s_per_step'] if r['sync_s_per_step'] is not None else '-'} | {r['setup_s']} | "
                     f"{r['first_step_s']} | {r['completion_mean_length']} | {r['reward_mean']} | {r['dtype']} | "
                     f"{speed} |")
    lines += ["", "Rows as measured (JSON):", "", "```", *(json.dumps(r) for r in rows), "```", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="the policy (a model dir); default: a short SFT warm-up")
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup-steps", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_grpo_rollout.md"))
    args = ap.parse_args()
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)}; expected some of {', '.join(VARIANTS)}")

    from bench_ablation_sizing import bfcl_items, warm_up

    from pivot_assets.core.config import PivotConfig
    from pivot_assets.core.hardware import configure_torch

    configure_torch(args.threads)
    items = bfcl_items(CATEGORIES)
    random.Random(0).shuffle(items)
    prompts, warmup_items = items[:args.turns], items[args.turns:args.turns + 4 * args.warmup_steps]
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model, policy = args.model, f"`{args.model}`"
        else:
            model = str(Path(tmp) / "sft")
            cfg = PivotConfig(sft={"steps": args.warmup_steps, "learning_rate": 1e-4, "batch_size": 4})
            result = warm_up(cfg, warmup_items, args.warmup_steps, Path(model))
            policy = (f"the embedded SmolLM2-135M after a {args.warmup_steps}-step SFT warm-up on other BFCL items "
                      f"(final loss {result['final_loss']:.3f})")
        from pivot_assets.core.engines import missing

        variants = args.variants.split(",")
        absent = missing("vllm")
        if absent and any(VARIANTS[v][0] == "vllm" for v in variants):
            print(f"the vllm variants are skipped: {absent}", flush=True)
            variants = [v for v in variants if VARIANTS[v][0] != "vllm"]
        rows = []
        for variant in variants:
            rows.append(run_engine(variant, model, prompts, args.steps, args.threads))
            print(json.dumps(rows[-1]), flush=True)
    cmd = "python bench/bench_grpo_rollout.py " + " ".join(sys.argv[1:])
    text = markdown(rows, args, policy, cmd)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
