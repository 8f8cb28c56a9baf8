"""pivot_eval's and the ablation's measurements (Dagster-free), built so a difference can be believed
(../shared/DESIGN.md, "Evaluation"):

- Fixed evaluation sets, independent of the set being trained (`evaluation_sets`): every held-out profiled
  turn (`profiled`), and the held-out turns of D_mixed (`mixed`) and D_adv (`adv`) under the reference
  policy. Held out = whole source conversations (split.py), never trained on by SFT, GRPO or any arm.
- Fresh, common draws: every policy is sampled with the evaluation seed (runs.eval_seed), a stream apart
  from profiling's, the same per turn for every policy, the reference included (a turn chosen because the
  reference scored low on it regresses toward its mean on a fresh draw, for the reference too).
- Local accuracy of a turn = mean verifier reward (the profiling verifier) over eval_k samples; a set's
  accuracy = the mean over its turns. OOD accuracy = share of probe items answered right (greedy).
- 95% intervals: percentile bootstrap over turns (items for OOD), `training.bootstrap` resamples; paired
  differences against the reference resample the same turns for both policies.
- Per-policy scores are cached under warehouse/eval_cache by (model fingerprint, eval key): a policy whose
  model and evaluation are unchanged is never sampled again.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from pivot_assets.core.config import PolicySection

from pivot_assets.core.shapes import as_canonical_messages
from .ood_probe import ood_accuracy, ood_probe_items  # noqa: F401  (pivot_eval's second column)

if TYPE_CHECKING:
    import numpy as np

    from pivot_assets.core.config import PivotConfig
    from pivot_assets.core.warehouse import Warehouse


def _state_messages(row: dict) -> list[dict]:
    for key in ("messages", "state", "prompt"):
        if row.get(key) is not None:
            return as_canonical_messages(row[key])
    raise ValueError(f"pivot {row.get('turn_id')}: no state messages (expected 'messages', 'state' or 'prompt')")


def _requests(rows: list[dict]):
    from pivot_assets.policies.base import GenerationRequest
    from pivot_assets.verifiers.base import tools_as_list

    requests = []
    for row in rows:
        messages = _state_messages(row)
        requests.append(GenerationRequest(
            turn_id=row["turn_id"], trajectory_id=row.get("trajectory_id") or row["turn_id"],
            message_index=len(messages), messages=messages, tools=tools_as_list(row.get("tools"))))
    return requests


def local_accuracy(model_dir: str, pivot_rows: Iterable[dict], domain_verifiers, k: int = 4,
                   max_new_tokens: int = 256, seed: int = 0, *, temperature: float = 1.0, top_p: float = 1.0,
                   policy: "PolicySection | None" = None) -> dict:
    """Mean verifier reward over k samples per pivot for the policy at model_dir ("embedded" or an HF dir).

    pivot_rows: dicts with turn_id, domain, expert_action (dict or JSON text), tools (list or JSON
    text) and the state messages under `messages` (canonical) or `prompt` (HF export shape).
    `policy` is the sampling engine (backend, dtype, device, batch size: the `policy:` section; its model is
    replaced by model_dir); default: the section's defaults.
    Returns {n_pivots, k, local_accuracy (None when there are no pivots), per_turn: [{turn_id,
    domain, reward_mean, n_pass, rewards, reasons}]}. Sampling is seeded per turn by the backend,
    so the same model, pivots and seed give the same numbers.
    """
    from pivot_assets.policies.base import SamplingConfig
    from pivot_assets.policies.factory import build_backend

    rows = list(pivot_rows)
    if not rows:
        return {"n_pivots": 0, "k": k, "local_accuracy": None, "per_turn": []}
    by_turn = {r["turn_id"]: r for r in rows}
    if len(by_turn) != len(rows):
        raise ValueError("local_accuracy: duplicate turn_id in pivot_rows")
    requests = _requests(rows)
    states = {r.turn_id: r.messages for r in requests}
    engine = build_backend(policy or PolicySection(), model=str(model_dir))
    sampling = SamplingConfig(k=k, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)
    scores: dict[str, list] = defaultdict(list)
    for samples in engine.generate(requests, sampling):
        for s in samples:
            row = by_turn[s.turn_id]
            verifier = domain_verifiers.for_domain(row.get("domain"))
            scores[s.turn_id].append(verifier.score(row["expert_action"], s.completion, tools=row.get("tools"),
                                                    state=states[s.turn_id]))
    per_turn = []
    for row in rows:
        got = scores.get(row["turn_id"], [])
        if len(got) != k:
            raise RuntimeError(f"local_accuracy: turn {row['turn_id']} got {len(got)} samples, expected {k}")
        rewards = [float(sc.reward) for sc in got]
        per_turn.append({"turn_id": row["turn_id"], "domain": row.get("domain"), "reward_mean": sum(rewards) / k,
                         "n_pass": sum(r >= 1.0 for r in rewards), "rewards": rewards,
                         "reasons": [sc.reason for sc in got]})
    accuracy = sum(t["reward_mean"] for t in per_turn) / len(per_turn)
    return {"n_pivots": len(per_turn), "k": k, "local_accuracy": accuracy, "per_turn": per_turn}


# -- evaluation sets -------------------------------------------------------------------------------
EVAL_SETS = ("profiled", "mixed", "adv")
OOD_SET = "ood"


def _reference_generation(wh: "Warehouse") -> tuple[str, str] | None:
    """(policy_fp, verifier_fp) of the profile generation the pivot sets were selected from."""
    for table in ("pivots_mixed", "pivots_adv", "turn_profiles"):
        if wh.exists(table):
            df = wh.read(table, ["policy_fp", "verifier_fp"])
            if df.height:
                top = df.group_by("policy_fp", "verifier_fp").len().sort("len", descending=True).row(0)
                return top[0], top[1]
    return None


def evaluation_sets(wh: "Warehouse", cfg: "PivotConfig") -> dict[str, list[str]]:
    """{profiled, mixed, adv: sorted held-out turn ids}: fixed sets that do not depend on training.set.

    With training.eval_max_turns, each set keeps its first N turns in a seeded hash order (so adv ⊂ mixed ⊂
    profiled stays true wherever the sets are nested)."""
    import polars as pl

    from pivot_assets.core.ids import seeded_unit

    from .split import held_out_trajectories

    held_out = sorted(held_out_trajectories(wh, cfg.training.eval_fraction, cfg.training.seed))
    generation = _reference_generation(wh)
    sets: dict[str, list[str]] = {}
    for name, table in (("profiled", "turn_profiles"), ("mixed", "pivots_mixed"), ("adv", "pivots_adv")):
        if not wh.exists(table) or generation is None:
            sets[name] = []
            continue
        df = wh.read(table, ["turn_id", "policy_fp", "verifier_fp"])
        df = df.filter((pl.col("policy_fp") == generation[0]) & (pl.col("verifier_fp") == generation[1]))
        turns = wh.read("turns", ["turn_id", "trajectory_id"]).filter(pl.col("trajectory_id").is_in(held_out))
        ids = sorted(set(df["turn_id"].to_list()) & set(turns["turn_id"].to_list()))
        if cfg.training.eval_max_turns is not None and len(ids) > cfg.training.eval_max_turns:
            keep = set(sorted(ids, key=lambda t: seeded_unit("eval-cap", t))[: cfg.training.eval_max_turns])
            ids = [t for t in ids if t in keep]
        sets[name] = ids
    if cfg.training.eval_max_turns is not None:  # keep the nesting: a capped mixed/adv turn is always profiled
        union = sorted(set().union(*sets.values()))
        sets["profiled"] = sorted(set(sets["profiled"]) | (set(union) - set(sets["profiled"])))
    return sets


def turn_rows(wh: "Warehouse", turn_ids: Iterable[str]) -> list[dict]:
    """local_accuracy's rows for turn ids: state rebuilt from trajectories.messages[:message_index]."""
    import polars as pl

    wanted = sorted(set(turn_ids))
    if not wanted:
        return []
    turns = wh.read("turns").filter(pl.col("turn_id").is_in(wanted))
    trajectories = {t["trajectory_id"]: t for t in wh.read("trajectories", ["trajectory_id", "messages", "tools"])
                    .filter(pl.col("trajectory_id").is_in(turns["trajectory_id"].unique().to_list()))
                    .iter_rows(named=True)}
    out = []
    for t in turns.sort("turn_id").iter_rows(named=True):
        traj = trajectories[t["trajectory_id"]]
        out.append({"turn_id": t["turn_id"], "trajectory_id": t["trajectory_id"], "domain": t["domain"],
                    "expert_action": t["expert_action"], "messages": list(traj["messages"][: t["message_index"]]),
                    "tools": json.loads(traj["tools"] or "[]")})
    return out


def held_out_pivots(wh: "Warehouse", cfg: "PivotConfig") -> list[dict]:
    """Held-out turns of D_adv under the reference policy (the `adv` evaluation set), as local_accuracy rows."""
    return turn_rows(wh, evaluation_sets(wh, cfg)["adv"])


# -- intervals ---------------------------------------------------------------------------------------
def bootstrap_indices(n: int, resamples: int, seed: str) -> "np.ndarray":
    """(resamples, n) indices drawn with replacement, fixed by (seed, n): every policy resamples the same turns."""
    import numpy as np

    from pivot_assets.core.ids import seeded_int

    return np.random.default_rng(seeded_int("bootstrap", f"{seed}:{n}")).integers(0, n, size=(resamples, n))


def mean_ci(values: list[float], idx) -> tuple[float | None, float | None, float | None]:
    """(mean, 2.5th, 97.5th percentile of the bootstrap means)."""
    import numpy as np

    if not values:
        return None, None, None
    x = np.asarray(values, dtype=float)
    means = x[idx].mean(axis=1)
    return float(x.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


# -- scoring one policy (cached) ------------------------------------------------------------------
@dataclass(frozen=True)
class Policy:
    """One row of a comparison: a name, the arm and seed it came from (None for base/reference), its model."""

    name: str
    model: str
    arm: str | None = None
    seed: int | None = None


def evaluation_engine(cfg: "PivotConfig"):
    # The policies evaluated are local model dirs: a served reference policy is sampled through transformers here.
    return cfg.policy if cfg.policy.backend != "openai" else cfg.policy.model_copy(update={"backend": "transformers"})


def eval_key(cfg: "PivotConfig", sets: dict[str, list[str]], verifiers, probe: list[dict]) -> str:
    from pivot_assets.core.hardware import resolve_dtype
    from pivot_assets.core.ids import canonical_json, short_hash

    from .runs import eval_seed

    engine = evaluation_engine(cfg)
    return short_hash(canonical_json({
        "turns": sorted(set().union(*sets.values())), "k": cfg.training.eval_k, "verifier": verifiers.fingerprint,
        "max_new_tokens": cfg.training.max_completion_length, "seed": eval_seed(cfg),
        "sampling": [engine.temperature, engine.top_p],
        "engine": [engine.backend, resolve_dtype(engine.dtype, engine.device).dtype, engine.device],
        "format": [engine.chat_template, engine.thinking, engine.thinking_budget],  # prompts and stored completions
        "probe": short_hash(canonical_json(probe)),
    }))


def policy_scores(wh: "Warehouse", cfg: "PivotConfig", model: str, model_fp: str, key: str, rows: list[dict],
                  probe: list[dict], verifiers, log) -> dict:
    """{"turns": {turn_id: mean reward}, "ood": [0/1 per probe item], "seconds", "cached"} for one model,
    from warehouse/eval_cache when this (model_fp, key) was scored before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pivot_assets.core.hardware import resolve_dtype

    from .ood_probe import ood_accuracy
    from .runs import eval_seed

    path = _cache_path(wh, model_fp, key)
    if path.exists():
        t = pq.read_table(path).to_pydict()
        turns = {i: s for kind, i, s in zip(t["kind"], t["id"], t["score"]) if kind == "turn"}
        ood = [s for kind, s in zip(t["kind"], t["score"]) if kind == "ood"]
        return {"turns": turns, "ood": ood, "seconds": t["seconds"][0] if t["seconds"] else 0.0, "cached": True}
    engine = evaluation_engine(cfg)
    precision = resolve_dtype(engine.dtype, engine.device)
    t0 = time.perf_counter()
    local = (local_accuracy(model, rows, verifiers, k=cfg.training.eval_k,
                            max_new_tokens=cfg.training.max_completion_length, seed=eval_seed(cfg),
                            temperature=engine.temperature, top_p=engine.top_p, policy=engine)
             if rows else {"per_turn": []})
    details: list = []
    from pivot_assets.policies.models import PromptFormat

    ood_accuracy(model, probe, seed=cfg.training.eval_seed, dtype=precision.dtype, device=engine.device,
                 details=details, fmt=PromptFormat.from_policy(engine))
    turns = {t["turn_id"]: t["reward_mean"] for t in local["per_turn"]}
    ood = [1.0 if d["correct"] else 0.0 for d in details]
    seconds = time.perf_counter() - t0
    ids = list(turns) + [str(i) for i in range(len(ood))]
    table = pa.table({"kind": ["turn"] * len(turns) + ["ood"] * len(ood), "id": ids,
                      "score": list(turns.values()) + ood, "seconds": [seconds] * len(ids)})
    with wh.atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return {"turns": turns, "ood": ood, "seconds": seconds, "cached": False}


def compare(cfg: "PivotConfig", policies: list[tuple[Policy, dict]], sets: dict[str, list[str]], key: str,
            reference: str = "reference", pooled: dict[str, list[str]] | None = None) -> list[dict]:
    """Long rows, one per (policy, evaluation set): accuracy with its 95% bootstrap interval and the paired
    difference against `reference` with its interval. `pooled`: {arm: [policy names]} adds one row per arm and
    set whose per-turn score is the mean over the arm's seeds (seed = null)."""
    from pivot_assets.core.hardware import resolve_dtype

    engine = evaluation_engine(cfg)
    precision = resolve_dtype(engine.dtype, engine.device)
    by_name = {p.name: (p, s) for p, s in policies}
    entries = list(policies)
    for arm, names in (pooled or {}).items():
        members = [by_name[n][1] for n in names if n in by_name]
        if len(members) < 2:
            continue
        turns = {t: sum(m["turns"][t] for m in members) / len(members) for t in members[0]["turns"]}
        ood = [sum(vals) / len(members) for vals in zip(*(m["ood"] for m in members))]
        entries.append((Policy(arm, "", arm, None), {"turns": turns, "ood": ood,
                                                     "seconds": sum(m["seconds"] for m in members)}))
    ref = by_name.get(reference, (None, None))[1]
    rows = []
    for name in (*EVAL_SETS, OOD_SET):
        ids = sets.get(name, []) if name != OOD_SET else None
        n = len(ids) if ids is not None else len(entries[0][1]["ood"]) if entries else 0
        idx = bootstrap_indices(n, cfg.training.bootstrap, name) if n else None
        for policy, scores in entries:
            values = [scores["turns"][t] for t in ids] if ids is not None else list(scores["ood"])
            acc, low, high = mean_ci(values, idx) if n else (None, None, None)
            delta = (None, None, None)
            if ref is not None and n:
                base = [ref["turns"][t] for t in ids] if ids is not None else list(ref["ood"])
                delta = mean_ci([a - b for a, b in zip(values, base)], idx)
            rows.append({"policy": policy.name, "arm": policy.arm, "seed": policy.seed, "model_fp": scores.get("model_fp"),
                         "eval_key": key, "eval_set": name, "n": n, "k": cfg.training.eval_k if ids is not None else 1,
                         "accuracy": acc, "ci_low": low, "ci_high": high, "delta": delta[0], "delta_low": delta[1],
                         "delta_high": delta[2], "backend": engine.backend, "dtype": precision.dtype,
                         "device": engine.device, "seconds": round(float(scores.get("seconds") or 0.0), 1)})
    return rows


EVAL_SCHEMA_FIELDS = (("policy", "string"), ("arm", "string"), ("seed", "int64"), ("model_fp", "string"),
                      ("eval_key", "string"), ("eval_set", "string"), ("n", "int64"), ("k", "int64"),
                      ("accuracy", "float64"), ("ci_low", "float64"), ("ci_high", "float64"), ("delta", "float64"),
                      ("delta_low", "float64"), ("delta_high", "float64"), ("backend", "string"),
                      ("dtype", "string"), ("device", "string"), ("seconds", "float64"))


def eval_table(rows: list[dict], extra: tuple = ()):
    import pyarrow as pa

    schema = pa.schema([(n, getattr(pa, t)()) for n, t in (*EVAL_SCHEMA_FIELDS, *extra)])
    return pa.Table.from_pylist(rows, schema=schema)


def score_policies(wh: "Warehouse", cfg: "PivotConfig", verifiers, policies: list[Policy], log,
                   unit: str = "policies evaluated") -> tuple[list[tuple[Policy, dict]], dict, str]:
    """Score every policy on the fixed sets and the probe (cached per model); returns (scored, sets, eval key)."""
    from pivot_assets.core.hardware import configure_torch
    from pivot_assets.core.progress import Progress

    from .ood_probe import probe_items
    from .runs import model_fingerprint

    configure_torch(cfg.runtime.threads)
    sets = evaluation_sets(wh, cfg)
    rows = turn_rows(wh, set().union(*sets.values()))
    probe = probe_items(cfg.training.ood_probe, cfg.training.ood_max_items)
    key = eval_key(cfg, sets, verifiers, probe)
    log(f"evaluation sets (held out): " + ", ".join(f"{k} {len(v)} turns" for k, v in sets.items())
        + f"; OOD probe {len(probe)} items; eval key {key}")
    by_fp = _score_in_workers(wh, cfg, policies, key, rows, probe, log)
    progress = Progress(total=len(policies), unit=unit, log=log, every_s=0)
    scored = []
    for policy in policies:
        model_fp = model_fingerprint(policy.model, cfg)
        if model_fp not in by_fp:
            by_fp[model_fp] = policy_scores(wh, cfg, policy.model, model_fp, key, rows, probe, verifiers, log)
        scores = {**by_fp[model_fp], "model_fp": model_fp}
        scored.append((policy, scores))
        local = [scores["turns"][t] for t in sets["adv"]]
        progress.update(1, f"{policy.name}{' (cached)' if scores['cached'] else ''}: adv "
                           f"{fmt_accuracy(sum(local) / len(local) if local else None)} on {len(local)} turns, "
                           f"ood {fmt_accuracy(sum(scores['ood']) / len(scores['ood']) if scores['ood'] else None)}")
    return scored, sets, key


def _score_in_workers(wh: "Warehouse", cfg: "PivotConfig", policies: list[Policy], key: str, rows: list[dict],
                      probe: list[dict], log) -> dict[str, dict]:
    """Score the models not yet in the evaluation cache, several at once (runtime.workers); {model_fp: scores}.
    With one worker this does nothing: score_policies scores them in turn."""
    from pivot_assets.core.parallel import EVAL_MEMORY_GIB, resolve_workers, run_jobs

    from .runs import model_fingerprint

    todo: dict[str, str] = {}
    for policy in policies:
        fp = model_fingerprint(policy.model, cfg)
        if fp not in todo and not _cache_path(wh, fp, key).exists():
            todo[fp] = policy.model
    workers = resolve_workers(cfg.runtime.workers, cfg.runtime.threads, len(todo), EVAL_MEMORY_GIB)
    if workers <= 1:
        return {}
    log(f"evaluation: {len(todo)} models to score, {workers} at a time in worker processes (runtime.workers)")
    jobs = [(str(wh.root), cfg, model, fp, key, rows, probe) for fp, model in todo.items()]
    return dict(zip(todo, run_jobs(_policy_scores_job, jobs, workers)))


def _policy_scores_job(root: str, cfg: "PivotConfig", model: str, model_fp: str, key: str, rows: list[dict],
                       probe: list[dict]) -> dict:
    """policy_scores in a worker process (the evaluation verifier is the profiling verifier)."""
    import sys

    from pivot_assets.core.hardware import configure_torch
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.verifiers import DomainVerifiers

    configure_torch(cfg.runtime.threads)
    name = Path(model).name if "/" in model else model
    return policy_scores(Warehouse(root), cfg, model, model_fp, key, rows, probe, DomainVerifiers(cfg.verifier),
                         lambda m: print(f"[evaluation {name}] {m}", file=sys.stderr, flush=True))


def _cache_path(wh: "Warehouse", model_fp: str, key: str) -> Path:
    from pivot_assets.core.ids import short_hash

    return wh.root / "eval_cache" / f"{short_hash(model_fp + '|' + key, 24)}.parquet"


# -- the pivot_eval stage -------------------------------------------------------------------------
def evaluation_policies(wh: "Warehouse", cfg: "PivotConfig") -> list[tuple[str, str]]:
    """(name, model) of pivot_eval's rows: the base model, the reference (the policy that profiled), the SFT
    warm-up when it is not the reference, and the GRPO policy of training.set when trained."""
    from .runs import GRPO_DIR, SFT_DIR, base_model, read_marker, reference_model

    policies = [("base", base_model(cfg))]
    if cfg.policy.backend != "openai":
        policies.append(("reference", reference_model(wh, cfg)))
    if cfg.policy.model != "sft" and read_marker(wh.model_dir(SFT_DIR)):
        policies.append(("sft", str(wh.model_dir(SFT_DIR))))
    if read_marker(wh.model_dir(GRPO_DIR)):
        policies.append((f"grpo_{cfg.training.set}", str(wh.model_dir(GRPO_DIR))))
    return policies


def evaluate_policies(wh: "Warehouse", cfg: "PivotConfig", verifiers, log) -> list[dict]:
    """The pivot_eval stage: long rows (policy, eval_set, accuracy, 95% interval, paired difference against the
    reference) for the base model, the reference, the SFT warm-up and the GRPO policy, sampled with the
    configured engine; policies whose model and evaluation are unchanged are read back, not sampled."""
    policies = [Policy(name, model) for name, model in evaluation_policies(wh, cfg)]
    scored, sets, key = score_policies(wh, cfg, verifiers, policies, log)
    reference = "reference" if any(p.name == "reference" for p in policies) else "base"
    return compare(cfg, scored, sets, key, reference=reference)


def fmt_accuracy(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def fmt_interval(row: dict, prefix: str = "") -> str:
    """"0.412 [0.301, 0.520]" for accuracy (prefix "") or the paired delta (prefix "delta")."""
    value = row["delta" if prefix else "accuracy"]
    low, high = row[f"{prefix}_low" if prefix else "ci_low"], row[f"{prefix}_high" if prefix else "ci_high"]
    if value is None:
        return "n/a"
    sign = "+" if prefix and value >= 0 else ""
    return f"{sign}{value:.3f} [{low:+.3f}, {high:+.3f}]" if prefix else f"{value:.3f} [{low:.3f}, {high:.3f}]"
