"""SFT speed on this machine, fp32 vs bf16 autocast, in one run; plus how closely bf16 matches fp32.

    .venv/bin/python bench/bench_sft.py [--steps 4] [--ood] [--threads N] [--out bench/RESULTS_sft.md]

Same examples, same batches, a fresh copy of the embedded model per mode; one warm-up step is not timed.
--ood also measures the base model's zero-shot OOD-probe accuracy (the retention baseline of pivot_eval).
Prints a markdown table and writes it (with the machine's load) to --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from pivot_assets.policies.models import load_model  # noqa: E402
from pivot_assets.ingest.sample_data import generate_trajectories  # noqa: E402
from pivot_assets.training.sft import _collate, build_sft_examples  # noqa: E402


def timed_steps(examples: list[dict], batch_size: int, steps: int) -> dict[str, dict]:
    """fp32 and bf16-autocast training steps on the same batches, interleaved (fp32/bf16, then bf16/fp32, ...)
    so a change in machine load during the run hits both modes alike. One model + AdamW per mode."""
    runs = {}
    for mode in ("fp32", "bf16"):
        model, tokenizer = load_model("embedded", dtype="float32")
        model.train()
        runs[mode] = {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4),
                      "tokens": 0, "seconds": 0.0, "losses": []}
    batches = [_collate(examples[i:i + batch_size], tokenizer.pad_token_id)
               for i in range(0, batch_size * (steps + 1), batch_size)]
    for i, batch in enumerate(batches):
        order = ("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32")
        for mode in order:
            r = runs[mode]
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16")):
                loss = r["model"](**batch).loss
            loss.backward()
            r["opt"].step()
            r["opt"].zero_grad(set_to_none=True)
            if i > 0:  # step 0 warms up allocators and kernels
                r["seconds"] += time.perf_counter() - t0
                r["tokens"] += int(batch["attention_mask"].sum())
                r["losses"].append(float(loss.detach()))
    return {mode: {"tokens": r["tokens"], "seconds": r["seconds"], "tok_s": r["tokens"] / r["seconds"],
                   "s_per_step": r["seconds"] / steps, "first_loss": r["losses"][0]} for mode, r in runs.items()}


def logit_agreement(examples: list[dict]) -> dict:
    model, _ = load_model("embedded", dtype="float32")
    x = torch.tensor([examples[0]["input_ids"]])
    labels = torch.tensor(examples[0]["labels"])
    with torch.no_grad():
        fp32 = model(x).logits[0].float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(x).logits[0].float()
    diff = (fp32 - bf16).abs()
    assistant = labels[1:] != -100  # positions whose next token carries loss
    same_argmax = (fp32.argmax(-1) == bf16.argmax(-1))[:-1][assistant].float().mean()
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "logit_range": float(fp32.abs().max()),
            "argmax_agree": float(same_argmax), "n_tokens": x.shape[1]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--ood", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 avoids oversubscription on a busy box)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("RESULTS_sft.md")))
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    _, tokenizer = load_model("embedded")
    examples = build_sft_examples(generate_trajectories(40, seed=0), tokenizer, max_length=1024)
    runs = timed_steps(examples, args.batch_size, args.steps)
    agree = logit_agreement(examples)
    lines = [
        f"SFT on the embedded SmolLM2-135M, toy-shop sample, batch {args.batch_size}, {args.steps} timed steps per mode, interleaved "
        f"(torch threads {torch.get_num_threads()}, load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores)",
        "",
        "| mode | tokens/s | s/step | tokens timed | first timed loss |",
        "|---|---|---|---|---|",
    ]
    for mode, r in runs.items():
        lines.append(f"| {mode} | {r['tok_s']:.0f} | {r['s_per_step']:.2f} | {r['tokens']} | {r['first_loss']:.4f} |")
    lines += [
        "",
        f"bf16 speed-up: {runs['bf16']['tok_s'] / runs['fp32']['tok_s']:.2f}x",
        "",
        "| fp32 vs bf16-autocast forward | value |",
        "|---|---|",
        f"| tokens | {agree['n_tokens']} |",
        f"| max abs logit diff | {agree['max_abs']:.4f} |",
        f"| mean abs logit diff | {agree['mean_abs']:.4f} |",
        f"| max abs fp32 logit | {agree['logit_range']:.2f} |",
        f"| argmax agreement on assistant positions | {agree['argmax_agree']:.3f} |",
    ]
    if args.ood:
        from pivot_assets.evaluation.ood_probe import ood_accuracy, ood_probe_items

        t0 = time.perf_counter()
        details: list = []
        acc = ood_accuracy("embedded", ood_probe_items(), details=details)
        by_kind: dict = {}
        for d in details:
            by_kind.setdefault(d["kind"], []).append(d["correct"])
        lines += ["", f"Base model OOD probe: {acc:.3f} ({sum(d['correct'] for d in details)}/{len(details)}), "
                  f"{time.perf_counter() - t0:.0f} s greedy, max_new_tokens 20", "",
                  "| kind | correct |", "|---|---|"]
        lines += [f"| {k} | {sum(v)}/{len(v)} |" for k, v in by_kind.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text("# SFT benchmark (bench/bench_sft.py)\n\n" + text)


if __name__ == "__main__":
    main()
