"""The paper's ablation (Dagster-free): from one initial model, train every arm

    grpo_adv        GRPO on D_adv, rewarded by the profiling (functional) verifier       PivotRL
    grpo_cand       GRPO on D_cand (a random draw of candidates, the size of D_adv)       no filtering
    grpo_mixed      GRPO on D_mixed (every turn with mixed outcomes)
    grpo_adv_exact  GRPO on D_adv, rewarded by `ablation.exact_verifier` (exact match)    exact-match reward
    sft_same_data   per-turn SFT on the same D_adv turns (state cut from the left)       same-data SFT

once per `ablation.seeds` entry, then evaluate them with the base model and the reference on the fixed,
held-out evaluation sets (heldout.py).

- Pools: an arm trains on its pivot set's turns in the training pool (core/split.py: never a held-out or warm-up
  conversation). D_cand is redrawn per seed from the pool's candidates, as many as D_adv has in the pool; its
  overlap with D_adv is reported. sft_same_data trains on exactly grpo_adv's turns.
- Budget: each arm makes `ablation.epochs` passes over its own pool (runs.steps_for_pool); every run logs the
  distinct turns it trained on, its tokens, and for GRPO its useful share (groups with non-zero reward variance:
  the others carry no gradient).
- Seeds: seed s trains arm/s with trainer seed s on its D_cand draw, and every policy compared with it (arm/s,
  the reference, the base model) is scored with evaluation draw s.
- Results: each arm and seed against the reference, the arms pooled over seeds, and the paired differences
  between arms (`PAIRS`), all with hierarchical bootstrap intervals (seeds, conversations, turns); the headline
  reads `ablation.primary`, named before the run.

Each (arm, seed) has its own model dir (models/ablation_<arm>_s<seed>) and completion marker keyed by everything
it depends on (runs.arm_key), so a rerun (or a resumed, killed run) trains only what is missing or stale.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import polars as pl

    from pivot_assets.core.config import PivotConfig
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.verifiers import VerifierSets

ARM_LABELS = {"grpo_adv": "PivotRL (GRPO on D_adv, functional reward)", "grpo_cand": "GRPO on D_cand (no filtering)",
              "grpo_mixed": "GRPO on D_mixed", "grpo_adv_exact": "GRPO on D_adv, exact-match reward",
              "sft_same_data": "same-data SFT (per-turn, D_adv turns)"}
# The paired differences between arms the ablation reports (a - b), where both arms ran.
PAIRS = (("grpo_adv", "grpo_cand"), ("grpo_adv", "grpo_adv_exact"), ("grpo_adv", "sft_same_data"),
         ("grpo_adv", "grpo_mixed"))
RUN_FILE = "ablation_run.json"  # beside the model: the run row, read back when the model is up to date


def arm_verifiers(verifiers: "VerifierSets", arm: str):
    """The reward of an arm: the reward set (training.reward_verifier, else the profiling one), or the exact set
    (ablation.exact_verifier) for grpo_adv_exact; None for SFT."""
    from pivot_assets.training.runs import ARM_SPECS

    reward = ARM_SPECS[arm][2]
    if reward is None:
        return None
    return verifiers.exact if reward == "exact" else verifiers.reward


# -- pools ---------------------------------------------------------------------------------------
def pool_trajectories(wh: "Warehouse", cfg: "PivotConfig") -> set[str]:
    from pivot_assets.core.split import POOL, ConversationSplit

    return ConversationSplit.from_config(cfg).trajectories(wh, POOL)


def cand_seed(cfg: "PivotConfig", seed: int) -> int:
    """The D_cand draw of ablation seed s: apart from pivots.seed's pivots_cand and from every other seed's."""
    from pivot_assets.core.ids import seeded_int

    return seeded_int(cfg.pivots.seed, f"ablation-cand:{seed}", bits=31)


def draw_cand(profiles: "pl.DataFrame", turns: "pl.DataFrame", cfg: "PivotConfig", seed: int,
              size: int) -> "pl.DataFrame":
    """D_cand for one seed: select_pivots' candidate sample over the given (pool) profiles, `size` rows, seeded by
    cand_seed(seed) (the same candidate rules and caps as pivots_cand)."""
    from pivot_assets.curation.selection import select_pivots

    options = cfg.pivots.model_copy(update={"seed": cand_seed(cfg, seed), "cand_size": size})
    return select_pivots(profiles, turns, options)["pivots_cand"]


def arm_pool(wh: "Warehouse", cfg: "PivotConfig", arm: str, seed: int, pool: set[str]) -> "pl.DataFrame":
    """The pivot rows an arm trains on: its pivot set's rows in the training pool; for grpo_cand, seed's own D_cand
    draw from the pool, size-matched to D_adv's pool."""
    import polars as pl

    from pivot_assets.core.catalog import SET_TABLES

    from pivot_assets.training.runs import ARM_SPECS

    in_pool = pl.col("trajectory_id").is_in(sorted(pool))
    pivot_set = ARM_SPECS[arm][1]
    if pivot_set != "cand":
        return wh.read(SET_TABLES[pivot_set]).filter(in_pool).sort("turn_id")
    size = wh.read(SET_TABLES["adv"], ["trajectory_id"]).filter(in_pool).height
    turns = wh.read("turns").filter(in_pool)
    profiles = wh.read("turn_profiles").filter(pl.col("turn_id").is_in(turns["turn_id"].to_list()))
    return draw_cand(profiles, turns, cfg, seed, size).sort("turn_id")


def cand_overlap(wh: "Warehouse", cfg: "PivotConfig", seed: int, pool: set[str]) -> dict:
    """{cand, adv, overlap}: sizes of seed's D_cand draw and of D_adv in the pool, and how many turns they share."""
    cand = set(arm_pool(wh, cfg, "grpo_cand", seed, pool)["turn_id"].to_list())
    adv = set(arm_pool(wh, cfg, "grpo_adv", seed, pool)["turn_id"].to_list())
    return {"cand": len(cand), "adv": len(adv), "overlap": len(cand & adv)}


# -- training --------------------------------------------------------------------------------------
def train_arm(wh: "Warehouse", cfg: "PivotConfig", arm: str, seed: int, verifier_sets: "VerifierSets",
              log: Callable[[str], None], model_name: str | None = None) -> dict:
    """Train one (arm, seed) unless its model with the same key is there. Returns a run row. `model_name`: the
    folder under models/ (default arm_dir(arm, seed)); runs that differ only in a training option (a learning-rate
    sweep) each need their own."""
    from pivot_assets.core.catalog import SET_TABLES
    from pivot_assets.core import hardware
    from pivot_assets.core.ids import canonical_json, short_hash

    from pivot_assets.training.runs import (ARM_SPECS, arm_dir, arm_key, init_model, is_done, prompts_per_step, steps_for_pool,
                       write_marker)

    trainer, pivot_set, _ = ARM_SPECS[arm]
    verifiers = arm_verifiers(verifier_sets, arm)
    pool = pool_trajectories(wh, cfg)
    pivots = arm_pool(wh, cfg, arm, seed, pool)
    turn_ids = pivots["turn_id"].to_list()
    out = wh.model_dir(model_name or arm_dir(arm, seed))
    key = arm_key(wh, cfg, arm, seed, verifiers.fingerprint if verifiers else None, turn_ids)
    if is_done(out, key) and (out / RUN_FILE).is_file():
        log(f"ablation {arm} seed {seed}: up to date ({key}), not retraining")
        return {**json.loads((out / RUN_FILE).read_text()), "skipped": True}
    if not turn_ids:
        raise ValueError(f"ablation {arm}: no {SET_TABLES[pivot_set]} turn in the training pool (see `pivot sql "
                         "pivot_funnel`; raise pivots.lambda_diff, training.eval_fraction/warmup_fraction leave "
                         f"{len(pool)} pool trajectories)")
    from pivot_assets.policies.models import PromptFormat

    init, fmt = init_model(wh, cfg), PromptFormat.from_policy(cfg.policy)
    epochs = cfg.ablation.epochs
    row = {"arm": arm, "seed": seed, "trainer": trainer, "pivot_set": pivot_set, "model_dir": str(out), "key": key,
           "reward_verifier": verifiers.fingerprint if verifiers else None, "epochs": epochs, "pool": len(turn_ids),
           "cand_overlap_adv": (cand_overlap(wh, cfg, seed, pool)["overlap"] if pivot_set == "cand" else None)}
    t0 = time.perf_counter()
    if trainer == "sft":
        from pivot_assets.training.sft import pivot_turns, train_same_data_sft

        options = cfg.sft.model_copy(update={"seed": seed,
                                             "learning_rate": cfg.ablation.sft_learning_rate or cfg.sft.learning_rate})
        log(f"ablation {arm} seed {seed}: sft on {len(turn_ids)} {SET_TABLES[pivot_set]} pool turns, {epochs} "
            f"pass(es) from {init}")
        result = train_same_data_sft(init, pivot_turns(wh, pivots), options, out,
                                     hardware.sft_precision(cfg), log, threads=cfg.runtime.threads,
                                     device=cfg.policy.device, fmt=fmt, epochs=epochs)
        trained, steps = result["turns_trained"], result["steps"]
        stats = {"n_train": result["n_examples"], "final_metric": result["rows"][-1]["loss"],
                 "not_trained_on": len(result["rejections"]), "useful_share": None,
                 "tokens": sum(r["tokens"] for r in result["rows"])}
        steps_rows = [{**r, "arm": arm, "seed": seed} for r in result["rows"]]
    else:
        from pivot_assets.core.progress import Progress
        from pivot_assets.curation.exports import to_hf_dataset

        from pivot_assets.core.split import ConversationSplit

        from pivot_assets.training.grpo import run_grpo
        from pivot_assets.training.vllm_rollout import resolve_rollout_engine

        steps = steps_for_pool(len(turn_ids), prompts_per_step(cfg, "grpo"), epochs)
        dataset = to_hf_dataset(pivots, wh.read("trajectories"))
        device = hardware.training_device()
        options = cfg.training.model_copy(update={"steps": steps, "seed": seed})
        log(f"ablation {arm} seed {seed}: grpo on {len(turn_ids)} {SET_TABLES[pivot_set]} pool turns, {steps} steps "
            f"({epochs} pass(es)) from {init}")
        progress = Progress(total=steps, unit=f"{arm} s{seed} grpo steps", log=log, every_s=0)
        run = run_grpo(init, dataset, verifiers, options, out, cpu_smoke=False,
                       precision=hardware.training_precision(cfg, device), threads=cfg.runtime.threads,
                       held_out=ConversationSplit.from_config(cfg).not_in_pool(wh), device=device, fmt=fmt,
                       full_passes=True,
                       run_key=key, log_line=log,  # checkpoints every training.save_steps: a killed arm resumes
                       rollout=resolve_rollout_engine(cfg),
                       on_step=lambda r: progress.reach(r["step"], f"reward {r.get('reward_mean') or 0:.3f}"))
        trained = run.turns_trained
        zero = [r["frac_reward_zero_std"] for r in run.steps if r.get("frac_reward_zero_std") is not None]
        tokens = [r["num_tokens"] for r in run.steps if r.get("num_tokens") is not None]
        stats = {"n_train": run.n_train_prompts, "not_trained_on": len(set(turn_ids) - trained),
                 "final_metric": run.steps[-1].get("reward_mean") if run.steps else None,
                 "useful_share": round(1.0 - sum(zero) / len(zero), 4) if zero else None,
                 "tokens": int(max(tokens)) if tokens else None}
        steps_rows = [{"step": r["step"], "loss": r.get("loss"), "reward_mean": r.get("reward_mean"),
                       "frac_reward_zero_std": r.get("frac_reward_zero_std"), "num_tokens": r.get("num_tokens"),
                       "seconds": r.get("seconds"), "arm": arm, "seed": seed} for r in run.steps]
    result_row = {**row, **stats, "steps": steps, "turns_trained": len(trained),
                  "turns_trained_fp": short_hash(canonical_json(sorted(trained))),
                  "turn_ids_trained": sorted(trained),  # which turns, not only how many: audits compare arms by id
                  "train_s": round(time.perf_counter() - t0, 1)}
    (out / "ablation_steps.json").write_text(json.dumps(steps_rows))
    (out / RUN_FILE).write_text(json.dumps(result_row))
    write_marker(out, key)
    return {**result_row, "skipped": False}


def _train_arm_job(root: str, cfg: "PivotConfig", arm: str, seed: int) -> dict:
    """train_arm in a worker process: its own warehouse handle and verifiers; log lines to stderr."""
    import sys

    from pivot_assets.core.hardware import configure_torch
    from pivot_assets.shared import resolve_shared

    configure_torch(cfg.runtime.threads)

    def log(message: str) -> None:
        print(f"[ablation {arm} s{seed}] {message}", file=sys.stderr, flush=True)

    shared = resolve_shared(cfg, root)
    return train_arm(shared.warehouse, cfg, arm, seed, shared.verifiers, log)


def ablation_policies(wh: "Warehouse", cfg: "PivotConfig"):
    """(policies to score, {arm: [policy names]}): base (the first seed's draw), the reference (every seed's
    draw: every arm/s is paired with it on draw s) and every arm/s (draw s)."""
    from .heldout import Policy
    from pivot_assets.training.runs import arm_dir, base_model, reference_model

    seeds = tuple(cfg.ablation.seeds)
    policies = [Policy("base", base_model(cfg), draws=seeds[:1]), Policy("reference", reference_model(wh, cfg),
                                                                         draws=seeds)]
    pooled: dict[str, list[str]] = {}
    for arm in cfg.ablation.arms:
        for seed in seeds:
            name = f"{arm}/s{seed}"
            policies.append(Policy(name, str(wh.model_dir(arm_dir(arm, seed))), arm, seed, (seed,)))
            pooled.setdefault(arm, []).append(name)
    return policies, pooled


def run_ablation(wh: "Warehouse", cfg: "PivotConfig", verifiers: "VerifierSets", log: Callable[[str], None]) -> dict:
    """Train every (arm, seed) with its reward set, evaluate all of them with the base model and the reference
    (scored by the profiling set). Returns
    {"rows": ablation_results rows, "pairs": ablation_pairs rows, "runs": per-run rows, "steps": per-step rows,
    "sets", "eval_key", "eval_s", "wall_s"}."""
    from pivot_assets.core.parallel import resolve_workers, run_jobs

    from .heldout import compare, pair_rows, score_policies
    from pivot_assets.training.runs import arm_dir

    if cfg.ablation is None:
        raise ValueError("ablation: the config has no `ablation:` section")
    if cfg.policy.model == "sft" and not cfg.training.warmup_fraction:
        log("ablation: the reference (the SFT warm-up) profiles conversations it was trained on; set "
            "training.warmup_fraction for a warm-up split of its own")
    t0 = time.perf_counter()
    jobs = [(arm, seed) for seed in cfg.ablation.seeds for arm in cfg.ablation.arms]
    workers = resolve_workers(cfg.runtime.workers, cfg.runtime.threads, len(jobs))
    if workers > 1:
        log(f"ablation: {len(jobs)} arm runs, {workers} at a time in worker processes (runtime.workers)")
        runs = run_jobs(_train_arm_job, [(str(wh.root), cfg, arm, seed) for arm, seed in jobs], workers)
    else:
        runs = [train_arm(wh, cfg, arm, seed, verifiers, log) for arm, seed in jobs]
    steps = []
    for run in runs:
        log(f"ablation {run['arm']} seed {run['seed']}: " + ("up to date; " if run["skipped"] else "")
            + f"{run['steps']} steps, {run['turns_trained']} of {run['pool']} pool turns trained on, "
            f"{run['tokens']} tokens, useful share {run['useful_share']}, trained in {run['train_s']} s")
        path = wh.model_dir(arm_dir(run["arm"], run["seed"])) / "ablation_steps.json"
        if path.exists():
            steps.extend(json.loads(path.read_text()))
    _check_same_turns(runs, log)
    policies, pooled = ablation_policies(wh, cfg)
    t_eval = time.perf_counter()
    scored = score_policies(wh, cfg, verifiers.profiling, policies, log, unit="ablation models evaluated")
    rows = compare(cfg, scored.policies, scored.sets, scored.key, reference="reference", pooled=pooled,
                   groups=scored.groups)
    pairs = pair_rows(cfg, scored.policies, scored.sets, scored.key, pooled, PAIRS, scored.groups,
                      cfg.ablation.primary)
    train_s = {(r["arm"], r["seed"]): r["train_s"] for r in runs}
    for r in rows:
        r["train_s"] = train_s.get((r["arm"], r["seed"]))
        r["primary"] = r["eval_set"] == cfg.ablation.primary
    return {"rows": rows, "pairs": pairs, "runs": runs, "steps": steps, "sets": scored.sets, "eval_key": scored.key,
            "eval_s": round(time.perf_counter() - t_eval, 1), "wall_s": round(time.perf_counter() - t0, 1)}


def _check_same_turns(runs: list[dict], log: Callable[[str], None]) -> None:
    """Same-data SFT and GRPO on D_adv must have trained on the same distinct turns (per seed): say so either way."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    for (arm, seed), run in by.items():
        other = by.get(("grpo_adv", seed))
        if arm == "sft_same_data" and other is not None:
            same = run["turns_trained_fp"] == other["turns_trained_fp"]
            log(f"ablation seed {seed}: sft_same_data and grpo_adv trained on "
                + (f"the same {run['turns_trained']} distinct turns" if same else
                   f"different turns ({run['turns_trained']} vs {other['turns_trained']})"))


def ablation_markdown(rows: list[dict], eval_set: str) -> str:
    """The ablation table on one evaluation set (the primary one for the headline) plus OOD, as Markdown."""
    from .heldout import fmt_interval

    by = {(r["policy"], r["eval_set"]): r for r in rows}
    names = list(dict.fromkeys(r["policy"] for r in rows))
    head = (f"| policy | seeds | {eval_set} accuracy [95% CI] | Δ vs reference [95% CI] | OOD accuracy [95% CI] | "
            f"OOD Δ vs reference [95% CI] |\n|---|---|---|---|---|---|")
    lines = [head]
    for name in names:
        local, ood = by.get((name, eval_set)), by.get((name, "ood"))
        if local is None or ood is None:
            continue
        lines.append(f"| {name} | {local.get('n_seeds')} | {fmt_interval(local)} | {fmt_interval(local, 'delta')} | "
                     f"{fmt_interval(ood)} | {fmt_interval(ood, 'delta')} |")
    first = by.get((names[0], eval_set), {}) if names else {}
    n_ood = by.get((names[0], "ood"), {}).get("n") if names else None
    return "\n".join(lines) + (f"\n\n{eval_set}: {first.get('n')} held-out turns from {first.get('n_conversations')} "
                               f"conversations; OOD: {n_ood} probe items.")


def pairs_markdown(pairs: list[dict], eval_set: str) -> str:
    """The paired differences between arms on one evaluation set and OOD, and whether each 95% interval excludes 0."""
    from .heldout import fmt_interval

    lines = ["| pair (a − b) | seeds | Δ on " + eval_set + " [95% CI] | excludes 0 | OOD Δ [95% CI] | excludes 0 |",
             "|---|---|---|---|---|---|"]
    by = {(p["arm_a"], p["arm_b"], p["eval_set"]): p for p in pairs}
    for a, b in dict.fromkeys((p["arm_a"], p["arm_b"]) for p in pairs):
        local, ood = by.get((a, b, eval_set)), by.get((a, b, "ood"))
        if local is None or ood is None:
            continue
        yes = lambda p: ("n/a" if p["excludes_zero"] is None  # noqa: E731
                         else "**yes**" if p["excludes_zero"] else "no")
        lines.append(f"| {a} − {b} | {local['n_seeds']} | {fmt_interval(local, 'delta')} | {yes(local)} | "
                     f"{fmt_interval(ood, 'delta')} | {yes(ood)} |")
    return "\n".join(lines)


def intervals_png(series: dict[str, list[tuple[str, float | None, float | None, float | None]]], *, title: str) -> bytes:
    """One panel per evaluation set: each policy's accuracy as a point with its 95% interval as a bar."""
    from pivot_assets.core.plots import figure_png, pyplot

    plt = pyplot()
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
    return figure_png(plt, fig)
