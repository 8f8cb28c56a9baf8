"""pivot_eval's measurements (Dagster-free): local accuracy on held-out pivots and the OOD probe.

Local accuracy (the paper's in-domain proxy, measured without an environment): the mean verifier
reward over K sampled completions per held-out pivot, sampled through the policies backend (the
same fast batched path and prompt rendering as profiling) and scored by the pivot's domain verifier.
OOD accuracy: see pivot_assets/ood_probe.py (re-exported here).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Iterable

from pivot_assets.core.config import PolicySection

from pivot_assets.core.shapes import as_canonical_messages
from .ood_probe import ood_accuracy, ood_probe_items  # noqa: F401  (pivot_eval's second column)

if TYPE_CHECKING:
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


# -- the pivot_eval stage -------------------------------------------------------------------------
def held_out_pivots(wh: "Warehouse", cfg: "PivotConfig") -> list[dict]:
    """Pivots of the training set whose trajectory is held out (never trained on by SFT or GRPO)."""
    import polars as pl

    from pivot_assets.core.catalog import SET_TABLES

    from .split import held_out_trajectories

    held_out = held_out_trajectories(wh, cfg.training.eval_fraction, cfg.training.seed)
    in_held_out = pl.col("trajectory_id").is_in(sorted(held_out))
    pivots = wh.read(SET_TABLES[cfg.training.set]).filter(in_held_out)
    trajectories = {t["trajectory_id"]: t for t in wh.read("trajectories").filter(in_held_out).iter_rows(named=True)}
    out = []
    for p in pivots.sort("turn_id").iter_rows(named=True):
        traj = trajectories[p["trajectory_id"]]
        out.append({"turn_id": p["turn_id"], "domain": p["domain"], "expert_action": p["expert_action"],
                    "messages": list(traj["messages"][: p["message_index"]]), "tools": json.loads(traj["tools"] or "[]")})
    return out


def evaluation_policies(wh: "Warehouse", cfg: "PivotConfig") -> list[tuple[str, str]]:
    from .runs import GRPO_DIR, SFT_DIR, base_model, read_marker

    policies = [("reference", base_model(cfg))]
    for name, folder in (("sft", SFT_DIR), ("grpo", GRPO_DIR)):
        if read_marker(wh.model_dir(folder)):
            policies.append((name, str(wh.model_dir(folder))))
    return policies


def evaluate_policies(wh: "Warehouse", cfg: "PivotConfig", verifiers, log) -> list[dict]:
    """The pivot_eval stage: one row per policy, sampled with the configured engine (policy.backend, its
    resolved dtype and device); rows already computed for the same model, engine and held-out set are reused."""
    from pivot_assets.core.hardware import configure_torch, resolve_dtype
    from pivot_assets.core.ids import canonical_json, short_hash
    from pivot_assets.core.progress import Progress
    from pivot_assets.policies.models import policy_fingerprint

    from .ood_probe import ood_probe_items

    configure_torch(cfg.runtime.threads)
    # The policies evaluated are local model dirs: a served reference policy is sampled through transformers here.
    engine = cfg.policy if cfg.policy.backend != "openai" else cfg.policy.model_copy(update={"backend": "transformers"})
    precision = resolve_dtype(engine.dtype, engine.device)
    pivots = held_out_pivots(wh, cfg)
    eval_key = short_hash(canonical_json({
        "turns": [p["turn_id"] for p in pivots], "k": cfg.training.eval_k, "verifier": verifiers.fingerprint,
        "max_new_tokens": cfg.training.max_completion_length, "seed": cfg.training.seed,
        "engine": [engine.backend, precision.dtype, engine.device],
    }))
    cached = {}
    if wh.exists("pivot_eval"):
        cached = {(r["policy"], r["model_fp"], r["eval_key"]): r for r in wh.read("pivot_eval").iter_rows(named=True)}
    rows = []
    policies = evaluation_policies(wh, cfg)
    progress = Progress(total=len(policies), unit="policies evaluated", log=log, every_s=0)
    for policy, model in policies:
        model_fp = policy_fingerprint(model)
        if (policy, model_fp, eval_key) in cached:
            log(f"pivot_eval: {policy} unchanged, reusing its row")
            rows.append(cached[(policy, model_fp, eval_key)])
            progress.update(1, f"{policy} (cached)")
            continue
        t0 = time.perf_counter()
        local = (local_accuracy(model, pivots, verifiers, k=cfg.training.eval_k,
                                max_new_tokens=cfg.training.max_completion_length, seed=cfg.training.seed,
                                policy=engine)
                 if pivots else {"n_pivots": 0, "k": cfg.training.eval_k, "local_accuracy": None})
        ood = ood_accuracy(model, ood_probe_items(), seed=cfg.training.seed, dtype=precision.dtype,
                           device=engine.device)
        progress.update(1, f"{policy}: local {fmt_accuracy(local['local_accuracy'])} on {local['n_pivots']} pivots, "
                           f"ood {ood:.3f}")
        rows.append({"policy": policy, "model_fp": model_fp, "eval_key": eval_key, "n_pivots": local["n_pivots"],
                     "k": local["k"], "local_accuracy": local["local_accuracy"], "ood_accuracy": ood,
                     "backend": engine.backend, "dtype": precision.dtype, "device": engine.device,
                     "seconds": round(time.perf_counter() - t0, 1)})
    return rows


def fmt_accuracy(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"
