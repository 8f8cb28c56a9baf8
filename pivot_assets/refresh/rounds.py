"""Refresh rounds (Dagster-free): profile the pool again with the policy being trained, reselect, train on.

Round 0 is the pipeline's own chain: the reference policy's turn_profiles, the pivot sets selected from them and
grpo_run's model. Round r >= 1:

1. profiles the pool (the turns round 0 profiled) with round r-1's checkpoint through the profiling stage's
   Profiler (`policy.model` = that checkpoint, so its weights fingerprint is the rollouts' policy_fp and each
   round's samples are cached under their own key; adaptive stopping applies as configured). A turn whose last
   profile had zero variance is left out with probability refresh.skip_settled_prob, drawn per turn and round
   from refresh.seed; it carries that profile forward (skipped, profiled_by = the policy that profiled it);
2. reselects D_mixed / D_adv / D_cand (curation/selection.py) from those profiles; a seeded
   refresh.replay_fraction of the turns mastered in the last round (every sample passed) joins the training set;
3. trains refresh.steps_per_round GRPO steps from round r-1's checkpoint (training/grpo.run_grpo) into
   models/refresh_round_<r>, keyed by everything it depends on: a rerun with the same key trains nothing;
4. evaluates the checkpoint on the held-out profiled turns (evaluation.k draws under pivot_eval's seed).

Every round writes its rows of refresh_profiles and refresh_budget as one part named by the round, which a rerun
replaces: a rerun or a kill -9 duplicates nothing (rollouts and rewards are the profiler's keyed parts).
Buckets, one per (round, turn): adv (variance > 0, mean <= lambda_diff), mixed (variance > 0, mean above),
easy (zero variance, mean above lambda_diff: every sample passed under binary rewards), unsolved (the rest).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import polars as pl
import pyarrow as pa

from pivot_assets.core.catalog import (REFRESH_BUDGET, REFRESH_BUDGET_SCHEMA, REFRESH_PROFILES,
                                       REFRESH_PROFILES_SCHEMA, SET_TABLES)
from pivot_assets.core.identity import REFRESH, fingerprint, values
from pivot_assets.core.ids import seeded_digest, seeded_unit
from pivot_assets.core.warehouse import Warehouse

if TYPE_CHECKING:
    from pivot_assets.core.config import PivotConfig
    from pivot_assets.profiling.profiler import Profiler

VERSION = "1"  # the rows and the training a round does; a change here makes every round recompute
RECORD = ".refresh_round.json"  # beside a round's model: what its training spent (read back by a cached rerun)
Log = Callable[[str], None]


def round_asset(r: int) -> str:
    """The Dagster asset, and the models/ dir of rounds >= 1, of round r."""
    return f"refresh_round_{r}"


def part_key(r: int) -> str:
    return f"round_{r:03d}"


def checkpoint(wh: Warehouse, r: int) -> Path:
    """The model round r trained: grpo_run's for round 0."""
    from pivot_assets.training.runs import GRPO_DIR

    return wh.model_dir(GRPO_DIR if r == 0 else round_asset(r))


def bucket_expr(lambda_diff: float) -> pl.Expr:
    mixed, hard = pl.col("reward_var") > 0, pl.col("reward_mean") <= lambda_diff
    return (pl.when(mixed & hard).then(pl.lit("adv")).when(mixed).then(pl.lit("mixed"))
            .when(~hard).then(pl.lit("easy")).otherwise(pl.lit("unsolved")))


def read_round(wh: Warehouse, r: int) -> pl.DataFrame:
    path = wh.parts_dir(REFRESH_PROFILES) / f"part-{part_key(r)}.parquet"
    if not Path(str(path)).exists():
        raise ValueError(f"refresh round {r} has no rows yet: materialize {round_asset(r)} first")
    return pl.read_parquet(str(path))


def write_round(wh: Warehouse, r: int, rows: pl.DataFrame, budget: list[dict]) -> None:
    table = rows.select([f.name for f in REFRESH_PROFILES_SCHEMA]).to_arrow().cast(REFRESH_PROFILES_SCHEMA)
    wh.append_part(REFRESH_PROFILES, table, key=part_key(r))
    wh.append_part(REFRESH_BUDGET, pa.Table.from_pylist(budget, schema=REFRESH_BUDGET_SCHEMA), key=part_key(r))


# -- the draws -----------------------------------------------------------------------------------------------
def skipped_turns(previous: pl.DataFrame, r: int, cfg: "PivotConfig") -> set[str]:
    """The turns settled (zero variance) in round r-1 that round r does not profile again."""
    p = cfg.refresh.skip_settled_prob
    settled = previous.filter(pl.col("reward_var") == 0)["turn_id"].to_list()
    return {t for t in settled if p > 0 and seeded_unit(cfg.refresh.seed, f"skip:{r}:{t}") < p}


def replayed_turns(previous: pl.DataFrame, r: int, cfg: "PivotConfig", pool: set[str]) -> list[str]:
    """A seeded refresh.replay_fraction (rounded half up) of the training-pool turns mastered in round r-1."""
    mastered = previous.filter((pl.col("n_pass") == pl.col("k")) & (pl.col("k") > 0)
                               & pl.col("turn_id").is_in(sorted(pool)))["turn_id"].to_list()
    n = math.floor(cfg.refresh.replay_fraction * len(mastered) + 0.5)
    return sorted(mastered, key=lambda t: seeded_digest(cfg.refresh.seed, f"replay:{r}:{t}"))[:n]


# -- accounting ----------------------------------------------------------------------------------------------
def profiling_spend(wh: Warehouse, policy_fp: str, sampling_fp: str, profiled: pl.DataFrame) -> dict:
    """Samples and generated tokens behind the profiles (their turn's samples below its k): what the profiling
    cost when it ran, whether this run generated them or found them cached."""
    if profiled.height == 0 or not wh.part_files("rollouts"):
        return {"samples": 0, "generated_tokens": 0}
    con = wh.duck()
    con.register("profiled", profiled.select("turn_id", "k").to_arrow())
    samples, tokens = con.execute(
        f"select count(*), coalesce(sum(r.n_completion_tokens), 0) from read_parquet('{wh.source_glob('rollouts')}') r "
        "join profiled p using (turn_id) where r.policy_fp = ? and r.sampling_fp = ? and r.sample_index < p.k",
        [policy_fp, sampling_fp]).fetchone()
    con.close()
    return {"samples": int(samples), "generated_tokens": int(tokens)}


def grpo_spend(steps: list[dict], completions: list[dict], num_generations: int) -> dict:
    """Samples GRPO generated (its completions log) and their tokens (TRL's mean completion length per step times
    that step's completions)."""
    per_step: dict = {}
    for c in completions:
        per_step[c.get("step")] = per_step.get(c.get("step"), 0) + 1
    lengths = {s["step"]: s.get("completion_mean_length") or 0.0 for s in steps}
    mean_length = sum(lengths.values()) / len(lengths) if lengths else 0.0
    tokens = sum(n * lengths.get(step, mean_length) for step, n in per_step.items())
    n_steps = len(steps)
    return {"samples": len(completions), "generated_tokens": int(round(tokens)), "grpo_steps": n_steps,
            "num_generations": num_generations,
            "prompts_per_step": round(len(completions) / (n_steps * num_generations)) if n_steps else 0}


def budget_rows(r: int, policy_fp: str, profiling: dict, grpo: dict, evaluation: dict) -> list[dict]:
    blank = {"grpo_steps": None, "prompts_per_step": None, "num_generations": None}
    return [{"round": r, "phase": "profiling", "policy_fp": policy_fp, **blank, **profiling},
            {"round": r, "phase": "grpo_generation", "policy_fp": policy_fp, **grpo},
            {"round": r, "phase": "evaluation", "policy_fp": policy_fp, **blank,
             **{k: evaluation[k] for k in ("samples", "generated_tokens")}}]


def evaluate(wh: Warehouse, cfg: "PivotConfig", verifiers, model: Path, log: Log) -> dict:
    """Local accuracy of a round's checkpoint on the held-out profiled turns (evaluation.k samples each, under
    pivot_eval's evaluation seed), cached by everything it depends on."""
    from pivot_assets.evaluation.heldout import evaluation_engine, evaluation_sets, local_accuracy, turn_rows
    from pivot_assets.evaluation.heldout import eval_seed
    from pivot_assets.training.runs import model_fingerprint

    turns = evaluation_sets(wh, cfg)["profiled"]
    engine = evaluation_engine(cfg)
    key = fingerprint({"model": model_fingerprint(str(model), cfg), "turns": fingerprint(turns),
                       "k": cfg.evaluation.k, "max_new_tokens": cfg.training.max_completion_length,
                       "seed": eval_seed(cfg), "verifier": verifiers.fingerprint, "engine": engine.backend,
                       "temperature": engine.temperature, "top_p": engine.top_p})
    cache = wh.root / "refresh" / f"eval-{key}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    log(f"evaluating {model.name} on {len(turns)} held-out turns x {cfg.evaluation.k}")
    out = local_accuracy(str(model), turn_rows(wh, turns), verifiers, k=cfg.evaluation.k,
                         max_new_tokens=cfg.training.max_completion_length, seed=eval_seed(cfg),
                         temperature=engine.temperature, top_p=engine.top_p, policy=engine)
    result = {"accuracy": out["local_accuracy"], "turns": len(turns), "samples": len(turns) * cfg.evaluation.k,
              "generated_tokens": int(out.get("generated_tokens", 0))}
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(cache)
    return result


def effective_generations(cfg: "PivotConfig") -> int:
    """GRPO's group size as it runs: training.num_generations, capped on a CPU (runs.CPU_SMOKE_CAPS)."""
    from pivot_assets.core import hardware
    from pivot_assets.training.runs import CPU_SMOKE_CAPS

    k = cfg.training.num_generations
    return k if hardware.has_cuda() else min(k, CPU_SMOKE_CAPS["num_generations"])


# -- round 0 -------------------------------------------------------------------------------------------------
def round_zero_rows(wh: Warehouse, cfg: "PivotConfig", profiles: pl.DataFrame) -> pl.DataFrame:
    """refresh_profiles' round-0 rows: the reference's profiles, their buckets, and the turns training.set holds."""
    from pivot_assets.core.split import ConversationSplit

    held = ConversationSplit.from_config(cfg).not_in_pool(wh)
    train = set(wh.read(SET_TABLES[cfg.training.set], ["turn_id"])["turn_id"].to_list())
    return profiles.with_columns(
        pl.lit(0).alias("round"), pl.col("policy_fp").alias("profiled_by"), bucket_expr(cfg.pivots.lambda_diff).alias("bucket"),
        pl.lit(False).alias("skipped"), pl.lit(False).alias("replayed"),
        (pl.col("turn_id").is_in(sorted(train)) & ~pl.col("trajectory_id").is_in(sorted(held))).alias("trained"))


def record_round_zero(wh: Warehouse, cfg: "PivotConfig", verifier_sets, log: Log) -> dict:
    """Round 0 as the pipeline ran it: turn_profiles' buckets, the training set grpo_run trained on, its spend."""
    profiles = wh.read("turn_profiles")
    rows = round_zero_rows(wh, cfg, profiles)
    policy_fp = profiles["policy_fp"][0] if profiles.height else ""
    sampling_fp = profiles["sampling_fp"][0] if profiles.height else ""
    steps = wh.read("grpo_steps").to_dicts() if wh.exists("grpo_steps") else []
    completions = wh.read("grpo_completions", ["step"]).to_dicts() if wh.exists("grpo_completions") else []
    evaluation = evaluate(wh, cfg, verifier_sets.profiling, checkpoint(wh, 0), log)
    budget = budget_rows(0, policy_fp, profiling_spend(wh, policy_fp, sampling_fp, profiles),
                         grpo_spend(steps, completions, effective_generations(cfg)), evaluation)
    write_round(wh, 0, rows, budget)
    return {"round": 0, "rows": rows, "budget": budget, "evaluation": evaluation, "policy_fp": policy_fp,
            "generated": {"rollouts_generated": 0}, "trained": False}


# -- round r >= 1 --------------------------------------------------------------------------------------------
def profile_round(wh: Warehouse, cfg: "PivotConfig", verifiers, model: Path, turns: list[str], log: Log):
    """Profile `turns` with `model` (round r-1's checkpoint): (Profiler, its profile rows, what this run
    generated)."""
    from pivot_assets.core.split import ConversationSplit
    from pivot_assets.profiling.profiler import Profiler

    policy = cfg.policy.model_copy(update={"model": str(model)})
    profiler = Profiler(wh, policy, verifiers, cfg.runtime.threads, seeding=cfg.profiling.seeding,
                        adaptive=cfg.profiling.adaptive, lambda_diff=cfg.pivots.lambda_diff,
                        split=ConversationSplit.from_config(cfg))
    profiler.records_skipped = False  # the pool's skipped_turns stay the reference's
    profiler.wanted_turns = turns
    generated = profiler.generate(log)
    profiler.score(log)
    return profiler, pl.from_arrow(profiler.profile()), generated


def training_set(selection: dict, profiles: pl.DataFrame, turns: pl.DataFrame, set_name: str,
                 replay: list[str]) -> pl.DataFrame:
    """The round's set (selection order) and then the replayed turns not already in it (pivot_set `replay`)."""
    chosen = selection[SET_TABLES[set_name]]
    extra = [t for t in replay if t not in set(chosen["turn_id"].to_list())]
    replayed = (profiles.filter(pl.col("turn_id").is_in(extra)).drop("trajectory_id", "domain", strict=False)
                .join(turns, on="turn_id").sort("turn_id")
                .with_columns(pl.lit(None, pl.Int64).alias("selection_rank"), pl.lit("replay").alias("pivot_set")))
    return pl.concat([chosen, replayed], how="diagonal_relaxed")


def round_key(wh: Warehouse, cfg: "PivotConfig", r: int, train_ids: list[str], reward_fp: str) -> str:
    from pivot_assets.core import hardware
    from pivot_assets.training.runs import model_fingerprint, training_identity
    from pivot_assets.core.split import ConversationSplit

    return fingerprint({
        "version": VERSION, "round": r, "init": model_fingerprint(str(checkpoint(wh, r - 1)), cfg),
        "training": {**training_identity(cfg, hardware.training_device()), "steps": cfg.refresh.steps_per_round},
        "refresh": values(cfg.refresh, REFRESH), "train_turns": fingerprint(train_ids), "verifier": reward_fp,
        "split": ConversationSplit.from_config(cfg).fingerprint(wh), "cpu_smoke": not hardware.has_cuda()})


def train_round(wh: Warehouse, cfg: "PivotConfig", reward, r: int, train: pl.DataFrame, held: set[str],
                log: Log) -> dict:
    """refresh.steps_per_round GRPO steps from round r-1's checkpoint on `train`, unless done with this key.
    Returns the GRPO spend (budget columns) and whether this run trained."""
    import datasets  # noqa: F401  (to_hf_dataset's)

    from pivot_assets.core import hardware
    from pivot_assets.curation.exports import to_hf_dataset
    from pivot_assets.policies.models import PromptFormat
    from pivot_assets.training.grpo import run_grpo
    from pivot_assets.training.vllm_rollout import resolve_rollout_engine
    from pivot_assets.training.runs import is_done, write_marker

    init, out = checkpoint(wh, r - 1), checkpoint(wh, r)
    pool = train.filter(~pl.col("trajectory_id").is_in(sorted(held)))
    key = round_key(wh, cfg, r, pool["turn_id"].to_list(), reward.fingerprint)
    if is_done(out, key) and (out / RECORD).is_file():
        log(f"{round_asset(r)} is up to date ({key}): not retraining")
        return {**json.loads((out / RECORD).read_text()), "trained": False, "key": key}
    if pool.height == 0:  # nothing to train on: the round keeps its init's weights (and so its policy_fp)
        log(f"{round_asset(r)}: empty training set; the round's model is round {r - 1}'s")
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(init, out)
        spend = grpo_spend([], [], effective_generations(cfg))
    else:
        options = cfg.training.model_copy(update={"steps": cfg.refresh.steps_per_round})
        log(f"{round_asset(r)}: GRPO {options.steps} steps from {init.name} on {pool.height} turns")
        trajectories = wh.read("trajectories", ["trajectory_id", "messages", "tools", "conversation_id"])
        run = run_grpo(str(init), to_hf_dataset(pool, trajectories), reward, options, out, cpu_smoke=not hardware.has_cuda(),
                       precision=hardware.training_precision(cfg), threads=cfg.runtime.threads,
                       held_out=held, device=hardware.training_device(), fmt=PromptFormat.from_policy(cfg.policy),
                       rollout=resolve_rollout_engine(cfg))
        spend = grpo_spend(run.steps, run.completions_log, run.grpo_config["num_generations"])
        spend["reward_mean"] = [s.get("reward_mean") for s in run.steps]
    (out / RECORD).write_text(json.dumps(spend))
    write_marker(out, key)  # last: a kill before it means "not done"
    return {**spend, "trained": True, "key": key}


@dataclass
class Reselection:
    """What a round's profiling and reselection gave: the round's profiles (re-profiled or carried), its training
    set, and what was skipped, replayed, held out and in the pool."""

    current: pl.DataFrame
    train: pl.DataFrame
    replay: list[str]
    skip: set[str]
    held: set[str]
    pool: set[str]
    profiler: "Profiler"  # its policy_fp and sampling_fp: the round's rollouts
    profiled: pl.DataFrame
    generated: dict


def reselect(wh: Warehouse, cfg: "PivotConfig", verifiers, previous: pl.DataFrame, model: Path, r: int,
             log: Log) -> Reselection:
    """Round r's steps 1-2 (module docstring): profile `previous`'s turns with `model` (those settled may be
    skipped), reselect the pivot sets, add the replayed turns."""
    from pivot_assets.curation.selection import TURN_COLUMNS, select_pivots
    from pivot_assets.core.split import ConversationSplit

    skip = skipped_turns(previous, r, cfg)
    to_profile = [t for t in previous["turn_id"].to_list() if t not in skip]
    profiler, profiled, generated = profile_round(wh, cfg, verifiers, model, to_profile, log)
    policy_fp, verifier_fp = profiler.policy_fp, profiler.verifiers.fingerprint
    missing = len(to_profile) - profiled.height
    if missing:
        log(f"round {r}: {missing} turns have no profile under {policy_fp} (prompt guard); left out of the round")
    stats = ["turn_id", "trajectory_id", "domain", "k", "n_pass", "reward_mean", "reward_var", "stop_reason"]
    current = pl.concat([
        profiled.select(stats).with_columns(pl.lit(policy_fp).alias("profiled_by"), pl.lit(False).alias("skipped")),
        previous.filter(pl.col("turn_id").is_in(sorted(skip))).select(*stats, "profiled_by")
        .with_columns(pl.lit(True).alias("skipped")),
    ], how="vertical_relaxed").with_columns(pl.lit(policy_fp).alias("policy_fp"), pl.lit(verifier_fp).alias("verifier_fp"))
    turns = wh.read("turns", ["turn_id", *TURN_COLUMNS])
    # carried profiles are this round's estimate of their turns: one (policy, verifier) generation for selection
    selection = select_pivots(current.drop("trajectory_id", "domain"), turns, cfg.pivots)
    held = ConversationSplit.from_config(cfg).not_in_pool(wh)
    pool = set(current.filter(~pl.col("trajectory_id").is_in(sorted(held)))["turn_id"].to_list())
    replay = replayed_turns(previous, r, cfg, pool)
    train = training_set(selection, current.drop("trajectory_id", "domain"), turns, cfg.training.set, replay)
    return Reselection(current, train, replay, skip, held, pool, profiler, profiled, generated)


def run_round(wh: Warehouse, cfg: "PivotConfig", verifier_sets, r: int, log: Log) -> dict:
    """Round r >= 1 (module docstring): profile, reselect, train, evaluate; writes the round's parts."""
    previous = read_round(wh, r - 1)
    if not (checkpoint(wh, r - 1) / "config.json").is_file():
        raise ValueError(f"round {r - 1}'s model is missing at {checkpoint(wh, r - 1)}: materialize "
                         f"{'grpo_run' if r == 1 else round_asset(r - 1)} first")
    step = reselect(wh, cfg, verifier_sets.profiling, previous, checkpoint(wh, r - 1), r, log)
    spend = train_round(wh, cfg, verifier_sets.reward, r, step.train, step.held, log)
    trained_ids = sorted(set(step.train["turn_id"].to_list()) & step.pool)
    rows = step.current.with_columns(
        pl.lit(r).alias("round"), bucket_expr(cfg.pivots.lambda_diff).alias("bucket"),
        pl.col("turn_id").is_in(step.replay).alias("replayed"), pl.col("turn_id").is_in(trained_ids).alias("trained"))
    evaluation = evaluate(wh, cfg, verifier_sets.profiling, checkpoint(wh, r), log)
    grpo = {k: spend[k] for k in ("samples", "generated_tokens", "grpo_steps", "prompts_per_step", "num_generations")}
    policy_fp = step.profiler.policy_fp
    profiling = profiling_spend(wh, policy_fp, step.profiler.sampling_fp, step.profiled)
    budget = budget_rows(r, policy_fp, profiling, grpo, evaluation)
    write_round(wh, r, rows, budget)
    return {"round": r, "rows": rows, "budget": budget,
            "evaluation": evaluation, "policy_fp": policy_fp, "generated": step.generated,
            "trained": spend["trained"], "key": spend["key"], "skipped": len(step.skip), "replayed": len(step.replay),
            "train_turns": len(trained_ids), "grpo_reward_mean": spend.get("reward_mean")}


# -- what the assets show ------------------------------------------------------------------------------------
def bucket_counts(wh: Warehouse, upto: int | None = None) -> dict[int, dict[str, int]]:
    """{round: {bucket: turns}} of every round written (up to `upto`)."""
    if not wh.exists(REFRESH_PROFILES):
        return {}
    frame = wh.read(REFRESH_PROFILES, ["round", "bucket"])
    if upto is not None:
        frame = frame.filter(pl.col("round") <= upto)
    out: dict[int, dict[str, int]] = {}
    for row in frame.group_by("round", "bucket").len().iter_rows(named=True):
        out.setdefault(row["round"], {})[row["bucket"]] = row["len"]
    return dict(sorted(out.items()))


def churn(previous: pl.DataFrame, current: pl.DataFrame) -> dict:
    """Turns that changed bucket from the previous round, and the mean pass-rate drift of the re-profiled turns."""
    both = current.join(previous.select("turn_id", pl.col("bucket").alias("was"), pl.col("reward_mean").alias("mean_was")),
                        on="turn_id")
    changed = both.filter(pl.col("bucket") != pl.col("was")).height
    fresh = both.filter(~pl.col("skipped"))
    drift = (fresh["reward_mean"] - fresh["mean_was"]).mean() if fresh.height else None
    return {"changed_bucket": changed, "pass_rate_drift": None if drift is None else round(float(drift), 4)}
