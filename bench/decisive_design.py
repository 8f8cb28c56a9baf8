"""The design of the decisive comparison, written before the run: GRPO on D_adv against GRPO on D_cand at
equal GRPO compute, BFCL single-turn, on this 2-core CPU.

    .venv/bin/python bench/decisive_design.py [--budget-min 180] [--target 0.03] [--write bench/RESULTS_decisive_bfcl.md]

1. Variance components of the held-out score, backed out of the reduced run's reported intervals
   (bench/RESULTS_ablation_bfcl_quick.md: 2 seeds x 174 held-out items (one conversation each) x eval_k 2; the repository
   keeps no per-item scores of that run, only its intervals):
   - within-item sample variance sw2 and between-item variance sp2, from the reference's accuracy interval (one
     model: no training seed; its interval is items and samples only) and the binary reward (tool_call scores 0 or 1):
         V_ref = (hw_ref / 1.96)^2 = (sp2 + sw2 / n) / I0,    sp2 + sw2 = p (1 - p),    n = S0 k0 samples per item
   - item x arm interaction sd2 of the paired difference: bounded by the whole variance of the closest pair the run has,
     grpo_adv - grpo_adv_exact (same pool, same seeds): sd2 = I0 V_ae (conservative: all of it counted as item variance)
   - seed variance tau2 of the adv - cand effect (training randomness and the D_cand draw): what is left of the adv - cand
     variance. The hierarchical bootstrap with S0 seeds resamples seeds, whose variance term is tau2 (S0 - 1) / S0^2
     (1/4 at S0 = 2), so  tau2 = (V_ac - sd2 / I0 - 2 sw2 / (S0 I0 k0)) S0^2 / (S0 - 1)
     (the sampling term counts the two arms' samples as independent; the shared per-sample seeds correlate them, so this
     leaves more to tau2, the conservative side).
2. The paired adv - cand 95% interval of a design (S seeds, I held-out items, eval_k k), normal approximation:
         V = tau2 / S + sd2 / I + 2 sw2 / (S I k),     half-width = 1.96 sqrt(V)
3. Its cost on this CPU from the timed pieces (docs/evaluation.md sizing table, this 2-core AMD EPYC; and
   bench/RESULTS_ablation_bfcl_sizing.md), wall minutes with two workers (1.5x one core, bench/RESULTS_threads.md):
         fixed  = ingest + warm-up (48 steps x 7.4 s) + profiling (P + I) x 2.85 s   (one core)
         a seed = [2 arms x (T steps x g + 15 s load/save) + 3 models (reference, adv, cand) x I x c(k)] / 1.5
         c(k)   = 1.13 + 0.215 k s a turn (the prompt's prefill once, then k samples: 1.99 s at k=4, 2.85 s at K=8)
   T = the D_adv pool (one pass, one prompt group a step), at the highest D_adv share seen (0.36) for the cost and the
   lowest (0.26) for the constraint D_adv >= 60.
4. The design: the smallest half-width that fits the budget (default 180 min); the target (0.03) when it fits.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

Z = 1.96
# -- inputs, each with its source ------------------------------------------------------------------------------
QUICK = "bench/RESULTS_ablation_bfcl_quick.md"
INPUTS = {
    "S0": (2, f"{QUICK}: ablation seeds [0, 1]"),
    "I0": (174, f"{QUICK}: profiled set, 174 held-out items, 174 conversations"),
    "k0": (2, "configs/ablation_bfcl_quick.yaml: evaluation.k 2"),
    "p_ref": (0.188, f"{QUICK}: reference accuracy 0.188 [0.147, 0.231]"),
    "ref_ci": ((0.147, 0.231), f"{QUICK}: reference row, ci95"),
    "ac_ci": ((-0.043, 0.075), f"{QUICK}: pair grpo_adv - grpo_cand, profiled, +0.016 [-0.043, +0.075]"),
    "ae_ci": ((-0.010, 0.032), f"{QUICK}: pair grpo_adv - grpo_adv_exact, profiled, +0.011 [-0.010, +0.032]"),
    "g": (19.8, "bench/RESULTS_ablation_bfcl_sizing.md: GRPO 19.77 CPU s a step (4 completions <= 80 tokens; "
                "docs/evaluation.md: 18.1 on this EPYC; the larger taken)"),
    "c4": (1.99, "docs/evaluation.md sizing table (this AMD EPYC): evaluation, a turn at K=4, 1.99 CPU s "
                 "(~1.1 of it the prompt's prefill)"),
    "c8": (2.85, "docs/evaluation.md sizing table: profiling, a turn at K=8, 2.85 CPU s"),
    "sft_step": (7.4, "docs/evaluation.md sizing table: warm-up SFT, a step of 4 examples, 7.4 CPU s"),
    "sft_steps": (48, "configs/ablation_bfcl.yaml: sft.steps 48"),
    "load_s": (15.0, "bench/RESULTS_ablation_bfcl_sizing.md: model load/save ~15 s per arm run"),
    "ingest_s": (60.0, "assumed: ingest and the embedded model's conversion, about a minute"),
    "par": (1.5, "bench/RESULTS_threads.md via docs/evaluation.md: two busy cores give 1.5-1.6x one core"),
    "adv_share_low": (0.26, "bench/RESULTS_ablation_bfcl.md: D_adv 10 of the 38-item pool (the lowest share seen)"),
    "adv_share_high": (0.36, f"{QUICK}: funnel, 79 adv of 220 profiled (the highest share seen)"),
    "min_adv": (60, "the design: D_adv >= 60 turns in the pool, enough steps for the reward to move"),
    "min_warmup": (190, "the quick run's warm-up size (~190 items), whose reference (0.188) is measured"),
}
BFCL = [ROOT / ".venv/lib/python3.11/site-packages/bfcl_eval/data/BFCL_v4_simple_python.json",
        ROOT / ".venv/lib/python3.11/site-packages/bfcl_eval/data/BFCL_v4_live_simple.json"]


def v(name):
    return INPUTS[name][0]


def components() -> dict:
    """sw2, sp2, sd2, tau2 (and the pieces) from the quick run's intervals (module docstring, step 1)."""
    S0, I0, k0, p = v("S0"), v("I0"), v("k0"), v("p_ref")
    hw = lambda ci: (ci[1] - ci[0]) / 2  # noqa: E731
    V_ref = (hw(v("ref_ci")) / Z) ** 2
    n = S0 * k0
    total = p * (1 - p)                                 # sp2 + sw2 (binary reward)
    item_mean_var = V_ref * I0                          # sp2 + sw2 / n
    sw2 = (total - item_mean_var) / (1 - 1 / n)
    sp2 = total - sw2
    V_ac, V_ae = (hw(v("ac_ci")) / Z) ** 2, (hw(v("ae_ci")) / Z) ** 2
    sd2 = I0 * V_ae
    sampling0 = 2 * sw2 / (S0 * I0 * k0)
    tau2 = (V_ac - sd2 / I0 - sampling0) * S0 ** 2 / (S0 - 1)
    tau2_high = V_ac * S0 ** 2 / (S0 - 1)              # everything in the adv - cand interval counted as seeds
    return {"V_ref": V_ref, "sw2": sw2, "sp2": sp2, "V_ac": V_ac, "V_ae": V_ae, "sd2": sd2, "sampling0": sampling0,
            "tau2": tau2, "tau2_high": tau2_high, "tau2_low": tau2 / 2}


def half_width(c: dict, S: int, I: int, k: int, tau2: float | None = None) -> float:
    t = c["tau2"] if tau2 is None else tau2
    return Z * math.sqrt(t / S + c["sd2"] / I + 2 * c["sw2"] / (S * I * k))


def eval_turn_s(k: int) -> float:
    b = (v("c8") - v("c4")) / 4
    return v("c4") - 4 * b + b * k


def minutes(S: int, I: int, k: int, P: int) -> dict:
    T = math.ceil(v("adv_share_high") * P)
    fixed = v("ingest_s") + v("sft_steps") * v("sft_step") + (P + I) * v("c8")
    train = S * 2 * (T * v("g") + v("load_s")) / v("par")
    evaluate = S * 3 * I * eval_turn_s(k) / v("par")
    return {"fixed": fixed / 60, "train": train / 60, "eval": evaluate / 60, "total": (fixed + train + evaluate) / 60,
            "steps": T}


def bfcl_ids() -> list[str]:
    ids = []
    for path in BFCL:
        with open(path) as f:
            ids += [json.loads(line)["id"] for line in f if line.strip()]
    return ids


def split_counts(ids: list[str], eval_fraction: float, warmup_fraction: float, seed: int = 0) -> dict:
    from pivot_assets.core.split import ConversationSplit

    split = ConversationSplit(eval_fraction, warmup_fraction, seed)
    out = {"held_out": 0, "warmup": 0, "pool": 0}
    for i in ids:
        out[split.role(i)] += 1
    return out


def find_split(ids: list[str], held_out: int, pool: int) -> tuple[float, float, dict]:
    """eval_fraction, warmup_fraction (3 decimals) giving `held_out` items held out (the nearest) and a pool of at
    least `pool` items (the smallest)."""
    from pivot_assets.core.ids import seeded_unit

    u = sorted(seeded_unit(0, i) for i in ids)
    # held out: u < e; pool: u >= e + w
    e = round((u[held_out - 1] + u[held_out]) / 2, 3) if held_out < len(u) else 0.999
    best = None
    for w_milli in range(0, 1000):
        w = w_milli / 1000
        if e + w >= 1:
            break
        counts = split_counts(ids, e, w)
        if counts["pool"] >= pool:
            best = (e, w, counts)
    return best


def design(budget: float, target: float) -> dict:
    c = components()
    ids = bfcl_ids()
    N = len(ids) - 2  # 2 live_simple items are quarantined (their answer lists an argument with no accepted value)
    P = math.ceil(v("min_adv") / v("adv_share_low"))
    I_max = N - P - v("min_warmup")
    grid = [(S, I, k) for S, I, k in itertools.product(range(1, 41), range(50, I_max + 1, 5), (1, 2, 4, 8))]
    fits = [(half_width(c, S, I, k), minutes(S, I, k, P)["total"], S, I, k) for S, I, k in grid
            if minutes(S, I, k, P)["total"] <= budget]
    best = min(fits)
    reach = [(minutes(S, I, k, P)["total"], half_width(c, S, I, k), S, I, k) for S, I, k in grid
             if half_width(c, S, I, k) <= target]
    cheapest = min(reach) if reach else None
    return {"c": c, "N": N, "P": P, "I_max": I_max, "best": best, "cheapest_target": cheapest, "ids": ids}


def render(d: dict, budget: float, target: float) -> str:
    c, (hw, total, S, I, k), P = d["c"], d["best"], d["P"]
    m = minutes(S, I, k, P)
    e, w, counts = find_split(d["ids"], I, P)
    check = split_counts(d["ids"], 0.45, 0.483)
    fits_target = hw <= target
    lines = [
        "# The decisive comparison: GRPO on D_adv against GRPO on D_cand at equal GRPO compute (BFCL single-turn)", "",
        "## Design, written before the run", "",
        "Written by `.venv/bin/python bench/decisive_design.py` before any unit of the run existed; the runner "
        "(`bench/decisive.py --report`) appends the results below this section and leaves it as it is.", "",
        "Two arms, `grpo_adv` and `grpo_cand`: the same init (the SFT warm-up, the reference), the same number of GRPO "
        "steps (D_cand is drawn per seed from the pool's candidates, as many as D_adv has in the pool; one pass, one "
        "prompt group of 4 completions a step), the same seeds and the same learning rate; the reference is scored on "
        "each seed's draw. The headline is the paired `grpo_adv - grpo_cand` difference on every held-out profiled "
        "item, pooled over the seeds (seed s of each arm on evaluation draw s), with its 95% interval from the "
        "project's hierarchical bootstrap (seeds, then conversations, then items).", "",
        "### Inputs", "", "| name | value | source |", "|---|---|---|"]
    lines += [f"| {name} | {val} | {src} |" for name, (val, src) in INPUTS.items()]
    lines += [
        "", "### Variance components (backed out of the reduced run's intervals: no per-item data of it is in the "
        "repository)", "",
        "Normal approximation, V = (half-width / 1.96)^2; S0 = 2 seeds, I0 = 174 items, k0 = 2 samples.", "",
        f"- reference: V_ref = ({(v('ref_ci')[1] - v('ref_ci')[0]) / 2:.4f} / 1.96)^2 = {c['V_ref']:.3g} = (sp2 + sw2/4) "
        f"/ 174, and sp2 + sw2 = p(1-p) = {v('p_ref') * (1 - v('p_ref')):.4f} (binary reward): **within-item sample "
        f"variance sw2 = {c['sw2']:.4f}, between-item variance sp2 = {c['sp2']:.4f}**",
        f"- item x arm interaction: sd2 = I0 V_ae = 174 x {c['V_ae']:.3g} = **{c['sd2']:.4f}** (all of the adv - exact "
        "pair's variance counted as item variance: an upper bound)",
        f"- seed variance of the adv - cand effect: tau2 = (V_ac - sd2/I0 - 2 sw2/(S0 I0 k0)) x S0^2/(S0-1) = "
        f"({c['V_ac']:.3g} - {c['sd2'] / v('I0'):.3g} - {c['sampling0']:.3g}) x 4 = **{c['tau2']:.3g} (sd "
        f"{math.sqrt(c['tau2']):.3f})**; if the whole adv - cand interval were seed variance: {c['tau2_high']:.3g} "
        f"(sd {math.sqrt(c['tau2_high']):.3f})",
        "", "The seed term dominates: a seed of the quick run moved the adv - cand difference by about "
        f"{math.sqrt(c['tau2']):.2f} (different D_cand draws of 14 turns overlapping D_adv in 2 and 7, 14-step runs). "
        "With two seeds this estimate is itself rough (one degree of freedom); pools of 60+ turns may average part of "
        "the D_cand draw away, and longer training may widen or narrow it. The run's own seeds re-estimate it.", "",
        "### Half-width of the paired adv - cand 95% interval", "",
        "V(S, I, k) = tau2/S + sd2/I + 2 sw2/(S I k); half-width = 1.96 sqrt(V). The first row is the quick run's "
        "shape: 0.074 here where its bootstrap printed 0.059, because a bootstrap over S seeds puts (S-1)/S of the "
        "seed term in its interval (1/2 at two seeds): these are the true half-widths, which the printed interval "
        "approaches as seeds are added.", "",
        "| seeds | items | eval_k | half-width | tau2 low / high | wall min (this CPU) |", "|---|---|---|---|---|---|"]
    for S2, I2, k2 in ((2, 174, 2), (3, 150, 2), (S, I, k), (4, 235, 4), (8, 235, 4), (12, 235, 4), (16, 235, 2)):
        lines.append(f"| {S2} | {I2} | {k2} | {half_width(c, S2, I2, k2):.3f} | "
                     f"{half_width(c, S2, I2, k2, c['tau2_low']):.3f} / {half_width(c, S2, I2, k2, c['tau2_high']):.3f} "
                     f"| {minutes(S2, I2, k2, P)['total']:.0f} |")
    ch = d["cheapest_target"]
    lines += [
        "", "### Cost and the choice", "",
        f"Pool: D_adv >= {v('min_adv')} at the lowest share seen ({v('adv_share_low')}) needs a pool of {P} items; GRPO "
        f"steps per run counted at the highest share ({v('adv_share_high')}): {m['steps']} (one pass, 1 prompt x 4 "
        f"completions a step). Held-out items at most {d['I_max']} ({d['N']} BFCL items less the pool less a warm-up "
        f"of >= {v('min_warmup')}).", "",
        f"Searched: seeds 1-40, held-out items 50-{d['I_max']} (steps of 5), eval_k 1/2/4/8, within {budget:.0f} min of "
        "wall time.", "",
        (f"**The target half-width {target} fits {budget:.0f} min.**" if fits_target else
         f"**The target half-width {target} does not fit {budget:.0f} minutes of this CPU**: the seed term alone needs "
         f"{math.ceil(c['tau2'] / (target / Z) ** 2)} seeds (tau2 / S <= ({target}/1.96)^2), and a seed costs two GRPO "
         f"runs of ~{m['steps']} steps (~{2 * m['steps'] * v('g') / 60:.0f} CPU min). "
         + (f"The cheapest design that reaches it: {ch[2]} seeds x {ch[3]} items x eval_k {ch[4]}, half-width "
            f"{ch[1]:.3f}, about {ch[0] / 60:.1f} h on this CPU." if ch else "No design in the grid reaches it.")
         + " So this design is the one with the smallest half-width that fits:"),
        "",
        "| | chosen |", "|---|---|",
        f"| seeds | **{S}** ({', '.join(str(s) for s in range(S))}) |",
        f"| held-out items (primary set: every held-out profiled item) | **{counts['held_out']}** "
        f"(`training.eval_fraction: {e}`) |",
        f"| eval_k (samples per item and draw) | **{k}** |",
        f"| pool (profiled, trained on) | **{counts['pool']}** items (`training.warmup_fraction: {w}`; the warm-up: "
        f"{counts['warmup']} items), D_adv expected {math.floor(v('adv_share_low') * counts['pool'])}-"
        f"{math.ceil(v('adv_share_high') * counts['pool'])} |",
        f"| GRPO steps per run | one pass over D_adv's pool: = D_adv's pool size, both arms (`ablation.epochs: 1`); "
        f"~{m['steps']} counted; whether the training reward visibly rises in one pass is for the learning-rate "
        "sweep to show: if it does not, raise `ablation.epochs` and re-run this design (each pass adds "
        f"~{2 * m['steps'] * v('g') / 60 / v('par'):.0f} min a seed) |",
        f"| expected half-width | **{hw:.3f}** (tau2 low / high: {half_width(c, S, I, k, c['tau2_low']):.3f} / "
        f"{half_width(c, S, I, k, c['tau2_high']):.3f}) |",
        f"| estimated wall time | **{total:.0f} min ({total / 60:.1f} h)**: warm-up, ingest and profiling "
        f"{m['fixed']:.0f}, GRPO {m['train']:.0f}, evaluation {m['eval']:.0f} |",
        "",
        f"The split counts are exact for the BFCL item ids (`core/split.py` on simple_python + live_simple; check: "
        f"0.45 / 0.483 gives {check['held_out']} / {check['warmup']} / {check['pool']}, the full run's 303 / 315 / 38); "
        "2 quarantined items make the real counts one or two lower.", "",
        "Learning rate: **chosen by a sweep before phase (b)** (`decisive.learning_rate: sweep` in "
        "`configs/decisive_bfcl.yaml`): GRPO on D_adv at 1e-5, 3e-5, 1e-4 and 3e-4 for 0.4 of a pass, each scored on 80 "
        "profiled pool turns outside D_adv (never the held-out items); the rule, fixed in the config before the sweep "
        "ran: the highest slice accuracy, and among rates within 0.02 of it the smallest. Both arms use the choice; "
        "the sweep's own section below gives its numbers.", "",
        "Evaluation: **sampled** (temperature 1.0, top_p 1.0, per-sample seeds shared by every model on a draw), "
        "as profiling samples: the question is whether the policy's *sampled* success rate on held-out turns moves "
        "(greedy decoding of a 135M model gives one answer per item, so eval_k > 1 would add nothing and a small "
        "shift of probability mass would not show until it flips the argmax). Samples stop at the end of the "
        "assistant turn (`<|im_end|>`, EOS: `policies/models.stop_token_ids`, both backends) or at 80 new tokens; "
        "on the warmed policy 9-12% of samples reach the cap (bench/RESULTS_ablation_bfcl_sizing.md), the base "
        "model's 78-89% (it is not evaluated here). A stop at `</tool_call>` is not added: the tool_call verifier "
        "reads several `<tool_call>` blocks as a batch of calls, so a sample that calls a second time is wrong today "
        "and would be cut to right by such a stop: it changes the measure, and most samples already end a few tokens "
        "after the tag. Half the cost of a turn is the prompt's prefill anyway (1.1 of 1.99 s).", "",
        "Backend: `policy.backend: transformers`, two evaluation units at a time (on this EPYC vLLM, one engine at a "
        "time, measured 1.35 s a turn at k=4, RESULTS_ablation_bfcl.md; transformers at two workers ~1.3).", ""]
    return "\n".join(lines)


# -- the paper's table (--table): the two ablation pairs and the OOD probe, from the first run's unit files ---------
FIRST_RUN = ROOT / "bench" / "data" / "decisive_bfcl"
CHI2_025_DF2 = -2 * math.log(0.975)  # the 2.5% quantile of chi-square with 2 df (exponential, mean 2): 0.0506
TABLE_COSTS = {  # CPU minutes on this 2-core AMD EPYC, each with its source
    "phase_a": (47 * 2.3, "the first run's phase (a), ~47 min (issue estimate on this CPU), x 2.3: a float32 "
                          "training step of the 135M model under MKL_CBWR=COMPATIBLE (12.9 against 5.6 CPU s, "
                          "measured here; ATen AVX2 and deterministic algorithms cost nothing measurable)"),
    "grpo": (46, "a GRPO run of 152 steps on this CPU (issue estimate from the first run's units)"),
    "eval": (12, "an evaluation unit, 198 items x eval_k 4 (the first run's units: 708-1525 s, 715 uncontended)"),
    "ood": (3, "the OOD probe, 424 items, greedy, 20 new tokens (estimate: 7 batches of 64)"),
    "sft": (10, "same-data SFT, 2 passes over 76 turns = 38 steps of 4 per-turn examples (estimate)"),
    "sweep_eval": (6, "a sweep-slice evaluation, 80 items x 4 (the first run's sweep units: 192-460 s)"),
}


def first_run_components(data: Path = FIRST_RUN) -> dict:
    """Variance components of the paired held-out difference, measured on the first run's grpo_adv - grpo_cand units
    (3 seeds x 198 items x eval_k 4): sw2 (within-item sample variance), w (per-seed item variance of the paired
    difference), sd2 (its part common to the seeds), the per-seed means and their SD, tau2 (seed variance, the seed
    means' variance less their item noise) and tau2's 95% upper bound from the seed means' chi-square (2 df)."""
    import statistics

    import polars as pl

    ev = pl.concat([pl.read_parquet(f) for f in sorted(data.glob("eval_*.parquet"))], how="diagonal_relaxed")
    per = ev.group_by("model", "draw", "turn_id").agg(pl.col("reward").mean().alias("m"),
                                                      pl.col("reward").var().alias("v"))
    sw2 = float(per["v"].mean())
    k = int(ev.group_by("model", "draw", "turn_id").len()["len"].max())
    m = {(a, d): dict(zip(g["turn_id"], g["m"])) for (a, d), g in per.group_by("model", "draw")}
    seeds = sorted({d for _, d in m})
    items = sorted(set.intersection(*(set(x) for x in m.values())))
    diffs = {s: [m[("grpo_adv", s)][t] - m[("grpo_cand", s)][t] for t in items] for s in seeds}
    seed_means = [statistics.fmean(diffs[s]) for s in seeds]
    w = statistics.fmean(statistics.variance(diffs[s]) for s in seeds)
    averaged = statistics.variance([statistics.fmean(diffs[s][i] for s in seeds) for i in range(len(items))])
    S, I = len(seeds), len(items)
    sd2 = max(0.0, (S * averaged - w) / (S - 1))
    s_seed = statistics.stdev(seed_means)
    tau2 = max(0.0, s_seed ** 2 - w / I)
    return {"sw2": sw2, "k": k, "w": w, "sd2": sd2, "S": S, "I": I, "seed_means": seed_means, "s_seed": s_seed,
            "tau2": tau2, "tau2_high": s_seed ** 2 * (S - 1) / CHI2_025_DF2,
            "reference": statistics.fmean(x for s in seeds for x in m[("reference", s)].values())}


def pair_half_width(c: dict, S: int, tau2: float) -> float:
    """1.96 sqrt(V) of a paired difference pooled over S seeds on c's items: the item term (its common part sd2 and
    its per-seed rest (w - sd2) / S) over I, plus the seed term tau2 / S."""
    return Z * math.sqrt((c["sd2"] + (c["w"] - c["sd2"]) / S) / c["I"] + tau2 / S)


def seeds_to_decide(c: dict, delta: float, tau2: float, most: int = 60) -> int | None:
    """The fewest seeds whose expected half-width is below |delta| (None: not within `most`)."""
    return next((S for S in range(1, most + 1) if pair_half_width(c, S, tau2) < abs(delta)), None)


def render_table_design(c: dict, n_ood: int) -> str:
    cost = {k: v_[0] for k, v_ in TABLE_COSTS.items()}
    seed_cpu = 2 * cost["grpo"] + cost["sft"] + 3 * cost["eval"] + 4 * cost["ood"]
    sweep_cpu = 3 * (cost["sft"] + cost["sweep_eval"]) + cost["sweep_eval"]
    total = cost["phase_a"] + sweep_cpu + 3 * seed_cpu
    hw3, hw3_high = pair_half_width(c, 3, c["tau2"]), pair_half_width(c, 3, c["tau2_high"])
    ood_ref = Z * math.sqrt(0.25 / n_ood)
    lines = [
        "# The paper's table on the decisive run: same-data SFT and the exact-match reward beside D_adv and D_cand, "
        "in and out of domain", "",
        "## Design, written before the run", "",
        "Written by `.venv/bin/python bench/decisive_design.py --table` before any held-out unit of this run existed; "
        "the runner (`bench/decisive.py --config configs/decisive_bfcl_table.yaml --report`) appends the results "
        "below this section and leaves it as it is. Its variance figures come from the first run's unit files "
        "(`bench/data/decisive_bfcl/`: grpo_adv and grpo_cand, 3 seeds).", "",
        "### What is compared", "",
        "- **Held-out (primary set: every held-out profiled item, 198):** `grpo_adv - grpo_adv_exact` (the paper's "
        "exact-match reward row) and `grpo_adv - sft_same_data` (its same-data SFT row), each pooled over seeds 0-2 "
        "(seed s of each arm on evaluation draw s), 95% intervals from the project's hierarchical bootstrap (seeds, "
        "conversations, items). `grpo_adv - grpo_cand` stays the first run's (another phase (a) block: arms of two "
        "blocks are never paired).",
        f"- **Out of domain (the OOD probe, all {n_ood} items, greedy):** the reference, grpo_adv, sft_same_data and "
        "grpo_adv_exact, each with its interval and its delta vs the reference; `grpo_adv - sft_same_data` on the "
        "probe is the paper's retention claim (PivotRL +0.21 vs SFT -9.83 points).",
        "- Same engine, precision (float32), steps and evaluation draws as the first run: GRPO 152 steps (2 passes "
        "over D_adv's 76 pool turns, 1 prompt x 4 completions), learning rate 1e-5 for both GRPO arms, evaluation "
        "sampled at temperature 1.0, eval_k 4, draws 0-2.", "",
        "### sft_same_data: budget and learning rate", "",
        "- **Data:** exactly grpo_adv's turns: the pool's D_adv turns of the same block (the same 76 turn ids; each "
        "train unit records the ids it trained on, `turn_ids_trained`, so the two arms' sets are compared by id), one "
        "per-turn example each (the turn's state cut from the left, the expert action as the target).",
        "- **Budget:** the same number of passes as GRPO, 2 over those turns (`ablation.epochs: 2`): 38 optimizer "
        "steps of 4 examples. This is the paper's same data: the same prompts, seen as often, with the expert's "
        "action as the target in place of sampled completions and a reward.",
        "- **Learning rate:** chosen before phase (b) on the sweep slice (80 profiled pool turns outside D_adv, "
        "evaluation draw 100, 4 samples each; never a held-out item) among 1e-5, 3e-5 and 1e-4 (the warm-up's own), "
        "each trained at the run's budget; the rule of the first run's sweep: the highest slice accuracy, and among "
        "rates within 0.02 of it the smallest. Cost: 3 SFT runs and 4 slice evaluations (the reference's included), "
        f"about {sweep_cpu:.0f} CPU min.", "",
        "### Variance measured by the first run (3 seeds x 198 items x eval_k 4)", "",
        f"- within-item sample variance sw2 = {c['sw2']:.4f}; reference accuracy {c['reference']:.3f}",
        f"- the paired adv - cand difference per item: variance within a seed w = {c['w']:.4f}, of which common to "
        f"the seeds sd2 = {c['sd2']:.4f}",
        "- per-seed adv - cand means: " + ", ".join(f"{x:+.4f}" for x in c["seed_means"])
        + f" (SD {c['s_seed']:.4f}); seed variance tau2 = SD^2 - w/I = {c['tau2']:.2e}",
        f"- **the seed term, bounded:** 3 seeds give the seed SD 2 degrees of freedom; its 95% upper bound is SD x "
        f"sqrt(2 / chi2(0.025; 2)) = SD x {math.sqrt(2 / CHI2_025_DF2):.2f} = {math.sqrt(c['tau2_high']):.4f} "
        f"(tau2 <= {c['tau2_high']:.2e}); the design quotes both ends.", "",
        "### Expected half-widths (normal approximation)", "",
        "V(S) = (sd2 + (w - sd2)/S) / I + tau2 / S; half-width = 1.96 sqrt(V). The new pairs share the first pair's "
        "items, draws and evaluation; their seed and item terms are taken as adv - cand's (SFT may move the policy "
        "differently from GRPO: the run measures its own).", "",
        "| pair | seeds | half-width (tau2 measured) | half-width (tau2 at its 95% bound) |", "|---|---|---|---|"]
    for S in (3, 6, 10):
        lines.append(f"| grpo_adv - grpo_adv_exact, grpo_adv - sft_same_data (held-out) | {S} | "
                     f"{pair_half_width(c, S, c['tau2']):.3f} | {pair_half_width(c, S, c['tau2_high']):.3f} |")
    lines += [
        "", f"Out of domain (greedy: no sampling term; {n_ood} items): one model's accuracy interval is at most "
        f"1.96 sqrt(0.25 / {n_ood}) = {ood_ref:.3f}; a paired difference's item term is (share of items on which the "
        f"two models disagree) / {n_ood}: half-width {Z * math.sqrt(0.1 / n_ood / 3):.3f} at 10% disagreement and "
        f"{Z * math.sqrt(0.3 / n_ood / 3):.3f} at 30%, pooled over 3 seeds, plus the seed term the run measures.", "",
        f"A pair is decided when its interval excludes 0: at 3 seeds, by a difference beyond ~{hw3:.3f} (beyond "
        f"~{hw3_high:.3f} if the seed SD is at its bound). Where a pair is not decided, the report gives the seeds the "
        "measured variance asks for (`seeds_to_decide`: the fewest S whose expected half-width is below the measured "
        "difference).", "",
        "### Blocks and machines", "",
        "A seed's units share one phase (a) block (the reference's weights, the pivot sets, the split). Phase (a) runs "
        "pinned (`bench/decisive.py` PINNED_ENV: one thread, `MKL_CBWR=COMPATIBLE`, `ATEN_CPU_CAPABILITY=avx2`, "
        "`ONEDNN_MAX_CPU_ISA=AVX2`, torch's deterministic algorithms, float32), which repeats its block bit for bit "
        "on one machine (tests/training/test_decisive_pinned.py); `prepare.json` records each run's block, CPU and "
        "settings, so a run of the same config on the other CPU kind shows whether the block is the same there. "
        "This run's block is not the first run's (that phase (a) ran unpinned on a Xeon): grpo_adv runs again here, "
        "and its held-out units equal the first run's only if the blocks are equal.", "",
        "### Cost (CPU minutes on this 2-core AMD EPYC)", "", "| piece | CPU min | source |", "|---|---|---|"]
    lines += [f"| {k} | {v_[0]:.0f} | {v_[1]} |" for k, v_ in TABLE_COSTS.items()]
    lines += ["", f"A seed: 2 GRPO runs, 1 SFT run, 3 held-out evaluations, 4 OOD evaluations (the reference's "
              f"included) = {seed_cpu:.0f} CPU min. Total: phase (a) {cost['phase_a']:.0f} + the SFT sweep "
              f"{sweep_cpu:.0f} + 3 seeds x {seed_cpu:.0f} = **{total:.0f} CPU min ({total / 60:.1f} CPU h)**, two "
              "units at a time at nice 19 beside other work.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-min", type=float, default=180.0)
    ap.add_argument("--target", type=float, default=0.03)
    ap.add_argument("--write", default=None, help="write the design head to this results file")
    ap.add_argument("--table", action="store_true", help="the paper's table run (configs/decisive_bfcl_table.yaml)")
    args = ap.parse_args()
    if args.table:
        from pivot_assets.evaluation.ood_probe import ood_probe_items

        text = render_table_design(first_run_components(), len(ood_probe_items()))
        print(text)
        if args.write:
            Path(args.write).write_text(text)
        return
    d = design(args.budget_min, args.target)
    text = render(d, args.budget_min, args.target)
    print(text)
    if args.write:
        Path(args.write).write_text(text)


if __name__ == "__main__":
    main()
