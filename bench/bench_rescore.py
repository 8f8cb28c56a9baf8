"""The same rollouts under two verifiers: BFCL multi-turn or tau2 airline profiled once with `tool_call` (the call
text), then re-scored with `executed_state` (what the calls do), with no generation in between.

    .venv/bin/python bench/bench_rescore.py [--source bfcl_multi_turn|tau2_airline] [--limit-turns 64] [--k 8]
                                            [--sft-steps 48] [--backend vllm] [--keep DIR] [--out FILE] [--smoke]

From `configs/<source>.yaml` (warehouse moved, the overrides above): `pivot run` through the pivot sets with
`verifier.default: tool_call`; then the config's verifier becomes `executed_state` and the same `pivot run` again,
which re-scores the cached rollouts (the rollouts asset reports `turns_generated` 0: checked). Reported: the
funnel under each verifier, the turns whose bucket moved, the samples whose verdict flipped by reason, and the
wall time of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_demo import timed_pivot_run  # noqa: E402

SOURCES = {"bfcl_multi_turn": ("BFCL multi-turn", "bench/RESULTS_rescore.md"),
           "tau2_airline": ("tau2 airline", "bench/RESULTS_rescore_tau2.md")}
SELECT = ("trajectories,turns,sft_policy,rollouts,rollout_rewards,turn_profiles,"
          "pivots_mixed,pivots_adv,pivots_cand,pivot_selection_log")
VERIFIERS = {"tool_call": {"name": "tool_call", "text_threshold": 0.5}, "executed_state": {"name": "executed_state"}}


def write_config(work: Path, verifier: str, args) -> Path:
    source = ROOT / "configs" / f"{args.source}.yaml"
    raw = yaml.safe_load(source.read_text())
    raw["warehouse"] = str(work / "warehouse")
    for spec in raw.get("inputs") or []:
        for key in ("path", "tools"):
            if spec.get(key):
                spec[key] = str((source.parent / spec[key]).resolve())
    raw["policy"].update(backend=args.backend, k=args.k, limit_turns=args.limit_turns)
    if args.backend == "vllm":
        raw["policy"]["engine_args"] = {"kv_cache_memory_bytes": 2 << 30}
    raw["sft"]["steps"] = args.sft_steps
    raw["verifier"] = {"default": VERIFIERS[verifier]}
    path = work / "pivot.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def latest_metadata(asset: str) -> dict:
    import dagster as dg

    event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey(asset))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()} if event else {}


def snapshot(work: Path) -> dict:
    """The funnel, each profiled turn's bucket and each sample's verdict, from the warehouse as it is now."""
    import duckdb

    con = duckdb.connect(str(work / "warehouse" / "pivot.duckdb"), read_only=True)
    try:
        count = {t: con.sql(f"select count(*) from {t}").fetchone()[0]
                 for t in ("turns", "turn_profiles", "pivots_mixed", "pivots_adv", "pivots_cand")}
        turns = dict(con.sql("select turn_id, case when reward_var > 0 then 'mixed' when reward_mean > 0 "
                             "then 'solved' else 'unsolved' end from turn_profiles").fetchall())
        means = dict(con.sql("select turn_id, reward_mean from turn_profiles").fetchall())
        verdicts = {(t, i): (r, reason) for t, i, r, reason in con.sql(
            "select turn_id, sample_index, reward, reason from rollout_rewards "
            "where verifier_fp in (select distinct verifier_fp from turn_profiles)").fetchall()}
        rollouts = con.sql("select count(*) from rollouts").fetchone()[0]
    finally:
        con.close()
    return {"count": count, "turns": turns, "means": means, "verdicts": verdicts, "rollouts": rollouts}


def run(work: Path, verifier: str, args) -> dict:
    env = {**os.environ, "DAGSTER_HOME": str(work / "dagster_home"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    (work / "dagster_home").mkdir(exist_ok=True)
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    print(f"{verifier}:", end=" ", flush=True)
    timing = timed_pivot_run(write_config(work, verifier, args), SELECT, env, work / f"run-{verifier}.log")
    return {**timing, "rollouts_meta": latest_metadata("rollouts"), **snapshot(work)}


def flips(before: dict, after: dict) -> Counter:
    out: Counter = Counter()
    for key, (reward, reason) in after["verdicts"].items():
        old, old_reason = before["verdicts"].get(key, (None, None))
        if old is not None and (old > 0) != (reward > 0):
            out[("0 -> 1" if reward > 0 else "1 -> 0", old_reason if reward > 0 else reason)] += 1
    return out


def report(a: dict, b: dict, args, out: Path) -> None:
    from pivot_assets.core.hardware import describe_cpu

    reasons_a, reasons_b = (Counter(reason for _, reason in s["verdicts"].values()) for s in (a, b))
    moved = Counter((a["turns"][t], b["turns"].get(t)) for t in a["turns"] if a["turns"][t] != b["turns"].get(t))
    passed = {name: sum(1 for r, _ in s["verdicts"].values() if r > 0) for name, s in (("tool_call", a),
                                                                                         ("executed_state", b))}
    lines = [
        f"# The same {SOURCES[args.source][0]} rollouts under `tool_call` and `executed_state` (bench/bench_rescore.py)",
        "",
        f"Machine: {describe_cpu()}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load average at the end "
        f"{[round(x, 2) for x in os.getloadavg()]}.",
        f"Command: `.venv/bin/python bench/bench_rescore.py --source {args.source} --limit-turns {args.limit_turns} "
        f"--k {args.k} "
        f"--sft-steps {args.sft_steps} --backend {args.backend}`", "",
        f"`configs/{args.source}.yaml` with the reference a {args.sft_steps}-step "
        f"SFT warm-up of SmolLM2-135M-Instruct, K={args.k}, the first {args.limit_turns} turns by turn_id, on the "
        f"`{args.backend}` engine. Run 1 profiles with `tool_call`; run 2 changes only the verifier to "
        "`executed_state` and re-scores: its rollouts asset generated samples for "
        f"{b['rollouts_meta'].get('turns_generated')} turns ({a['rollouts']} rollouts before, {b['rollouts']} "
        "after).", "",
        "| | tool_call | executed_state |", "|---|---|---|",
        *(f"| {t} | {a['count'][t]} | {b['count'][t]} |" for t in a["count"]),
        f"| samples passed (of {len(a['verdicts'])}) | {passed['tool_call']} | {passed['executed_state']} |",
        f"| wall (s) | {a['total_s']:.0f} | {b['total_s']:.0f} |", "",
        "Profiled turns whose bucket moved (mixed: 0 < pass rate < 1; solved: every sample passed):", "",
        "| tool_call -> executed_state | turns |", "|---|---|",
        *(f"| {x} -> {y} | {n} |" for (x, y), n in sorted(moved.items())), "" if moved else "| none | 0 |", "",
        "Reasons of every sample's verdict under each verifier:", "",
        "| reason | tool_call | executed_state |", "|---|---|---|",
        *(f"| {r} | {n_a} | {reasons_b.get(r, 0)} |" for r, n_a in reasons_a.most_common()),
        *(f"| {r} | 0 | {n} |" for r, n in reasons_b.most_common() if r not in reasons_a), "",
        "Samples whose verdict flipped, by the reason of the failing side:", "",
        "| flip | reason | samples |", "|---|---|---|",
        *(f"| {d} | {r} | {n} |" for (d, r), n in flips(a, b).most_common()),
    ]
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", choices=sorted(SOURCES), default="bfcl_multi_turn")
    ap.add_argument("--limit-turns", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--sft-steps", type=int, default=48)
    ap.add_argument("--backend", default="vllm")
    ap.add_argument("--keep", default=None, help="work dir to keep; default: a temp dir")
    ap.add_argument("--out", default=None, help="default: bench/RESULTS_rescore.md (BFCL), _tau2.md (tau2)")
    ap.add_argument("--smoke", action="store_true", help="2 turns, K=2, 1 SFT step: checks the script")
    args = ap.parse_args()
    if args.smoke:
        args.limit_turns, args.k, args.sft_steps = 2, 2, 1
    args.out = args.out or str(ROOT / SOURCES[args.source][1])
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench_rescore_"))
    work.mkdir(parents=True, exist_ok=True)
    before = run(work, "tool_call", args)
    after = run(work, "executed_state", args)
    if after["rollouts_meta"].get("turns_generated") != 0 or after["rollouts"] != before["rollouts"]:
        sys.exit(f"the re-score generated: {after['rollouts_meta']} ({before['rollouts']} -> {after['rollouts']} rollouts)")
    (work / "summary.json").write_text(json.dumps({"before": before["count"], "after": after["count"]}))
    report(before, after, args, Path(args.out))


if __name__ == "__main__":
    main()
