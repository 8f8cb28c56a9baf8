"""Adaptive profiling on real data: how many samples each stopping rule uses, and how good its pivot sets are.

1. The label: profile a calibration set once at K = --label-k (32) through the pipeline (`pivot run`: ingest, the
   reference policy, rollouts, rollout_rewards, turn_profiles), per-sample seeding.
2. Replay: sample i of a turn is the same draw whatever k or the rule, so exhaustive K = --k (8), smaller exhaustive
   budgets and each adaptive rule are replayed exactly on the label's first samples (profiling/adaptive.simulate,
   the rounds the pipeline runs). Each rule's profiles go through selection (curation/selection.select_pivots with
   the config's `pivots:`) and are compared with exhaustive K = --k (agreement) and with the label (precision,
   recall, F1 of D_adv and D_mixed); samples and generated tokens are counted from the samples each rule takes.
3. The prior: how well the expert action's log-likelihood (turn_profiles.expert_logprob) predicts the label's pass
   rate (Spearman; AUC for "ever passes" and for "passes at least half the time").
4. One `pivot run` of profiling + selection with adaptive off and on (--run-rule, --run-epsilon, --run-prior), side
   by side from the same ingested warehouse and reference policy: wall time, samples, tokens, F1 against the label;
   each adaptive mode once per scheduler of --run-schedulers (rounds, waves of --wave-samples, stream of
   --wave-samples requests in flight), with the samples of each written part over the run (a plot beside the
   results file).

    .venv/bin/python bench/bench_adaptive.py --config bench/configs/adaptive_synthetic.yaml
    .venv/bin/python bench/bench_adaptive.py --config CONFIG --label-k 32 --k 8 --out bench/out/adaptive

The config is any pivot.yaml (its inputs, policy, verifier, pivots); the bench overrides warehouse, policy.k and
profiling. Results: bench/RESULTS_adaptive.md (--results), with the load average at each step (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import yaml  # noqa: E402

from pivot_assets.core.config import AdaptiveSection, PivotsSection, load_config  # noqa: E402
from pivot_assets.core.engines import capabilities  # noqa: E402
from pivot_assets.curation.selection import select_pivots  # noqa: E402
from pivot_assets.profiling.adaptive import simulate  # noqa: E402

PIVOT = str(REPO / ".venv" / "bin" / "pivot")
PROFILING = "rollouts,rollout_rewards,turn_profiles"
SELECTION = "pivots_mixed,pivots_adv,pivots_cand,pivot_selection_log"
SETS = ("mixed", "adv")


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0:3].__str__().replace("'", "")


# -- running the pipeline ---------------------------------------------------------------------------------------
def write_config(base: dict, path: Path, warehouse: Path, k: int, adaptive: dict | None,
                 backend: str | None = None) -> Path:
    cfg = json.loads(json.dumps(base))
    cfg["warehouse"] = str(warehouse)
    cfg.setdefault("policy", {})["k"] = k
    if backend and backend != cfg["policy"].get("backend"):
        cfg["policy"]["backend"] = backend
        if backend != "vllm":
            cfg["policy"].pop("engine_args", None)
    cfg["profiling"] = {"seeding": "per_sample", "adaptive": adaptive or {"enabled": False}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def pivot_run(config: Path, select: str, dagster_home: Path, log: Path) -> float:
    """`pivot run --select ...` in a subprocess (its own Dagster instance); wall seconds."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "PIVOT_TORCH_THREADS": os.environ.get("PIVOT_TORCH_THREADS", "1")}
    t0 = time.perf_counter()
    with open(log, "a") as out:
        proc = subprocess.run([PIVOT, "run", "--config", str(config), "--select", select], env=env, stdout=out,
                              stderr=subprocess.STDOUT, cwd=config.parent)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"pivot run --select {select} failed (exit {proc.returncode}): see {log}")
    return wall


# -- the label's samples --------------------------------------------------------------------------------------
def load_samples(wh: Path, label_k: int) -> tuple[dict, dict, dict, dict, pl.DataFrame]:
    """Per turn: rewards and completion tokens in sample order, prompt tokens, the expert likelihood; the turns."""
    con = duckdb.connect()
    profile = con.sql(f"select policy_fp, sampling_fp, verifier_fp from read_parquet('{wh}/turn_profiles.parquet') limit 1").fetchone()
    rows = con.execute(f"""
        select w.turn_id, w.sample_index, w.reward, r.n_completion_tokens, r.n_prompt_tokens
        from read_parquet('{wh}/rollout_rewards/**/*.parquet', hive_partitioning = false) w
        join read_parquet('{wh}/rollouts/**/*.parquet', hive_partitioning = false) r
          using (turn_id, policy_fp, sampling_fp, sample_index)
        where w.policy_fp = ? and w.sampling_fp = ? and w.verifier_fp = ? and w.sample_index < ?
        order by w.turn_id, w.sample_index""", [*profile, label_k]).fetchall()
    rewards, tokens, prompt = {}, {}, {}
    for turn, i, reward, n_tokens, n_prompt in rows:
        assert len(rewards.setdefault(turn, [])) == i, f"turn {turn}: samples are not 0..{label_k - 1}"
        rewards[turn].append(float(reward))
        tokens.setdefault(turn, []).append(int(n_tokens))
        prompt[turn] = int(n_prompt)
    short = [t for t, r in rewards.items() if len(r) < label_k]
    if short:
        raise SystemExit(f"{len(short)} turns have fewer than {label_k} samples, e.g. {short[0]}")
    likelihood = dict(con.sql(f"select turn_id, expert_logprob from read_parquet('{wh}/turn_profiles.parquet')").fetchall())
    n_tokens = dict(con.sql(f"select turn_id, expert_tokens from read_parquet('{wh}/turn_profiles.parquet')").fetchall())
    turns = pl.read_parquet(wh / "turns.parquet").filter(pl.col("turn_id").is_in(list(rewards)))
    return rewards, tokens, prompt, {t: (likelihood.get(t), n_tokens.get(t)) for t in rewards}, turns


def profiles_frame(rewards: dict[str, list[float]], used: dict[str, int], stop: dict[str, str] | None = None) -> pl.DataFrame:
    rows = []
    for turn, n in used.items():
        r = np.array(rewards[turn][:n])
        rows.append({"turn_id": turn, "policy_fp": "p", "verifier_fp": "v", "k": n, "reward_mean": float(r.mean()),
                     "reward_var": float(r.var()), "reward_std": float(r.std()), "n_pass": int((r >= 1).sum()),
                     "stop_reason": (stop or {}).get(turn, "k_reached")})
    return pl.DataFrame(rows)


def pivot_sets(rewards, used, turns: pl.DataFrame, pivots: PivotsSection, stop=None) -> dict[str, set[str]]:
    out = select_pivots(profiles_frame(rewards, used, stop), turns, pivots)
    return {name: set(out[f"pivots_{name}"]["turn_id"].to_list()) for name in SETS}


def prf(got: set[str], want: set[str]) -> tuple[float, float, float]:
    tp = len(got & want)
    p = tp / len(got) if got else (1.0 if not want else 0.0)
    r = tp / len(want) if want else 1.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def f1_difference(got: set[str], base: set[str], want: set[str], turns: list[str], resamples: int = 2000,
                  seed: int = 0) -> tuple[float, float]:
    """95% paired-bootstrap interval (over turns) of F1(got) - F1(base) against `want`."""
    rng = np.random.default_rng(seed)
    g, b, w = (np.array([t in x for t in turns]) for x in (got, base, want))
    idx = rng.integers(0, len(turns), (resamples, len(turns)))

    def f1(pred):
        tp = (pred[idx] & w[idx]).sum(1)
        denominator = pred[idx].sum(1) + w[idx].sum(1)
        return np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 1.0)

    diff = f1(g) - f1(b)
    return float(np.quantile(diff, 0.025)), float(np.quantile(diff, 0.975))


def agreement(a: set[str], b: set[str], universe: int) -> float:
    """Share of the turns whose membership is the same in both sets."""
    return 1 - len(a ^ b) / universe if universe else 1.0


# -- the likelihood prior's predictive power -----------------------------------------------------------------------
def auc(score: np.ndarray, positive: np.ndarray) -> float | None:
    from scipy.stats import mannwhitneyu

    if positive.all() or not positive.any():
        return None
    u = mannwhitneyu(score[positive], score[~positive]).statistic
    return float(u / (positive.sum() * (~positive).sum()))


def likelihood_report(rewards: dict, likelihood: dict) -> dict:
    from scipy.stats import spearmanr

    turns = [t for t in rewards if likelihood[t][0] is not None]
    if len(turns) < 10:
        return {"turns": len(turns)}
    total = np.array([likelihood[t][0] for t in turns])
    per_token = np.array([likelihood[t][0] / max(likelihood[t][1] or 1, 1) for t in turns])
    rate = np.array([np.mean(rewards[t]) for t in turns])
    out = {"turns": len(turns), "pass_rate_mean": float(rate.mean()),
           "exp_logprob_mean": float(np.exp(total).mean())}
    for name, x in (("sum", total), ("per_token", per_token)):
        out[f"spearman_{name}"] = float(spearmanr(x, rate).statistic)
        out[f"auc_any_pass_{name}"] = auc(x, rate > 0)
        out[f"auc_half_pass_{name}"] = auc(x, rate >= 0.5)
    out["lower_bound_holds"] = float(np.mean(np.exp(total) <= rate + 1e-9))  # exp(logprob) <= pass rate
    return out


# -- the replay -------------------------------------------------------------------------------------------------
def rules(k: int, round_size: int) -> list[tuple[str, dict | None, int]]:
    """(name, adaptive settings or None for exhaustive, budget = policy.k)."""
    out: list[tuple[str, dict | None, int]] = [(f"exhaustive K={k}", None, k), (f"exhaustive K={k // 2}", None, k // 2)]
    out.append((f"exact r={round_size}", {"rule": "exact"}, k))
    out.append((f"exact r={round_size} sets=[adv]", {"rule": "exact", "sets": ["adv"]}, k))
    for prior in ("pooled", "likelihood"):
        for eps in (0.05, 0.1, 0.2, 0.3):
            out.append((f"posterior {prior} eps={eps}", {"rule": "posterior", "prior": prior, "epsilon": eps}, k))
    for eps in (0.05, 0.1, 0.2):  # training takes D_adv: only its membership must be settled
        out.append((f"posterior likelihood eps={eps} sets=[adv]",
                    {"rule": "posterior", "prior": "likelihood", "epsilon": eps, "sets": ["adv"]}, k))
    for eps in (0.1, 0.2):  # the ceiling of a per-turn prior: the feature is the label's own pass rate
        out.append((f"ceiling: oracle feature eps={eps}", {"rule": "posterior", "prior": "likelihood", "epsilon": eps,
                                                           "oracle": True}, k))
    # reallocation: a larger budget (policy.k) with adaptive stopping spends the samples the settled turns leave
    for budget in (k * 3 // 2, 2 * k):
        out.append((f"exhaustive K={budget}", None, budget))
        for eps in (0.1, 0.2, 0.3):
            for sets in (["mixed", "adv"], ["adv"]):
                name = f"K={budget} posterior likelihood eps={eps}" + (" sets=[adv]" if sets == ["adv"] else "")
                out.append((name, {"rule": "posterior", "prior": "likelihood", "epsilon": eps, "sets": sets}, budget))
    return out


BINS = ((0, 1e-9, "0"), (1e-9, 0.1, "(0,.1)"), (0.1, 0.3, "[.1,.3)"), (0.3, 0.5, "[.3,.5)"), (0.5, 0.7, "[.5,.7)"),
        (0.7, 0.9, "[.7,.9)"), (0.9, 1 - 1e-9, "[.9,1)"), (1 - 1e-9, 1.01, "1"))


def replay(rewards, tokens, prompt, likelihood, turns, cfg, k: int, label_k: int, round_size: int) -> list[dict]:
    """Every rule on the label's samples. Two labels: all label_k samples (the rules' samples are among them), and
    the samples no rule reads (from the largest budget on: an independent label, fewer samples)."""
    pivots = cfg.pivots
    label = pivot_sets(rewards, {t: label_k for t in rewards}, turns, pivots)
    first_unread = max(budget for _, _, budget in rules(k, round_size))
    disjoint = pivot_sets({t: r[first_unread:] for t, r in rewards.items()}, {t: label_k - first_unread for t in rewards},
                          turns, pivots) if label_k > first_unread else None
    reference = pivot_sets(rewards, {t: k for t in rewards}, turns, pivots)
    logprob = {t: v[0] for t, v in likelihood.items()}
    oracle = {t: float(np.log((sum(r) + 0.5) / (len(r) + 1))) for t, r in rewards.items()}
    rows = []
    for name, settings, budget in rules(k, round_size):
        if settings is None:
            used, stop = {t: budget for t in rewards}, None
        else:
            settings = dict(settings)
            feature = oracle if settings.pop("oracle", False) else logprob
            options = AdaptiveSection(enabled=True, round_size=round_size, **settings)
            used = simulate({t: r[:budget] for t, r in rewards.items()}, options, budget, pivots.lambda_diff, feature)
            stop = {t: ("k_reached" if n >= budget else "settled") for t, n in used.items()}
        sets = pivot_sets(rewards, used, turns, pivots, stop)
        samples = sum(used.values())
        rate = {t: float(np.mean(r)) for t, r in rewards.items()}
        by_bin = {label: [used[t] for t in rewards if lo <= rate[t] < hi] for lo, hi, label in BINS}
        row = {"rule": name, "samples_by_label_rate": {b: round(float(np.mean(v)), 2) for b, v in by_bin.items() if v}, "samples": samples, "samples_vs_k": samples / (len(rewards) * k),
               "tokens": sum(sum(tokens[t][:n]) for t, n in used.items()),
               "prefills": sum(-(-n // round_size) if settings else 1 for n in used.values()),
               "prompt_tokens_prefilled": sum(prompt[t] * (-(-n // round_size) if settings else 1) for t, n in used.items())}
        for s in SETS:
            row[f"{s}_f1_ci"] = f1_difference(sets[s], reference[s], label[s], sorted(rewards))
            row[f"{s}_size"] = len(sets[s])
            row[f"{s}_agree_k"] = agreement(sets[s], reference[s], len(rewards))
            row[f"{s}_p"], row[f"{s}_r"], row[f"{s}_f1"] = prf(sets[s], label[s])
            if disjoint is not None:
                row[f"{s}_f1_disjoint"] = prf(sets[s], disjoint[s])[2]
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["tokens_vs_k"] = row["tokens"] / base["tokens"] if base["tokens"] else 0.0
    return rows


# -- what the pass-rate distribution does to it ------------------------------------------------------------------
POPULATIONS = (("Beta(1, 1): uniform", 1.0, 1.0, 0.0, 0.0), ("Beta(0.5, 0.5): U-shaped", 0.5, 0.5, 0.0, 0.0),
               ("Beta(0.2, 0.2): mostly near 0 or 1", 0.2, 0.2, 0.0, 0.0),
               ("30% never pass, 30% always, 40% Beta(1, 1)", 1.0, 1.0, 0.3, 0.3),
               ("45% never pass, 25% always, 30% Beta(0.5, 0.5)", 0.5, 0.5, 0.45, 0.25))


def population_projection(k: int, label_k: int, round_size: int, lambda_diff: float, turns: int = 2000) -> list[dict]:
    """Simulated turns (pass rates from a population; no likelihood, so the pooled prior): exhaustive K vs the
    posterior rule at a few epsilons, F1 against K = label_k, as in the replay."""
    rng = np.random.default_rng(0)
    out = []
    for name, a, b, zero, one in POPULATIONS:
        p = rng.beta(a, b, turns)
        kind = rng.random(turns)
        p = np.where(kind < zero, 0.0, np.where(kind < zero + one, 1.0, p))
        rewards = {f"t{i:05d}": [float(x) for x in rng.random(label_k) < p[i]] for i in range(turns)}

        def sets(used):
            out_sets = {"mixed": set(), "adv": set()}
            for t, n in used.items():
                r = rewards[t][:n]
                if len(set(r)) > 1:
                    out_sets["mixed"].add(t)
                    if sum(r) / n <= lambda_diff:
                        out_sets["adv"].add(t)
            return out_sets

        label = sets({t: label_k for t in rewards})
        base = sets({t: k for t in rewards})
        row = {"population": name, f"K={k}": {s: round(prf(base[s], label[s])[2], 3) for s in SETS}}
        for eps, rule_sets in ((0.05, ["mixed", "adv"]), (0.1, ["mixed", "adv"]), (0.05, ["adv"])):
            options = AdaptiveSection(enabled=True, rule="posterior", prior="pooled", epsilon=eps,
                                      round_size=round_size, sets=rule_sets)
            used = simulate({t: r[:k] for t, r in rewards.items()}, options, k, lambda_diff)
            got = sets(used)
            row[f"eps={eps} sets={rule_sets}"] = {"samples": round(sum(used.values()) / (turns * k), 3),
                                                  **{s: round(prf(got[s], label[s])[2], 3) for s in SETS}}
        out.append(row)
    return out


# -- the report -------------------------------------------------------------------------------------------------
def table(rows: list[dict]) -> str:
    head = ("| rule | samples | of K | gen. tokens | of K | prefills | D_adv size | agree K | P | R | F1 | D_mixed size | "
            "agree K | P | R | F1 |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        lines.append(
            f"| {r['rule']} | {r['samples']} | {r['samples_vs_k']:.0%} | {r['tokens']} | {r['tokens_vs_k']:.0%} | "
            f"{r['prefills']} | {r['adv_size']} | {r['adv_agree_k']:.3f} | {r['adv_p']:.3f} | {r['adv_r']:.3f} | "
            f"**{r['adv_f1']:.3f}** | {r['mixed_size']} | {r['mixed_agree_k']:.3f} | {r['mixed_p']:.3f} | "
            f"{r['mixed_r']:.3f} | **{r['mixed_f1']:.3f}** |")
    return "\n".join(lines)


def generation_figures(dagster_home: Path) -> dict:
    """The last `rollouts` materialization's generation figures (the backend's counters) from a run's instance."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("rollouts"))
        meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
        step = instance.get_run_step_stats(event.run_id, step_keys=["rollouts"])[0]
    figures = {k: meta.get(k) for k in ("generation_s", "rounds", "waves", "wave_samples_mean", "prefill_tokens_computed",
                                        "prompt_tokens_total", "turns", "expert_tokens_scored", "decisions",
                                        "in_flight_mean", "rollouts_aborted", "rollouts_dropped", "decide_s",
                                        "engine_start_s", "expert_scoring_s")}
    # the rollouts step's own time (engine start, likelihoods, generation, scoring between rounds); the rest of
    # `pivot run`'s wall is the process, Dagster and the other stages, the same in every mode
    figures["rollouts_s"] = round(step.end_time - step.start_time, 1)
    submitted, cached = meta.get("prompt_tokens_submitted"), meta.get("prompt_tokens_cached")
    # vLLM's prefix cache: the share of every request's prompt tokens it served (a backend without the counters: -)
    figures["prefix_cache_hit_rate"] = round(cached / submitted, 3) if submitted and cached is not None else None
    return figures


def engine_calls(wh: Path) -> list[tuple[float, int]]:
    """(seconds since the first, samples) of each rollouts part: a part is one engine call's rows (policy.batch_size
    at most), so its size over time is the engine's batch occupancy."""
    parts = sorted((p.stat().st_mtime, p) for p in (wh / "rollouts").rglob("part-*.parquet"))
    if not parts:
        return []
    con = duckdb.connect()
    return [(round(t - parts[0][0], 1), con.sql(f"select count(*) from read_parquet('{p}')").fetchone()[0])
            for t, p in parts]


def occupancy_png(results: dict, names: list[str], path: Path) -> None:
    from pivot_assets.core.plots import lines_png, save_png

    series = {m: [tuple(c) for c in results[m].get("engine_calls", [])] for m in names}
    save_png(lines_png({m: v for m, v in series.items() if v}, title="samples per rollouts part over the run",
                       xlabel="seconds since the first part"), path)


def profile_stats(wh: Path) -> dict:
    con = duckdb.connect()
    samples, turns, tokens = con.sql(f"""
        select sum(p.k), count(*), (select sum(n_completion_tokens) from read_parquet('{wh}/rollouts/**/*.parquet',
            hive_partitioning = false)) from read_parquet('{wh}/turn_profiles.parquet') p""").fetchone()
    reasons = dict(con.sql(f"select stop_reason, count(*) from read_parquet('{wh}/turn_profiles.parquet') group by 1").fetchall())
    sets = {s: set(r[0] for r in con.sql(f"select turn_id from read_parquet('{wh}/pivots_{s}.parquet')").fetchall())
            for s in SETS}
    return {"samples": int(samples), "turns": turns, "tokens": int(tokens), "reasons": reasons, "sets": sets}


def run_modes(args) -> list[tuple[str, int, dict | None, str | None]]:
    """(name, policy.k, adaptive settings, engine) of the side-by-side `pivot run`s: each mode on each engine of
    --run-backends (none given: the config's engine)."""
    def adaptive(eps: float, sets: str) -> dict:
        return {"enabled": True, "rule": args.run_rule, "prior": args.run_prior, "epsilon": eps,
                "round_size": args.round_size, "sets": sets.split(",")}
    adaptive_modes = [("on", args.k, adaptive(args.run_epsilon, args.run_sets))]
    if args.realloc_k:
        adaptive_modes.append((f"on_k{args.realloc_k}", args.realloc_k, adaptive(args.realloc_epsilon, args.realloc_sets)))
    modes = [("off", args.k, None)]
    for scheduler in args.run_schedulers.split(","):  # rounds keep the earlier names: --reuse-runs finds them
        for name, k, settings in adaptive_modes:
            if scheduler != "rounds":
                name = f"{name} {scheduler}"
                settings = {**settings, "scheduler": scheduler, "wave_samples": args.wave_samples}
            modes.append((name, k, settings))
    backends = args.run_backends.split(",") if args.run_backends else [None]
    config_backend = load_config(Path(args.config)).policy.backend

    def runs_on(settings: dict | None, backend: str | None) -> bool:  # the stream needs an engine that streams
        return (settings or {}).get("scheduler") != "stream" or capabilities(backend or config_backend).streams_requests

    return [(f"{b} {m}" if b else m, k, a, b) for b in backends for m, k, a in modes if runs_on(a, b)]


def run_section(args, base: dict, out: Path, label_wh: Path, log: Path, label_sets: dict) -> list[str]:
    """One `pivot run` of profiling + selection per mode, each from a copy of the label's ingested warehouse and
    reference policy (nothing cached); results kept in runs.json (--reuse-runs reads them back)."""
    saved = out / "runs.json"
    results = json.loads(saved.read_text()) if args.reuse_runs and saved.exists() else {}
    modes = run_modes(args)
    for mode, k, settings, backend in modes:
        slug = mode.replace(" ", "_")
        home = out / f"dagster_{slug}"
        if mode in results:  # a kept run: its figures read again (a newer bench may read more of them)
            if home.is_dir():
                results[mode].update({k: v for k, v in generation_figures(home).items() if v is not None})
            continue
        wh = out / f"run_{slug}_wh"
        shutil.rmtree(wh, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        wh.mkdir(parents=True)
        for name in ("trajectories.parquet", "turns.parquet", "quarantine.parquet"):
            if (label_wh / name).exists():
                shutil.copy(label_wh / name, wh / name)
        if (label_wh / "models").is_dir():
            shutil.copytree(label_wh / "models", wh / "models")
        config = write_config(base, out / f"run_{slug}.yaml", wh, k, settings, backend)
        load_start = loadavg()
        wall = pivot_run(config, PROFILING + "," + SELECTION, home, log)
        stats = profile_stats(wh)
        stats["engine_calls"] = engine_calls(wh)
        stats.update(k=k, adaptive=settings, wall=wall, load=f"{load_start} -> {loadavg()}",
                     engine=load_config(config).policy.backend, **generation_figures(home))
        stats["sets"] = {name: sorted(v) for name, v in stats["sets"].items()}
        results[mode] = stats
        saved.write_text(json.dumps(results, indent=1))
    names = [m for m, *_ in modes]
    lines = ["## 4. `pivot run` profiling + selection, side by side (one run each, from the same ingested warehouse "
             "and reference policy)", "",
             *(f"- `{m}`: policy.k={results[m]['k']}, adaptive {json.dumps(results[m]['adaptive'])}" for m in names), "",
             "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for name, key in (("engine", "engine"), ("wall (s)", "wall"), ("rollouts step (s)", "rollouts_s"),
                      ("engine start (s, in rollouts)", "engine_start_s"),
                      ("expert actions' likelihoods (s, in rollouts)", "expert_scoring_s"),
                      ("generation (s, in rollouts)", "generation_s"),
                      ("stream: writing, scoring, deciding (s, engine idle)", "decide_s"), ("samples", "samples"),
                      ("generated tokens", "tokens"), ("rounds", "rounds"), ("waves (engine calls)", "waves"),
                      ("samples per wave, mean", "wave_samples_mean"), ("stream: decisions", "decisions"),
                      ("stream: requests in flight, mean", "in_flight_mean"),
                      ("stream: requests cancelled / finished and dropped", "cancelled"), ("prompt prefills", "turns"),
                      ("prefill tokens computed", "prefill_tokens_computed"),
                      ("prefix-cache hit rate (prompt tokens served from vLLM's cache)", "prefix_cache_hit_rate"),
                      ("load average (start -> end)", "load"), ("stop reasons", "reasons")):
        for m in names:
            if results[m].get("rollouts_aborted") is not None:
                results[m]["cancelled"] = f"{results[m]['rollouts_aborted']} / {results[m]['rollouts_dropped']}"
        cells = [round(results[m][key]) if key == "wall" else results[m].get(key) for m in names]
        cells = ["-" if c is None else c for c in cells]
        lines.append(f"| {name} | " + " | ".join(str(c) for c in cells) + " |")
    for s in SETS:
        cells = []
        for m in names:
            got = set(results[m]["sets"][s])
            cells.append(f"{len(got)} / " + " / ".join(f"{v:.3f}" for v in prf(got, label_sets[s])))
        lines.append(f"| D_{s}: size / P / R / F1 vs the K={args.label_k} label | " + " | ".join(cells) + " |")
    png = Path(args.results).with_name(Path(args.results).stem + "_occupancy.png")
    occupancy_png(results, names, png)
    return lines + ["", f"Samples per rollouts part over each run (an engine call of the rounds and the waves; a group "
                        f"of decided chunks of the stream): `{png.name}`.", ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "bench" / "configs" / "adaptive_synthetic.yaml"))
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "adaptive"))
    ap.add_argument("--label-k", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--round-size", type=int, default=2)
    ap.add_argument("--run-rule", default="posterior")
    ap.add_argument("--run-prior", default="likelihood")
    ap.add_argument("--run-epsilon", type=float, default=0.05)
    ap.add_argument("--run-sets", default="adv", help="comma-separated: the memberships the run's rule settles")
    ap.add_argument("--realloc-k", type=int, default=16, help="a third run: adaptive with this budget (0: none)")
    ap.add_argument("--realloc-epsilon", type=float, default=0.2)
    ap.add_argument("--realloc-sets", default="adv")
    ap.add_argument("--run-backends", default="", help="comma-separated engines to run the side-by-side modes on "
                    "(e.g. vllm,transformers; the label is drawn on the config's engine)")
    ap.add_argument("--run-schedulers", default="rounds", help="comma-separated: rounds, waves, stream (each adaptive "
                    "mode runs once per scheduler; stream on the engines that stream requests)")
    ap.add_argument("--wave-samples", type=int, default=64, help="waves: samples per engine call; stream: requests "
                    "in flight")
    ap.add_argument("--skip-runs", action="store_true", help="replay only: no side-by-side pivot runs")
    ap.add_argument("--reuse-runs", action="store_true", help="keep the runs recorded in <out>/runs.json")
    ap.add_argument("--results", default=str(REPO / "bench" / "RESULTS_adaptive.md"))
    args = ap.parse_args()

    out = Path(args.out).resolve()
    base = yaml.safe_load(Path(args.config).read_text()) or {}
    base_dir = Path(args.config).resolve().parent
    for spec in base.get("inputs") or []:  # the derived configs live elsewhere: absolute input paths
        spec["path"] = str((base_dir / os.path.expanduser(spec["path"])).resolve())
    log = out / "pivot_runs.log"
    out.mkdir(parents=True, exist_ok=True)
    report = [f"# Adaptive profiling: samples vs pivot-set quality ({time.strftime('%Y-%m-%d %H:%M')})", "",
              f"config `{args.config}`, label K={args.label_k}, budget K={args.k}, round size {args.round_size}; "
              f"`{' '.join(sys.argv)}`", ""]

    # 1. the label
    label_wh = out / "label_wh"
    label_cfg = write_config(base, out / "label.yaml", label_wh, args.label_k, None)
    cfg = load_config(label_cfg)
    needs_sft = cfg.policy.model == "sft"
    load0 = loadavg()
    wall = pivot_run(label_cfg, "trajectories,turns" + (",sft_policy" if needs_sft else "") + "," + PROFILING,
                     out / "dagster_label", log)
    rewards, tokens, prompt, likelihood, turns = load_samples(label_wh, args.label_k)
    report += [f"## 1. The label: {len(rewards)} turns x K={args.label_k}", "",
               f"`pivot run` (ingest{', SFT warm-up' if needs_sft else ''}, profiling) {wall:.0f} s (cached steps take "
               f"seconds); load average {load0} -> {loadavg()}.", ""]
    rates = np.array([np.mean(r) for r in rewards.values()])
    hist = np.histogram(rates, bins=[0, 1e-9, 0.1, 0.3, 0.5, 0.7, 0.9, 1 - 1e-9, 1.0])[0]
    report += ["Label pass-rate distribution (turns): "
               + ", ".join(f"{name} {n}" for name, n in zip(["0", "(0,.1)", "[.1,.3)", "[.3,.5)", "[.5,.7)", "[.7,.9)",
                                                            "[.9,1)", "1"], hist)), ""]

    # 2. the replay
    rows = replay(rewards, tokens, prompt, likelihood, turns, cfg, args.k, args.label_k, args.round_size)
    report += [f"## 2. Replay on the label's samples (sets against K={args.label_k}; agreement with exhaustive "
               f"K={args.k})", "", table(rows), "",
               f"The same rules against an independent label: samples {max(b for _, _, b in rules(args.k, args.round_size))}"
               f"..{args.label_k - 1}, which no rule reads (F1 of D_adv / D_mixed):", "",
               "| rule | samples of K | D_adv F1 | D_mixed F1 |", "|---|---|---|---|",
               *(f"| {r['rule']} | {r['samples_vs_k']:.0%} | {r.get('adv_f1_disjoint', float('nan')):.3f} | "
                 f"{r.get('mixed_f1_disjoint', float('nan')):.3f} |" for r in rows), "",
               f"F1 - F1(exhaustive K={args.k}) against the K={args.label_k} label, 95% paired-bootstrap interval over turns "
               "(one turn moves an F1 by about 0.02-0.03 here):", "",
               "| rule | samples of K | D_adv | D_mixed |", "|---|---|---|---|",
               *(f"| {r['rule']} | {r['samples_vs_k']:.0%} | {r['adv_f1'] - rows[0]['adv_f1']:+.3f} "
                 f"[{r['adv_f1_ci'][0]:+.3f}, {r['adv_f1_ci'][1]:+.3f}] | {r['mixed_f1'] - rows[0]['mixed_f1']:+.3f} "
                 f"[{r['mixed_f1_ci'][0]:+.3f}, {r['mixed_f1_ci'][1]:+.3f}] |" for r in rows[1:]), "",
               "Mean samples per turn by the label's pass rate (turns per bin in section 1):", "",
               "| rule | " + " | ".join(b for _, _, b in BINS) + " |", "|---|" + "---|" * len(BINS),
               *(f"| {r['rule']} | " + " | ".join(str(r["samples_by_label_rate"].get(b, "-")) for _, _, b in BINS) + " |"
                 for r in rows), "",
               "samples / gen. tokens: what the rule generates (\"of K\": against exhaustive K); prefills: prompt "
               "prefills (one per round a turn takes; exhaustive: one per turn). agree K: share of the turns whose "
               "membership equals exhaustive K's.", ""]

    # 3. the likelihood prior
    lik = likelihood_report(rewards, likelihood)
    report += ["## 3. The expert action's log-likelihood as a predictor of the label's pass rate", "",
               "```", json.dumps(lik, indent=1), "```", ""]

    # 3b. the same rule on simulated populations: what the distribution of pass rates does to the savings
    projection = population_projection(args.k, args.label_k, args.round_size, cfg.pivots.lambda_diff)
    report += ["## 3b. The pass-rate distribution decides the savings (simulated turns, pooled prior)", "",
               "F1 against K=%d of D_mixed / D_adv; samples as a share of exhaustive K=%d." % (args.label_k, args.k), "",
               "| population | exhaustive K=%d F1 | " % args.k + " | ".join(k for k in projection[0] if k.startswith("eps"))
               + " |", "|---|---|" + "---|" * (len(projection[0]) - 2)]
    for row in projection:
        cells = [f"{row[f'K={args.k}']['mixed']} / {row[f'K={args.k}']['adv']}"]
        cells += [f"{v['samples']:.0%}: {v['mixed']} / {v['adv']}" for key, v in row.items() if key.startswith("eps")]
        report.append(f"| {row['population']} | " + " | ".join(cells) + " |")
    report.append("")

    # 4. pivot run, adaptive off vs on (and on with a larger budget)
    if not args.skip_runs:
        report += run_section(args, base, out, label_wh, log,
                              pivot_sets(rewards, {t: args.label_k for t in rewards}, turns, cfg.pivots))
    Path(args.results).write_text("\n".join(report) + "\n")
    (out / "replay.json").write_text(json.dumps({"rows": rows, "likelihood": lik}, indent=1))
    print("\n".join(report))


if __name__ == "__main__":
    main()
