"""The paper's ablation (Dagster-free): from one initial model and one update budget, train every arm

    grpo_adv        GRPO on D_adv, rewarded by the profiling (functional) verifier       PivotRL
    grpo_cand       GRPO on D_cand (a same-size random draw of candidates)                no filtering
    grpo_mixed      GRPO on D_mixed (every turn with mixed outcomes)
    grpo_adv_exact  GRPO on D_adv, rewarded by `ablation.exact_verifier` (exact match)    exact-match reward
    sft_same_data   per-turn SFT on the same D_adv turns (state cut from the left)       same-data SFT

once per `ablation.seeds` entry, then evaluate them with the base model and the reference on the fixed,
held-out evaluation sets (evaluation.py): accuracy with 95% bootstrap intervals and the paired difference
against the reference. Each (arm, seed) has its own model dir (models/ablation_<arm>_s<seed>) and completion
marker keyed by everything it depends on (runs.arm_key), so a rerun trains only what is missing or stale and
no arm overwrites another. The update budget is the number of optimizer steps (runs.ablation_steps), the same
for every arm; every arm excludes the held-out conversations (split.py).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pivot_assets.core.config import PivotConfig
    from pivot_assets.core.warehouse import Warehouse

ARM_LABELS = {"grpo_adv": "PivotRL (GRPO on D_adv, functional reward)", "grpo_cand": "GRPO on D_cand (no filtering)",
              "grpo_mixed": "GRPO on D_mixed", "grpo_adv_exact": "GRPO on D_adv, exact-match reward",
              "sft_same_data": "same-data SFT (per-turn, D_adv turns)"}


def arm_verifiers(cfg: "PivotConfig", arm: str, profiling_verifiers):
    """The reward of an arm: the training reward verifier (training.reward_verifier, else the profiling one), or
    ablation.exact_verifier for grpo_adv_exact; None for SFT."""
    from pivot_assets.verifiers import DomainVerifiers

    from .runs import ARM_SPECS

    reward = ARM_SPECS[arm][2]
    if reward is None:
        return None
    if reward == "exact":
        return DomainVerifiers(cfg.ablation.exact_verifier)
    return DomainVerifiers(cfg.training.reward_verifier) if cfg.training.reward_verifier else profiling_verifiers


def train_arm(wh: "Warehouse", cfg: "PivotConfig", arm: str, seed: int, profiling_verifiers,
              held_out: set[str], log: Callable[[str], None]) -> dict:
    """Train one (arm, seed) unless its model with the same key is there. Returns a run row."""
    from pivot_assets.core.catalog import SET_TABLES
    from pivot_assets.core.hardware import resolve_dtype

    from .runs import ARM_SPECS, ablation_steps, arm_dir, arm_key, has_cuda, init_model, is_done, write_marker

    trainer, pivot_set, _ = ARM_SPECS[arm]
    verifiers = arm_verifiers(cfg, arm, profiling_verifiers)
    out = wh.model_dir(arm_dir(arm, seed))
    key = arm_key(wh, cfg, arm, seed, verifiers.fingerprint if verifiers else None)
    steps = ablation_steps(cfg)
    row = {"arm": arm, "seed": seed, "trainer": trainer, "pivot_set": pivot_set, "model_dir": str(out), "key": key,
           "steps": steps, "reward_verifier": verifiers.fingerprint if verifiers else None}
    if is_done(out, key):
        log(f"ablation {arm} seed {seed}: up to date ({key}), not retraining")
        return {**row, "skipped": True, "train_s": None, "n_train": None, "final_metric": None, "not_trained_on": None}
    from pivot_assets.policies.models import PromptFormat

    init, fmt = init_model(wh, cfg), PromptFormat.from_policy(cfg.policy)
    log(f"ablation {arm} seed {seed}: {trainer} on {SET_TABLES[pivot_set]}, {steps} steps from {init}")
    t0 = time.perf_counter()
    if trainer == "sft":
        from .sft import pivot_turns, train_same_data_sft

        options = cfg.sft.model_copy(update={"steps": steps, "seed": seed,
                                             "learning_rate": cfg.ablation.sft_learning_rate or cfg.sft.learning_rate})
        turns = pivot_turns(wh, SET_TABLES[pivot_set], held_out)
        if not turns:
            raise ValueError(f"ablation {arm}: no {SET_TABLES[pivot_set]} turn outside the held-out split")
        result = train_same_data_sft(init, turns, options, out, resolve_dtype(cfg.sft.dtype, cfg.policy.device), log,
                                     threads=cfg.runtime.threads, device=cfg.policy.device, fmt=fmt)
        n_train, final = result["n_examples"], result["rows"][-1]["loss"]
        not_trained = len(result["rejections"])
        steps_rows = [{**r, "arm": arm, "seed": seed} for r in result["rows"]]
    else:
        from pivot_assets.core.progress import Progress
        from pivot_assets.curation.exports import to_hf_dataset

        from .grpo import run_grpo

        dataset = to_hf_dataset(wh.read(SET_TABLES[pivot_set]), wh.read("trajectories"))
        if len(dataset) == 0:
            raise ValueError(f"ablation {arm}: the {SET_TABLES[pivot_set]} pivot set is empty: nothing to train on")
        precision = resolve_dtype(cfg.training.dtype, "cuda" if has_cuda() else "cpu")
        options = cfg.training.model_copy(update={"steps": steps, "seed": seed})
        progress = Progress(total=steps, unit=f"{arm} s{seed} grpo steps", log=log, every_s=0)
        run = run_grpo(init, dataset, verifiers, options, out, cpu_smoke=not has_cuda(), precision=precision,
                       threads=cfg.runtime.threads, held_out=held_out, device="cuda" if has_cuda() else "cpu",
                       fmt=fmt,
                       on_step=lambda r: progress.update(1, f"reward {r.get('reward_mean') or 0:.3f}"))
        n_train, not_trained = run.n_train_prompts, 0
        final = run.steps[-1].get("reward_mean") if run.steps else None
        steps_rows = [{"step": r["step"], "loss": r.get("loss"), "reward_mean": r.get("reward_mean"),
                       "seconds": r.get("seconds"), "arm": arm, "seed": seed} for r in run.steps]
    train_s = time.perf_counter() - t0
    (out / "ablation_steps.json").write_text(json.dumps(steps_rows))
    write_marker(out, key)
    return {**row, "skipped": False, "train_s": round(train_s, 1), "n_train": n_train, "final_metric": final,
            "not_trained_on": not_trained}


def _train_arm_job(root: str, cfg: "PivotConfig", arm: str, seed: int, held_out: set[str]) -> dict:
    """train_arm in a worker process: its own warehouse handle and verifiers; log lines to stderr."""
    import sys

    from pivot_assets.core.hardware import configure_torch
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.verifiers import DomainVerifiers

    configure_torch(cfg.runtime.threads)

    def log(message: str) -> None:
        print(f"[ablation {arm} s{seed}] {message}", file=sys.stderr, flush=True)

    return train_arm(Warehouse(root), cfg, arm, seed, DomainVerifiers(cfg.verifier), held_out, log)


def run_ablation(wh: "Warehouse", cfg: "PivotConfig", verifiers, log: Callable[[str], None]) -> dict:
    """Train every (arm, seed), evaluate all of them with the base model and the reference. Returns
    {"rows": ablation_results rows, "runs": per-run rows, "steps": per-step rows, "sets", "eval_key", "wall_s"}."""
    from .evaluation import Policy, compare, score_policies
    from .runs import arm_dir, base_model, reference_model
    from .split import held_out_trajectories

    if cfg.ablation is None:
        raise ValueError("ablation: the config has no `ablation:` section")
    from pivot_assets.core.parallel import resolve_workers, run_jobs

    t0 = time.perf_counter()
    held_out = held_out_trajectories(wh, cfg.training.eval_fraction, cfg.training.seed)
    jobs = [(arm, seed) for arm in cfg.ablation.arms for seed in cfg.ablation.seeds]
    workers = resolve_workers(cfg.runtime.workers, cfg.runtime.threads, len(jobs))
    if workers > 1:
        log(f"ablation: {len(jobs)} arm runs, {workers} at a time in worker processes (runtime.workers)")
        runs = run_jobs(_train_arm_job, [(str(wh.root), cfg, arm, seed, held_out) for arm, seed in jobs], workers)
    else:
        runs = [train_arm(wh, cfg, arm, seed, verifiers, held_out, log) for arm, seed in jobs]
    steps = []
    for run in runs:
        log(f"ablation {run['arm']} seed {run['seed']}: "
            + ("up to date" if run["skipped"] else f"trained in {run['train_s']} s on {run['n_train']} examples"))
        path = wh.model_dir(arm_dir(run["arm"], run["seed"])) / "ablation_steps.json"
        if path.exists():
            steps.extend(json.loads(path.read_text()))
    policies = [Policy("base", base_model(cfg)), Policy("reference", reference_model(wh, cfg))]
    pooled: dict[str, list[str]] = {}
    for arm in cfg.ablation.arms:
        for seed in cfg.ablation.seeds:
            name = f"{arm}/s{seed}"
            policies.append(Policy(name, str(wh.model_dir(arm_dir(arm, seed))), arm, seed))
            pooled.setdefault(arm, []).append(name)
    t_eval = time.perf_counter()
    scored, sets, key = score_policies(wh, cfg, verifiers, policies, log, unit="ablation policies evaluated")
    rows = compare(cfg, scored, sets, key, reference="reference", pooled=pooled)
    train_s = {(r["arm"], r["seed"]): r["train_s"] for r in runs}
    for r in rows:
        r["train_s"] = train_s.get((r["arm"], r["seed"]))
    return {"rows": rows, "runs": runs, "steps": steps, "sets": sets, "eval_key": key,
            "eval_s": round(time.perf_counter() - t_eval, 1), "wall_s": round(time.perf_counter() - t0, 1)}


def ablation_markdown(rows: list[dict], eval_set: str = "adv") -> str:
    """The ablation table on one evaluation set plus OOD, as Markdown (what the asset and the README show)."""
    from .evaluation import fmt_interval

    by = {(r["policy"], r["eval_set"]): r for r in rows}
    names = list(dict.fromkeys(r["policy"] for r in rows))
    head = (f"| policy | {eval_set} accuracy [95% CI] | Δ vs reference [95% CI] | OOD accuracy [95% CI] | "
            f"OOD Δ vs reference [95% CI] |\n|---|---|---|---|---|")
    lines = [head]
    for name in names:
        local, ood = by.get((name, eval_set)), by.get((name, "ood"))
        if local is None or ood is None:
            continue
        lines.append(f"| {name} | {fmt_interval(local)} | {fmt_interval(local, 'delta')} | {fmt_interval(ood)} | "
                     f"{fmt_interval(ood, 'delta')} |")
    n = by.get((names[0], eval_set), {}).get("n") if names else None
    n_ood = by.get((names[0], "ood"), {}).get("n") if names else None
    return "\n".join(lines) + f"\n\n{eval_set}: {n} held-out turns; OOD: {n_ood} probe items."


def intervals_png(series: dict[str, list[tuple[str, float | None, float | None, float | None]]], *, title: str) -> bytes:
    """One panel per evaluation set: each policy's accuracy as a point with its 95% interval as a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    panels = [(name, pts) for name, pts in series.items() if pts]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(4.2 * max(len(panels), 1), 3.6), dpi=100, squeeze=False)
    for ax, (name, pts) in zip(axes[0], panels):
        pts = [p for p in pts if p[1] is not None]
        ys = list(range(len(pts)))
        ax.errorbar([p[1] for p in pts], ys, xerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                    fmt="o", color="#4c72b0", ecolor="#999999", capsize=3)
        ax.set_yticks(ys)
        ax.set_yticklabels([p[0] for p in pts], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0.0, 1.0)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("accuracy")
    fig.suptitle(title, fontsize=9)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
