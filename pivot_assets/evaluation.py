"""pivot_eval's measurements (Dagster-free): local accuracy on held-out pivots and the OOD probe.

Local accuracy (the paper's in-domain proxy, measured without an environment): the mean verifier
reward over K sampled completions per held-out pivot, sampled through the policies backend (the
same fast batched path and prompt rendering as profiling) and scored by the pivot's domain verifier.
OOD accuracy: see pivot_assets/ood_probe.py (re-exported here).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from pivot_assets.grpo import as_canonical_messages
from pivot_assets.ood_probe import ood_accuracy, ood_probe_items  # noqa: F401  (pivot_eval's second column)


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
                   backend: str = "transformers", dtype: str = "float32", batch_size: int = 32) -> dict:
    """Mean verifier reward over k samples per pivot for the policy at model_dir ("embedded" or an HF dir).

    pivot_rows: dicts with turn_id, domain, expert_action (dict or JSON text), tools (list or JSON
    text) and the state messages under `messages` (canonical) or `prompt` (HF export shape).
    Returns {n_pivots, k, local_accuracy (None when there are no pivots), per_turn: [{turn_id,
    domain, reward_mean, n_pass, rewards, reasons}]}. Sampling is seeded per turn by the backend,
    so the same model, pivots and seed give the same numbers.
    """
    from pivot_assets.policies.base import SamplingConfig, build_backend

    rows = list(pivot_rows)
    if not rows:
        return {"n_pivots": 0, "k": k, "local_accuracy": None, "per_turn": []}
    by_turn = {r["turn_id"]: r for r in rows}
    if len(by_turn) != len(rows):
        raise ValueError("local_accuracy: duplicate turn_id in pivot_rows")
    requests = _requests(rows)
    states = {r.turn_id: r.messages for r in requests}
    policy = build_backend({"backend": backend, "model": str(model_dir), "dtype": dtype, "batch_size": batch_size})
    sampling = SamplingConfig(k=k, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)
    scores: dict[str, list] = defaultdict(list)
    for samples in policy.generate(requests, sampling):
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
