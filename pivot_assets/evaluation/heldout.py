"""pivot_eval's and the ablation's measurements (Dagster-free), built so a difference can be believed
(docs/evaluation.md):

- Fixed evaluation sets, independent of the set being trained (`evaluation_sets`): every held-out profiled
  turn (`profiled`), and the held-out turns of D_mixed (`mixed`) and D_adv (`adv`) under the reference
  policy. Held out = whole source conversations (core/split.py), never trained on by SFT, GRPO or any arm.
- Fresh, common draws: every policy is sampled with an evaluation seed (eval_seed), a stream apart
  from profiling's, the same per turn for every policy, the reference included (a turn chosen because the
  reference scored low on it regresses toward its mean on a fresh draw, for the reference too). The ablation's
  seed s has a draw of its own: arm/s, the reference and the base model are all scored with draw s.
- Local accuracy of a turn = mean verifier reward (the profiling verifier) over evaluation.k samples; a set's
  accuracy = the mean over its turns (and draws). OOD accuracy = share of probe items answered right (greedy).
- 95% intervals: a hierarchical percentile bootstrap, `evaluation.bootstrap` resamples: seeds (draws), then source
  conversations, then turns within a conversation (probe items for OOD). A paired difference (against the
  reference, or between two arms) resamples the same seeds, conversations and turns for both sides.
- Scores are cached under warehouse/eval_cache by (model fingerprint, draw key) and (model fingerprint, probe
  key): a policy whose model and evaluation are unchanged is never sampled again.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from pivot_assets.core.config import PolicySection
from pivot_assets.core.ids import seeded_int

from pivot_assets.core.shapes import as_canonical_messages
from pivot_assets.environments import TurnState
from .ood_probe import ood_accuracy, ood_probe_items  # noqa: F401  (pivot_eval's second column)

if TYPE_CHECKING:
    import numpy as np

    from pivot_assets.core.config import PivotConfig
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.policies.factory import EngineSlot


EVAL_SEED_NAMESPACE = "pivot-eval"


def eval_seed(cfg: PivotConfig, draw: int = 0) -> int:
    """The sampling seed of an evaluation: seeded_int("pivot-eval", evaluation.seed), and for the ablation's
    seed `draw` != 0 a stream of its own (ablation seed 0 and pivot_eval share their draws).

    Backends seed each turn's generator with seeded_int(seed, turn_id), so evaluation draws are a stream
    apart from profiling's (seed = policy.seed, a small integer) and the same for every policy evaluated
    with one draw: a turn picked because the reference scored low on it is re-drawn fresh, for the reference too.
    """
    name = str(cfg.evaluation.seed) if draw == 0 else f"{cfg.evaluation.seed}:seed{draw}"
    seed = seeded_int(EVAL_SEED_NAMESPACE, name)
    if seed == cfg.policy.seed:  # astronomically unlikely; never reuse profiling's draws
        seed = seeded_int(EVAL_SEED_NAMESPACE, f"{name}+1")
    return seed

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
                   policy: "PolicySection | None" = None, engines: "EngineSlot | None" = None) -> dict:
    """Mean verifier reward over k samples per pivot for the policy at model_dir ("embedded" or an HF dir).

    pivot_rows: dicts with turn_id, domain, expert_action (dict or JSON text), tools (list or JSON
    text), the state messages under `messages` (canonical) or `prompt` (HF export shape) and, for an
    executable trajectory, its `environment` (what executed_state rebuilds the world from).
    `policy` is the sampling engine (backend, dtype, device, batch size: the `policy:` section; its model is
    replaced by model_dir); default: the section's defaults. `engines`: an EngineSlot the caller keeps across
    models (it closes it); without one, an engine is built for this call and closed after it.
    Returns {n_pivots, k, local_accuracy (None when there are no pivots), per_turn: [{turn_id,
    domain, reward_mean, n_pass, rewards, reasons}]}. Sampling is seeded per sample as profiling seeds it
    (sample i of a turn from its own seed, profiling/profiler.sample_seed) on an engine that takes per-row seeds,
    so a draw does not depend on which turns share an engine call; the same model, pivots and seed give the same
    numbers.
    """
    from pivot_assets.profiling.profiler import sample_seed

    from pivot_assets.policies.base import SamplingConfig
    from pivot_assets.policies.factory import EngineSlot, capabilities

    rows = list(pivot_rows)
    if not rows:
        return {"n_pivots": 0, "k": k, "local_accuracy": None, "per_turn": []}
    by_turn = {r["turn_id"]: r for r in rows}
    if len(by_turn) != len(rows):
        raise ValueError("local_accuracy: duplicate turn_id in pivot_rows")
    requests = _requests(rows)
    # each pivot's messages, with its trajectory's environment when it has one (verifiers that execute)
    states = {r.turn_id: TurnState(r.messages, by_turn[r.turn_id].get("environment"))
              if by_turn[r.turn_id].get("environment") is not None else r.messages for r in requests}
    policy = policy or PolicySection()
    own = engines is None
    slot = EngineSlot(policy) if own else engines
    engine = slot.engine_for(str(model_dir))
    sampling = SamplingConfig(k=k, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)
    scores: dict[str, list] = defaultdict(list)
    tokens = 0  # generated tokens, for a caller that accounts for rollouts (refresh/rounds.py)
    rows_plan = ({r.turn_id: [(i, sample_seed(seed, i)) for i in range(k)] for r in requests}
                 if capabilities(policy.backend).per_row_seeds else None)
    try:
        for samples in engine.generate(requests, sampling, **({"rows": rows_plan} if rows_plan else {})):
            for s in samples:
                tokens += s.n_completion_tokens
                row = by_turn[s.turn_id]
                verifier = domain_verifiers.for_domain(row.get("domain"))
                scores[s.turn_id].append(verifier.score(row["expert_action"], s.completion, tools=row.get("tools"),
                                                        state=states[s.turn_id]))
    finally:  # an engine in its own processes stops now, not when collected: the next model's engine needs the core
        if own:
            slot.close()
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
    return {"n_pivots": len(per_turn), "k": k, "local_accuracy": accuracy, "per_turn": per_turn,
            "generated_tokens": tokens}


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

    With evaluation.max_turns, each set keeps its first N turns in a seeded hash order (so adv ⊂ mixed ⊂
    profiled stays true wherever the sets are nested)."""
    import polars as pl

    from pivot_assets.core.ids import seeded_unit

    from pivot_assets.core.split import HELD_OUT, ConversationSplit

    held_out = sorted(ConversationSplit(cfg.training.eval_fraction, 0.0, cfg.training.seed).trajectories(wh, HELD_OUT))
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
        if cfg.evaluation.max_turns is not None and len(ids) > cfg.evaluation.max_turns:
            keep = set(sorted(ids, key=lambda t: seeded_unit("eval-cap", t))[: cfg.evaluation.max_turns])
            ids = [t for t in ids if t in keep]
        sets[name] = ids
    if cfg.evaluation.max_turns is not None:  # keep the nesting: a capped mixed/adv turn is always profiled
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


# -- intervals: the hierarchical bootstrap -----------------------------------------------------------
@dataclass(frozen=True)
class Resamples:
    """The draws of one hierarchical bootstrap: how often each seed (R, S) and each turn (R, T) is drawn."""

    seeds: "np.ndarray"
    units: "np.ndarray"


def hierarchical_resamples(groups: Sequence[str], n_seeds: int, resamples: int, name: str) -> Resamples:
    """Seeds with replacement; conversations with replacement; within each drawn conversation its turns with
    replacement, as many as it has (a conversation drawn twice draws its turns twice).

    `groups[i]` is the conversation of unit i (a turn, or an OOD item: its own group). Fixed by (name, n_seeds,
    groups): every policy and every pair compared on one set resample the same seeds, conversations and turns.
    """
    import numpy as np

    from pivot_assets.core.ids import canonical_json, seeded_int, short_hash

    digest = short_hash(canonical_json([name, n_seeds, list(groups)]))
    rng = np.random.default_rng(seeded_int("bootstrap", digest))
    seeds = rng.multinomial(n_seeds, [1.0 / n_seeds] * n_seeds, size=resamples)
    keys = list(dict.fromkeys(groups))
    of = np.array([{g: i for i, g in enumerate(keys)}[g] for g in groups] if keys else [], dtype=np.int64)
    drawn = rng.multinomial(len(keys), [1.0 / len(keys)] * len(keys), size=resamples) if keys else None
    units = np.zeros((resamples, len(groups)), dtype=np.int64)
    for c in range(len(keys)):
        members = np.flatnonzero(of == c)
        units[:, members] = rng.multinomial(drawn[:, c] * len(members), [1.0 / len(members)] * len(members))
    return Resamples(seeds, units)


def resampled_mean(values, draws: Resamples) -> tuple[float | None, float | None, float | None]:
    """(mean, 2.5th, 97.5th percentile of the resampled means) of a (seeds, units) matrix."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return None, None, None
    means = ((draws.seeds @ x) * draws.units).sum(axis=1) / (draws.seeds.sum(axis=1) * draws.units.sum(axis=1))
    return float(x.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


# -- scoring one policy (cached) ------------------------------------------------------------------
@dataclass(frozen=True)
class Policy:
    """One row of a comparison: a name, the arm and seed it came from (None for base/reference), its model, and
    the evaluation draws it is scored with (eval_seed(cfg, draw); every policy compared on one draw shares
    its samples' seeds)."""

    name: str
    model: str
    arm: str | None = None
    seed: int | None = None
    draws: tuple[int, ...] = (0,)


LOCAL_EVALUATION_ENGINE = "transformers"  # samples a local model dir where the profiling engine serves none


def evaluation_engine(cfg: "PivotConfig"):
    # The policies evaluated are local model dirs: a served reference policy is sampled through transformers here.
    from pivot_assets.policies.factory import capabilities

    local = capabilities(cfg.policy.backend).local_model
    return cfg.policy if local else cfg.policy.model_copy(update={"backend": LOCAL_EVALUATION_ENGINE})


EVAL_SEEDING = "per_sample"  # local_accuracy's draws: one seed per (turn, sample index), as profiling seeds them


def local_key(cfg: "PivotConfig", turns: list[str], verifiers, draw: int = 0) -> str:
    """What one draw of local accuracy depends on: the turns, evaluation.k, the verifier, sampling, engine, prompts."""
    from pivot_assets.core.hardware import policy_precision
    from pivot_assets.core.ids import canonical_json, short_hash


    engine = evaluation_engine(cfg)
    return short_hash(canonical_json({
        "turns": sorted(turns), "k": cfg.evaluation.k, "verifier": verifiers.fingerprint,
        "max_new_tokens": cfg.training.max_completion_length, "seed": eval_seed(cfg, draw),
        "sampling": [engine.temperature, engine.top_p],
        "engine": [engine.backend, policy_precision(engine).dtype, engine.device],
        "format": [engine.chat_template, engine.thinking, engine.thinking_budget],  # prompts and stored completions
        "seeding": EVAL_SEEDING,
    }))


def ood_key(cfg: "PivotConfig", probe: list[dict]) -> str:
    """What OOD accuracy depends on: the probe items and the engine (greedy: no seed)."""
    from pivot_assets.core.hardware import policy_precision
    from pivot_assets.core.ids import canonical_json, short_hash

    engine = evaluation_engine(cfg)
    return short_hash(canonical_json({
        "probe": short_hash(canonical_json(probe)), "dtype": policy_precision(engine).dtype,
        "device": engine.device, "format": [engine.chat_template, engine.thinking, engine.thinking_budget]}))


def eval_key(cfg: "PivotConfig", sets: dict[str, list[str]], verifiers, probe: list[dict],
             draws: Iterable[int] = (0,)) -> str:
    """The key of a whole evaluation (every draw of every set, and the probe): recorded in every row."""
    from pivot_assets.core.ids import canonical_json, short_hash

    turns = sorted(set().union(*sets.values()))
    return short_hash(canonical_json({"local": [local_key(cfg, turns, verifiers, d) for d in sorted(set(draws))],
                                      "ood": ood_key(cfg, probe)}))


def policy_scores(wh: "Warehouse", cfg: "PivotConfig", model: str, model_fp: str, draws: Iterable[int],
                  rows: list[dict], probe: list[dict], verifiers, log, engines: "EngineSlot | None" = None) -> dict:
    """{"turns": {draw: {turn_id: mean reward}}, "ood": [0/1 per probe item], "seconds", "cached"} for one model;
    each draw and the probe read back from warehouse/eval_cache when this model was scored with them before."""
    from pivot_assets.core.hardware import policy_precision
    from pivot_assets.policies.models import PromptFormat


    engine = evaluation_engine(cfg)
    precision = policy_precision(engine)
    turn_ids = [r["turn_id"] for r in rows]
    seconds, cached = 0.0, True
    turns: dict[int, dict[str, float]] = {}
    for draw in draws:
        path = _cache_path(wh, model_fp, local_key(cfg, turn_ids, verifiers, draw))
        if not path.exists():
            t0, cached = time.perf_counter(), False
            local = (local_accuracy(model, rows, verifiers, k=cfg.evaluation.k,
                                    max_new_tokens=cfg.training.max_completion_length, seed=eval_seed(cfg, draw),
                                    temperature=engine.temperature, top_p=engine.top_p, policy=engine,
                                    engines=engines)
                     if rows else {"per_turn": []})
            _write_scores(wh, path, [t["turn_id"] for t in local["per_turn"]],
                          [t["reward_mean"] for t in local["per_turn"]], time.perf_counter() - t0)
        turns[draw], spent = _read_scores(path)
        seconds += spent
    path = _cache_path(wh, model_fp, ood_key(cfg, probe))
    if not path.exists():
        t0, cached, details = time.perf_counter(), False, []
        ood_accuracy(model, probe, seed=cfg.evaluation.seed, dtype=precision.dtype, device=engine.device,
                     details=details, fmt=PromptFormat.from_policy(engine))
        _write_scores(wh, path, [str(i) for i in range(len(details))],
                      [1.0 if d["correct"] else 0.0 for d in details], time.perf_counter() - t0)
    ood, spent = _read_scores(path)
    return {"turns": turns, "ood": list(ood.values()), "seconds": seconds + spent, "cached": cached}


def _write_scores(wh: "Warehouse", path: Path, ids: list[str], scores: list[float], seconds: float) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": pa.array(ids, pa.string()), "score": pa.array(scores, pa.float64()),
                      "seconds": pa.array([seconds] * len(ids), pa.float64())})
    with wh.atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _read_scores(path: Path) -> tuple[dict[str, float], float]:
    import pyarrow.parquet as pq

    t = pq.read_table(path).to_pydict()
    return dict(zip(t["id"], t["score"])), (t["seconds"][0] if t["seconds"] else 0.0)


# -- comparisons ----------------------------------------------------------------------------------
def _matrix(scores: dict, ids: list[str] | None, draws: tuple[int, ...]) -> list[list[float]] | None:
    """(draws x units) scores of one entry on a set (ids) or the probe (ids None); None when a draw is missing."""
    if any(d not in scores["turns"] for d in draws) and ids is not None:
        return None
    if ids is None:
        by_draw = scores.get("ood_by_draw")
        return [list(by_draw[d] if by_draw else scores["ood"]) for d in draws]
    return [[scores["turns"][d][t] for t in ids] for d in draws]


def _units(sets: dict[str, list[str]], name: str, groups: dict[str, str], probe_n: int) -> tuple[list | None, list]:
    """(turn ids or None for the probe, the conversation of every unit) of an evaluation set."""
    if name == OOD_SET:
        return None, [f"ood:{i}" for i in range(probe_n)]
    ids = sets.get(name, [])
    return ids, [groups.get(t, t) for t in ids]


def pooled_entries(policies: list[tuple[Policy, dict]], pooled: dict[str, list[str]]) -> list[tuple[Policy, dict]]:
    """One entry per arm over its seeds: seed s's model scored with draw s, its probe answers kept per draw."""
    by_name = {p.name: (p, s) for p, s in policies}
    out = []
    for arm, names in pooled.items():
        members = [by_name[n] for n in names if n in by_name]
        if not members:
            continue
        draws = tuple(d for p, _ in members for d in p.draws)
        scores = {"turns": {d: s["turns"][d] for p, s in members for d in p.draws},
                  "ood_by_draw": {d: s["ood"] for p, s in members for d in p.draws},
                  "seconds": sum(s["seconds"] for _, s in members), "model_fp": None}
        out.append((Policy(arm, "", arm, None, draws), scores))
    return out


def compare(cfg: "PivotConfig", policies: list[tuple[Policy, dict]], sets: dict[str, list[str]], key: str,
            reference: str = "reference", pooled: dict[str, list[str]] | None = None,
            groups: dict[str, str] | None = None) -> list[dict]:
    """Long rows, one per (policy, evaluation set): accuracy with its 95% interval and the paired difference
    against `reference` scored on the same draws, with its interval, both from the hierarchical bootstrap (seeds,
    then conversations (`groups`: {turn_id: conversation}; default: every turn its own), then turns).
    `pooled`: {arm: [policy names]} adds one row per arm and set over all its seeds (seed = null), when it has
    several."""
    from pivot_assets.core.hardware import policy_precision

    engine = evaluation_engine(cfg)
    precision = policy_precision(engine)
    several = {arm: names for arm, names in (pooled or {}).items() if len(names) >= 2}
    entries = list(policies) + pooled_entries(policies, several)
    ref = next((s for p, s in policies if p.name == reference), None)
    probe_n = len(policies[0][1]["ood"]) if policies else 0
    rows = []
    for name in (*EVAL_SETS, OOD_SET):
        ids, units = _units(sets, name, groups or {}, probe_n)
        for policy, scores in entries:
            values = _matrix(scores, ids, policy.draws)
            draws = hierarchical_resamples(units, len(policy.draws), cfg.evaluation.bootstrap, name)
            acc = resampled_mean(values, draws) if values and units else (None, None, None)
            base = _matrix(ref, ids, policy.draws) if ref is not None else None
            delta = (resampled_mean([[a - b for a, b in zip(x, y)] for x, y in zip(values, base)], draws)
                     if values and base and units else (None, None, None))
            rows.append({"policy": policy.name, "arm": policy.arm, "seed": policy.seed,
                         "model_fp": scores.get("model_fp"), "eval_key": key, "eval_set": name, "n": len(units),
                         "n_conversations": len(set(units)),
                         "n_seeds": len(policy.draws), "k": cfg.evaluation.k if ids is not None else 1,
                         "accuracy": acc[0], "ci_low": acc[1], "ci_high": acc[2], "delta": delta[0],
                         "delta_low": delta[1], "delta_high": delta[2], "backend": engine.backend,
                         "dtype": precision.dtype, "device": engine.device,
                         "seconds": round(float(scores.get("seconds") or 0.0), 1)})
    return rows


def pair_rows(cfg: "PivotConfig", policies: list[tuple[Policy, dict]], sets: dict[str, list[str]], key: str,
              pooled: dict[str, list[str]], pairs: Iterable[tuple[str, str]], groups: dict[str, str],
              primary: str | None = None) -> list[dict]:
    """Paired differences between arms (a - b), pooled over the seeds both have: seed s of a against seed s of b
    on the same draws, the same resampled seeds, conversations and turns for both sides."""
    arms = dict((p.arm, (p, s)) for p, s in pooled_entries(policies, pooled))
    probe_n = len(policies[0][1]["ood"]) if policies else 0
    rows = []
    for a, b in pairs:
        if a not in arms or b not in arms:
            continue
        (pa_, sa), (pb, sb) = arms[a], arms[b]
        common = tuple(d for d in pa_.draws if d in pb.draws)
        for name in (*EVAL_SETS, OOD_SET):
            ids, units = _units(sets, name, groups, probe_n)
            va, vb = _matrix(sa, ids, common), _matrix(sb, ids, common)
            if not (units and common and va and vb):
                delta = (None, None, None)
            else:
                draws = hierarchical_resamples(units, len(common), cfg.evaluation.bootstrap, name)
                delta = resampled_mean([[x - y for x, y in zip(ra, rb)] for ra, rb in zip(va, vb)], draws)
            excludes = None if delta[1] is None else bool(delta[1] > 0 or delta[2] < 0)
            rows.append({"eval_set": name, "arm_a": a, "arm_b": b, "eval_key": key, "n_seeds": len(common),
                         "n": len(units), "n_conversations": len(set(units)), "delta": delta[0],
                         "delta_low": delta[1], "delta_high": delta[2], "excludes_zero": excludes,
                         "primary": name == primary})
    return rows


EVAL_SCHEMA_FIELDS = (("policy", "string"), ("arm", "string"), ("seed", "int64"), ("model_fp", "string"),
                      ("eval_key", "string"), ("eval_set", "string"), ("n", "int64"), ("n_conversations", "int64"),
                      ("n_seeds", "int64"), ("k", "int64"), ("accuracy", "float64"), ("ci_low", "float64"),
                      ("ci_high", "float64"), ("delta", "float64"), ("delta_low", "float64"),
                      ("delta_high", "float64"), ("backend", "string"), ("dtype", "string"), ("device", "string"),
                      ("seconds", "float64"))
PAIR_SCHEMA_FIELDS = (("eval_set", "string"), ("arm_a", "string"), ("arm_b", "string"), ("eval_key", "string"),
                      ("n_seeds", "int64"), ("n", "int64"), ("n_conversations", "int64"), ("delta", "float64"),
                      ("delta_low", "float64"), ("delta_high", "float64"), ("excludes_zero", "bool_"),
                      ("primary", "bool_"))


def eval_table(rows: list[dict], extra: tuple = (), fields: tuple = EVAL_SCHEMA_FIELDS):
    import pyarrow as pa

    schema = pa.schema([(n, getattr(pa, t)()) for n, t in (*fields, *extra)])
    return pa.Table.from_pylist(rows, schema=schema)


def turn_conversations(wh: "Warehouse", turn_ids: Iterable[str]) -> dict[str, str]:
    """{turn_id: source-conversation key}: the bootstrap's middle level."""
    import polars as pl

    from pivot_assets.core.split import trajectory_groups

    wanted = sorted(set(turn_ids))
    if not wanted:
        return {}
    groups = trajectory_groups(wh)
    turns = wh.read("turns", ["turn_id", "trajectory_id"]).filter(pl.col("turn_id").is_in(wanted))
    return {t: groups.get(j, j) for t, j in zip(turns["turn_id"].to_list(), turns["trajectory_id"].to_list())}


@dataclass
class Scored:
    """score_policies' result: every policy with its scores, the sets, the evaluation key, the conversations."""

    policies: list[tuple[Policy, dict]]
    sets: dict[str, list[str]]
    key: str
    groups: dict[str, str]


def score_policies(wh: "Warehouse", cfg: "PivotConfig", verifiers, policies: list[Policy], log,
                   unit: str = "policies evaluated") -> Scored:
    """Score every policy on the fixed sets (each of its draws) and the probe, cached per model."""
    from pivot_assets.core.hardware import configure_torch
    from pivot_assets.core.progress import Progress
    from pivot_assets.policies.factory import EngineSlot

    from .ood_probe import probe_items
    from pivot_assets.training.runs import model_fingerprint

    configure_torch(cfg.runtime.threads)
    sets = evaluation_sets(wh, cfg)
    rows = turn_rows(wh, set().union(*sets.values()))
    probe = probe_items(cfg.evaluation.ood_probe, cfg.evaluation.ood_max_items)
    draws = sorted({d for p in policies for d in p.draws})
    key = eval_key(cfg, sets, verifiers, probe, draws)
    log("evaluation sets (held out): " + ", ".join(f"{k} {len(v)} turns" for k, v in sets.items())
        + f"; OOD probe {len(probe)} items; draws {draws}; eval key {key}")
    wanted = _draws_by_model(cfg, policies)
    progress = Progress(total=len(wanted), unit=unit, log=log, every_s=0)  # before the workers: their time counts
    by_fp = _score_in_workers(wh, cfg, wanted, rows, probe, verifiers, log)
    adv = set(sets["adv"])
    with EngineSlot(evaluation_engine(cfg), threads=cfg.runtime.threads) as engines:  # one engine for the models in turn
        for fp, (model, model_draws) in wanted.items():
            if fp not in by_fp:
                by_fp[fp] = policy_scores(wh, cfg, model, fp, model_draws, rows, probe, verifiers, log, engines)
            scores = by_fp[fp]
            local = [v for d in model_draws for t, v in scores["turns"][d].items() if t in adv]
            ood = sum(scores["ood"]) / len(scores["ood"]) if scores["ood"] else None
            progress.update(1, f"{Path(model).name if '/' in model else model}"
                               f"{' (cached)' if scores['cached'] else ''}: adv "
                               f"{fmt_accuracy(sum(local) / len(local) if local else None)} over {len(model_draws)} "
                               f"draw(s), ood {fmt_accuracy(ood)}", cached=scores["cached"])
    if engines.starts or engines.reloads:
        log(f"evaluation engine: {engines.starts} start(s), {engines.reloads} weight reload(s) into a running engine")
    scored = [(p, {**by_fp[model_fingerprint(p.model, cfg)], "model_fp": model_fingerprint(p.model, cfg)})
              for p in policies]
    return Scored(scored, sets, key, turn_conversations(wh, set().union(*sets.values())))


def _draws_by_model(cfg: "PivotConfig", policies: list[Policy]) -> dict[str, tuple[str, list[int]]]:
    """{model fingerprint: (model, every draw any policy of that model is scored with)}."""
    from pivot_assets.training.runs import model_fingerprint

    wanted: dict[str, tuple[str, list[int]]] = {}
    for p in policies:
        model, draws = wanted.setdefault(model_fingerprint(p.model, cfg), (p.model, []))
        draws.extend(d for d in p.draws if d not in draws)
    return wanted


def evaluation_workers(cfg: "PivotConfig", models: int) -> int:
    """How many models are scored at once: runtime.workers, or one where the engine runs in its own processes."""
    from pivot_assets.core.parallel import EVAL_MEMORY_GIB, resolve_workers
    from pivot_assets.policies.factory import capabilities

    if not capabilities(evaluation_engine(cfg).backend).torch_in_process:
        # one engine per model (vLLM's engine core and worker): two at once on a 2-core box starved each other,
        # the demo's evaluation unfinished after 30 min (bench/RESULTS_demo_engines.md)
        return 1
    return resolve_workers(cfg.runtime.workers, cfg.runtime.threads, models, EVAL_MEMORY_GIB)


def _score_in_workers(wh: "Warehouse", cfg: "PivotConfig", wanted: dict[str, tuple[str, list[int]]],
                      rows: list[dict], probe: list[dict], verifiers, log) -> dict[str, dict]:
    """Score the models with a draw or the probe not yet in the evaluation cache, several at once
    (runtime.workers); {model_fp: scores}. With one worker this does nothing: score_policies scores them in turn."""
    from pivot_assets.core.parallel import run_jobs

    turn_ids = [r["turn_id"] for r in rows]
    todo = {fp: spec for fp, spec in wanted.items()
            if not _cache_path(wh, fp, ood_key(cfg, probe)).exists()
            or any(not _cache_path(wh, fp, local_key(cfg, turn_ids, verifiers, d)).exists() for d in spec[1])}
    workers = evaluation_workers(cfg, len(todo))
    if workers <= 1:
        return {}
    log(f"evaluation: {len(todo)} models to score, {workers} at a time in worker processes (runtime.workers)")
    jobs = [(str(wh.root), cfg, model, fp, draws, rows, probe) for fp, (model, draws) in todo.items()]
    return dict(zip(todo, run_jobs(_policy_scores_job, jobs, workers)))


def _policy_scores_job(root: str, cfg: "PivotConfig", model: str, model_fp: str, draws: list[int], rows: list[dict],
                       probe: list[dict]) -> dict:
    """policy_scores in a worker process (the evaluation verifier is the profiling verifier)."""
    import sys

    from pivot_assets.core.hardware import configure_torch
    from pivot_assets.shared import resolve_shared

    configure_torch(cfg.runtime.threads)
    name = Path(model).name if "/" in model else model
    shared = resolve_shared(cfg, root)
    return policy_scores(shared.warehouse, cfg, model, model_fp, draws, rows, probe, shared.verifiers.profiling,
                         lambda m: print(f"[evaluation {name}] {m}", file=sys.stderr, flush=True))


def _cache_path(wh: "Warehouse", model_fp: str, key: str) -> Path:
    from pivot_assets.core.ids import short_hash

    return wh.root / "eval_cache" / f"{short_hash(model_fp + '|' + key, 24)}.parquet"


# -- the pivot_eval stage -------------------------------------------------------------------------
def evaluation_policies(wh: "Warehouse", cfg: "PivotConfig") -> list[tuple[str, str]]:
    """(name, model) of pivot_eval's rows: the base model, the reference (the policy that profiled), the SFT
    warm-up when it is not the reference, and the GRPO policy of training.set when trained."""
    from pivot_assets.training.runs import GRPO_DIR, SFT_DIR, base_model, read_marker, reference_model

    policies = [("base", base_model(cfg))]
    from pivot_assets.policies.factory import capabilities

    if capabilities(cfg.policy.backend).local_model:  # a served reference has no local dir to evaluate
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
    scored = score_policies(wh, cfg, verifiers, policies, log)
    reference = "reference" if any(p.name == "reference" for p in policies) else "base"
    return compare(cfg, scored.policies, scored.sets, scored.key, reference=reference, groups=scored.groups)


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
