"""Refresh rounds against one selection at equal GRPO steps, into bench/RESULTS_refresh_bfcl.md.

    .venv/bin/python bench/bench_refresh.py [--config configs/refresh_bfcl.yaml] [--seeds 0,1]
                                            [--out bench/RESULTS_refresh_bfcl.md] [--keep DIR]

1. `pivot run --select '*pivots_adv'` in the work dir's warehouse: ingest, the SFT warm-up (the reference),
   round 0's profiles on the configured engine and the pivot sets. Shared by every seed and both sides.
2. Per trainer seed s (GRPO's sampling and data order; the split, the reference and round 0 are shared):
   - one selection: GRPO from the reference on round 0's D_adv pool turns, training.steps + (rounds - 1) x
     refresh.steps_per_round steps;
   - refresh: training.steps on the same turns, then per round r >= 1 the round's own code (refresh/rounds.py
     `reselect`: the pool profiled again with the last checkpoint, settled turns skipped and mastered ones
     replayed as `refresh:` says, D_adv reselected) and refresh.steps_per_round more steps from that checkpoint.
   GRPO runs are TRL's GRPOTrainer through training/grpo.run_grpo, runtime.workers at a time.
3. The reference and every final model sample the held-out profiled turns (evaluation.k each, on the
   configured engine): seed s's models on evaluation draw s, the reference on every draw.
4. Paired differences (refresh - one selection, each - the reference) with the hierarchical bootstrap over
   seeds, conversations and turns (training/evaluation.hierarchical_resamples, the ablation's).
5. The rollout budget of each side: samples and generated tokens of round 0's profiling (shared), of each later
   round's profiling and of GRPO generation.
With --keep DIR a killed run resumes: finished models, profiles and evaluations are read back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_ablation import work_config  # noqa: E402
from bench.bench_demo import timed_pivot_run  # noqa: E402

DONE = "bench_run.json"  # beside a model: what its training spent (a rerun reads it back)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def one_selection_steps(cfg) -> int:
    return cfg.training.steps + (cfg.refresh.rounds - 1) * cfg.refresh.steps_per_round


def train_job(root: str, cfg, init: str, rows, out: str, steps: int, seed: int) -> dict:
    """GRPO `steps` steps from `init` on the pivot rows `rows` (a polars frame) into `out`; its spend. In a worker
    process (core/parallel.run_jobs) or in this one; read back when `out` holds a finished run."""
    from pivot_assets.core.hardware import configure_torch, resolve_dtype
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.curation.exports import to_hf_dataset
    from pivot_assets.policies.models import PromptFormat
    from pivot_assets.refresh.rounds import grpo_spend
    from pivot_assets.training.grpo import run_grpo
    from pivot_assets.core.hardware import training_device
    from pivot_assets.core.split import ConversationSplit
    from pivot_assets.verifiers import VerifierSets

    done = Path(out) / DONE
    if done.is_file():
        return json.loads(done.read_text())
    configure_torch(cfg.runtime.threads)
    wh = Warehouse(root)
    device = training_device()
    options = cfg.training.model_copy(update={"steps": steps, "seed": seed})
    t0 = time.perf_counter()
    run = run_grpo(init, to_hf_dataset(rows, wh.read("trajectories")), VerifierSets.from_config(cfg).reward, options,
                   out, cpu_smoke=False, precision=resolve_dtype(cfg.training.dtype, device),
                   threads=cfg.runtime.threads, held_out=ConversationSplit.from_config(cfg).not_in_pool(wh), device=device,
                   fmt=PromptFormat.from_policy(cfg.policy))
    spend = {**grpo_spend(run.steps, run.completions_log, run.grpo_config["num_generations"]),
             "turns": rows.height, "turns_trained": len(run.turns_trained), "train_s": round(time.perf_counter() - t0, 1),
             "reward_mean": [s.get("reward_mean") for s in run.steps]}
    done.write_text(json.dumps(spend))
    return spend


def evaluate(wh, cfg, verifiers, model: str, draw: int, turns: list[str], cache: Path) -> dict[str, float]:
    """{turn_id: mean reward over eval_k samples} of `model` on evaluation draw `draw` (cached in `cache`)."""
    from pivot_assets.evaluation.heldout import evaluation_engine, local_accuracy, turn_rows
    from pivot_assets.evaluation.heldout import eval_seed

    if cache.is_file():
        return json.loads(cache.read_text())
    engine = evaluation_engine(cfg)
    t0 = time.perf_counter()
    out = local_accuracy(model, turn_rows(wh, turns), verifiers, k=cfg.evaluation.k,
                         max_new_tokens=cfg.training.max_completion_length, seed=eval_seed(cfg, draw),
                         temperature=engine.temperature, top_p=engine.top_p, policy=engine)
    scores = {t["turn_id"]: t["reward_mean"] for t in out["per_turn"]}
    log(f"evaluated {Path(model).name} draw {draw}: {out['local_accuracy']:.3f} in {time.perf_counter() - t0:.0f} s")
    cache.write_text(json.dumps(scores))
    return scores


def interval(name: str, values: list[list[float]], groups: list[str], resamples: int) -> tuple:
    """(mean, 2.5th, 97.5th percentile) of a (seeds x turns) matrix under the hierarchical bootstrap."""
    from pivot_assets.evaluation.heldout import hierarchical_resamples, resampled_mean

    return resampled_mean(values, hierarchical_resamples(groups, len(values), resamples, name))


def paired(name: str, a: dict[int, dict], b: dict[int, dict], turns: list[str], groups: list[str],
           resamples: int) -> dict:
    """a - b per seed and turn, with its hierarchical-bootstrap 95% interval."""
    mean, low, high = interval(name, [[a[s][t] - b[s][t] for t in turns] for s in sorted(a)], groups, resamples)
    return {"pair": name, "n_seeds": len(a), "n": len(turns), "delta": mean, "low": low, "high": high,
            "excludes_zero": low > 0 or high < 0}


def accuracy(name: str, scores: dict[int, dict], turns: list[str], groups: list[str], resamples: int) -> dict:
    mean, low, high = interval(name, [[scores[s][t] for t in turns] for s in sorted(scores)], groups, resamples)
    return {"policy": name, "accuracy": mean, "low": low, "high": high}


def main() -> None:
    import polars as pl

    from pivot_assets.core.config import load_config
    from pivot_assets.core.hardware import describe_cpu, native_bf16
    from pivot_assets.core.parallel import resolve_workers, run_jobs
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.refresh.rounds import profiling_spend, reselect, round_zero_rows
    from pivot_assets.evaluation.ablation import arm_pool, pool_trajectories
    from pivot_assets.evaluation.heldout import evaluation_engine, evaluation_sets, turn_conversations
    from pivot_assets.training.runs import init_model
    from pivot_assets.verifiers import VerifierSets

    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "configs" / "refresh_bfcl.yaml"))
    ap.add_argument("--seeds", default="0,1", help="GRPO trainer seeds (>= 2 for an interval over seeds)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_refresh_bfcl.md"))
    ap.add_argument("--keep", default=None, help="work dir to keep and resume from; default: a temp dir")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="refresh-"))
    (work / "eval").mkdir(parents=True, exist_ok=True)
    (work / "models").mkdir(parents=True, exist_ok=True)
    config = work / "pivot.yaml"
    config.write_text(work_config(Path(args.config), work / "warehouse"))
    env = {**os.environ, "DAGSTER_HOME": str(work / "dagster_home"), "HF_HUB_OFFLINE": "1"}
    os.environ["HF_HUB_OFFLINE"] = "1"
    load_start, t_start = os.getloadavg(), time.perf_counter()

    log("round 0: ingest, SFT warm-up, profiles, pivot sets (pivot run)")
    upstream = timed_pivot_run(config, "*pivots_adv", env, work / "run.log")
    cfg = load_config(str(config))
    wh = Warehouse(cfg.warehouse)
    sets = VerifierSets.from_config(cfg)
    reference = init_model(wh, cfg)
    held_turns = evaluation_sets(wh, cfg)["profiled"]
    profiles = wh.read("turn_profiles")
    zero = round_zero_rows(wh, cfg, profiles)
    pool = pool_trajectories(wh, cfg)
    d_adv = arm_pool(wh, cfg, "grpo_adv", seeds[0], pool)  # D_adv does not depend on the seed
    pool_zero = zero.filter(pl.col("trajectory_id").is_in(sorted(pool)))
    zero_spend = profiling_spend(wh, profiles["policy_fp"][0], profiles["sampling_fp"][0], profiles)
    log(f"round 0: {profiles.height} turns profiled ({pool_zero.height} in the pool, {len(held_turns)} held out); "
        f"D_adv in the pool: {d_adv.height}")

    workers = resolve_workers(cfg.runtime.workers, cfg.runtime.threads, 2)
    total_steps = one_selection_steps(cfg)
    model = lambda name, s: str(work / "models" / f"{name}_s{s}")  # noqa: E731
    t0 = time.perf_counter()
    jobs = [(str(wh.root), cfg, reference, d_adv, model("one", s), total_steps, s) for s in seeds]
    jobs += [(str(wh.root), cfg, reference, d_adv, model("refresh_r0", s), cfg.training.steps, s) for s in seeds]
    log(f"GRPO: one selection ({total_steps} steps) and refresh round 0 ({cfg.training.steps} steps), seeds {seeds}")
    spent = run_jobs(train_job, jobs, workers)
    runs = {(j[4]): r for j, r in zip(jobs, spent)}
    rounds: dict[int, list[dict]] = {s: [] for s in seeds}
    previous = {s: pool_zero for s in seeds}
    for r in range(1, cfg.refresh.rounds):
        selected = {}
        for s in seeds:  # one engine at a time
            step = reselect(wh, cfg, sets.profiling, previous[s], Path(model(f"refresh_r{r - 1}", s)), r, log)
            pool_train = step.train.filter(pl.col("turn_id").is_in(sorted(step.pool)))
            before = set(d_adv["turn_id"]) if r == 1 else set(previous[s].filter(pl.col("trained"))["turn_id"])
            now = set(pool_train["turn_id"])
            profiled = profiling_spend(wh, step.profiler.policy_fp, step.profiler.sampling_fp, step.profiled)
            buckets = dict(step.current.group_by(pl.col("reward_var") > 0).len().iter_rows())
            rounds[s].append({"round": r, "profiled": step.profiled.height, "skipped": len(step.skip),
                              "replayed": len(step.replay), "train": len(now), "kept": len(now & before),
                              "new": len(now - before), "dropped": len(before - now), "varied": buckets.get(True, 0),
                              "profiling": profiled})
            previous[s] = step.current.with_columns(pl.col("turn_id").is_in(sorted(now)).alias("trained"))
            selected[s] = pool_train
            log(f"round {r} seed {s}: {rounds[s][-1]}")
        jobs = [(str(wh.root), cfg, model(f"refresh_r{r - 1}", s), selected[s], model(f"refresh_r{r}", s),
                 cfg.refresh.steps_per_round, s) for s in seeds if selected[s].height]
        for j, result in zip(jobs, run_jobs(train_job, jobs, workers)):
            runs[j[4]] = result
    train_wall = time.perf_counter() - t0

    t0 = time.perf_counter()
    scores: dict[str, dict[int, dict]] = {"reference": {}, "one": {}, "refresh": {}}
    for s in seeds:
        scores["reference"][s] = evaluate(wh, cfg, sets.profiling, reference, s, held_turns,
                                          work / "eval" / f"reference_d{s}.json")
        scores["one"][s] = evaluate(wh, cfg, sets.profiling, model("one", s), s, held_turns,
                                    work / "eval" / f"one_s{s}.json")
        # the last round that trained (a round with an empty training set keeps the one before)
        final = next(model(f"refresh_r{r}", s) for r in reversed(range(cfg.refresh.rounds))
                     if model(f"refresh_r{r}", s) in runs)
        scores["refresh"][s] = evaluate(wh, cfg, sets.profiling, final, s, held_turns,
                                        work / "eval" / f"refresh_s{s}.json")
    eval_wall = time.perf_counter() - t0
    conv = turn_conversations(wh, held_turns)
    groups = [conv[t] for t in held_turns]
    n = cfg.evaluation.bootstrap
    table = [accuracy(p, scores[p], held_turns, groups, n) for p in ("reference", "one", "refresh")]
    pairs = [paired("refresh - one selection", scores["refresh"], scores["one"], held_turns, groups, n),
             paired("refresh - reference", scores["refresh"], scores["reference"], held_turns, groups, n),
             paired("one selection - reference", scores["one"], scores["reference"], held_turns, groups, n)]
    per_seed = {s: {p: sum(scores[p][s].values()) / len(held_turns) for p in scores} for s in seeds}

    def side_budget(side: str, s: int) -> dict:
        grpo = ([runs[model("one", s)]] if side == "one" else
                [runs[model(f"refresh_r{r}", s)] for r in range(cfg.refresh.rounds) if model(f"refresh_r{r}", s) in runs])
        later = [x["profiling"] for x in rounds[s]] if side == "refresh" else []
        return {"profiling_samples": zero_spend["samples"] + sum(x["samples"] for x in later),
                "profiling_tokens": zero_spend["generated_tokens"] + sum(x["generated_tokens"] for x in later),
                "later_rounds_samples": sum(x["samples"] for x in later),
                "grpo_steps": sum(g["grpo_steps"] for g in grpo), "grpo_samples": sum(g["samples"] for g in grpo),
                "grpo_tokens": sum(g["generated_tokens"] for g in grpo)}

    budgets = {(side, s): side_budget(side, s) for side in ("one", "refresh") for s in seeds}
    write_report(args, cfg, work, seeds, upstream, load_start, t_start, train_wall, eval_wall, profiles, pool_zero,
                 held_turns, d_adv, zero_spend, rounds, runs, model, table, pairs, per_seed, budgets,
                 evaluation_engine(cfg).backend, describe_cpu(), native_bf16("cpu"))


def write_report(args, cfg, work, seeds, upstream, load_start, t_start, train_wall, eval_wall, profiles, pool_zero,
                 held_turns, d_adv, zero_spend, rounds, runs, model, table, pairs, per_seed, budgets, engine, cpu,
                 bf16) -> None:
    load_end = os.getloadavg()
    rel = Path(args.config).resolve()
    config = rel.relative_to(ROOT) if rel.is_relative_to(ROOT) else rel
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        "# Refresh rounds against one selection on BFCL single-turn (bench/bench_refresh.py)", "",
        f"Machine: {cpu}; native bf16: {bf16[0]} ({bf16[1]}). Date: {time.strftime('%Y-%m-%d')}. Command: "
        f"`.venv/bin/python bench/bench_refresh.py --config {config} --seeds {args.seeds}`.",
        f"Load average at start {load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f}, at end "
        f"{load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f}. Wall time: {(time.perf_counter() - t_start) / 60:.1f} "
        f"min in all (round 0's `pivot run` {upstream['total_s'] / 60:.1f} min, GRPO and later rounds' profiling "
        f"{train_wall / 60:.1f} min, evaluation {eval_wall / 60:.1f} min). Sampling engine (profiling, evaluation): "
        f"{engine}; GRPO: TRL's GRPOTrainer on the CPU, {cfg.runtime.workers} runs at a time.", "",
        f"Config `{config}`: the reference is the SFT warm-up ({cfg.sft.steps} steps x {cfg.sft.batch_size}); K = "
        f"{cfg.policy.k}, lambda_diff {cfg.pivots.lambda_diff}, verifier tool_call (BFCL strings); "
        f"{profiles.height} turns profiled in round 0: {pool_zero.height} in the training pool, {len(held_turns)} "
        f"held out (evaluated, eval_k {cfg.evaluation.k}). Round 0's D_adv in the pool: {d_adv.height} turns.",
        f"Both sides train {one_selection_steps(cfg)} GRPO steps ({cfg.training.num_generations} completions of "
        f"<= {cfg.training.max_completion_length} tokens a step, learning rate {cfg.training.learning_rate}) from the "
        f"reference: one selection on round 0's D_adv throughout; refresh {cfg.refresh.rounds} rounds "
        f"({cfg.training.steps} steps, then {cfg.refresh.steps_per_round} a round on the pool profiled again with the "
        f"last checkpoint: skip_settled_prob {cfg.refresh.skip_settled_prob}, replay_fraction "
        f"{cfg.refresh.replay_fraction}). Trainer seeds {seeds}: seed s's models are evaluated on draw s, the "
        "reference on every draw.", "",
        "## Held-out accuracy", "",
        "Mean reward of the held-out turns (eval_k samples each), pooled over seeds; 95% intervals from the "
        "hierarchical bootstrap (seeds, conversations, turns).", "",
        "| policy | accuracy | ci95 | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|---|---|" + "---|" * len(seeds)]
    for row in table:
        name = {"one": "one selection", "refresh": f"refresh ({cfg.refresh.rounds} rounds)"}.get(row["policy"], row["policy"])
        lines.append(f"| {name} | {f(row['accuracy'])} | [{f(row['low'])}, {f(row['high'])}] | "
                     + " | ".join(f(per_seed[s][row["policy"]]) for s in seeds) + " |")
    lines += ["", "## Paired differences", "", "| pair | seeds | turns | delta | ci95 | excludes 0 |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {p['pair']} | {p['n_seeds']} | {p['n']} | {p['delta']:+.3f} | [{p['low']:+.3f}, {p['high']:+.3f}] | "
              f"{p['excludes_zero']} |" for p in pairs]
    lines += ["", "## What the later rounds changed", "",
              "Per seed and round: turns profiled again (the rest carried forward as settled), replayed, the pool's "
              "training set after reselection and its overlap with the set before, turns with reward variance.", "",
              "| seed | round | profiled | skipped | replayed | training set | kept | new | dropped | varied | "
              "profiling samples |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in seeds:
        for x in rounds[s]:
            lines.append(f"| {s} | {x['round']} | {x['profiled']} | {x['skipped']} | {x['replayed']} | {x['train']} | "
                         f"{x['kept']} | {x['new']} | {x['dropped']} | {x['varied']} | {x['profiling']['samples']} |")
    lines += ["", "## Rollout budget per side", "",
              f"Round 0's profiling ({zero_spend['samples']} samples, {zero_spend['generated_tokens']} generated "
              "tokens; the pool and the held-out turns) is counted on both sides; evaluation (the same for both) is "
              "not.", "",
              "| side | seed | profiling samples | of it, later rounds | profiling tokens | GRPO steps | GRPO samples | "
              "GRPO tokens | total samples | total tokens | train s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (side, s), b in budgets.items():
        train_s = (runs[model("one", s)]["train_s"] if side == "one" else
                   sum(runs[model(f"refresh_r{r}", s)]["train_s"] for r in range(cfg.refresh.rounds)
                       if model(f"refresh_r{r}", s) in runs))
        lines.append(f"| {'one selection' if side == 'one' else 'refresh'} | {s} | {b['profiling_samples']} | "
                     f"{b['later_rounds_samples']} | {b['profiling_tokens']} | {b['grpo_steps']} | {b['grpo_samples']} | "
                     f"{b['grpo_tokens']} | {b['profiling_samples'] + b['grpo_samples']} | "
                     f"{b['profiling_tokens'] + b['grpo_tokens']} | {train_s:.0f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    (work / "report.json").write_text(json.dumps({"table": table, "pairs": pairs, "rounds": rounds,
                                                  "budgets": {f"{k[0]}_s{k[1]}": v for k, v in budgets.items()}},
                                                 default=str))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
