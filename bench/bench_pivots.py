"""Benchmark: pivot selection, data contracts and exports on synthetic profiles.

Usage: .venv/bin/python bench/bench_pivots.py [N_TURNS ...]   (default: 1000 20000)
Prints a markdown table: seconds per step and peak RSS growth. K = 8 binary rewards per turn,
10 turns per trajectory, 3 domains.
"""

from __future__ import annotations

import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl  # noqa: E402

from pivot_assets.core.config import PivotsSection
from pivot_assets.curation.selection import select_pivots  # noqa: E402
from pivot_assets.core.ids import canonical_json, turn_id  # noqa: E402

K = 8
TURNS_PER_TRAJECTORY = 10


def synthetic(n_turns: int, seed: int = 0):
    rng = random.Random(seed)
    turns, profiles, rewards, trajectories = [], [], [], []
    for t in range(n_turns // TURNS_PER_TRAJECTORY):
        traj = f"traj{t:08d}"
        domain = ("airline", "retail", "telecom")[t % 3]
        messages = [{"role": "system", "content": "policy " * 50, "reasoning": None, "tool_calls": None, "tool_call_id": None}]
        for j in range(TURNS_PER_TRAJECTORY):
            messages.append({"role": "user", "content": f"request {j}", "reasoning": None, "tool_calls": None, "tool_call_id": None})
            index = len(messages)
            call = {"id": f"c{j}", "name": f"tool_{j % 4}", "arguments": canonical_json({"x": j})}
            messages.append({"role": "assistant", "content": None, "reasoning": None, "tool_calls": [call], "tool_call_id": None})
            messages.append({"role": "tool", "content": "ok", "reasoning": None, "tool_calls": None, "tool_call_id": f"c{j}"})
            tid = turn_id(traj, index)
            action = {"type": "function_call", "name": call["name"], "arguments": call["arguments"]}
            turns.append({"turn_id": tid, "trajectory_id": traj, "domain": domain, "message_index": index, "turn_index": j,
                          "action_kind": "tool_call", "expert_action": canonical_json(action), "tool_names": [call["name"]]})
            n_pass = rng.choice([0, 0, 0, 1, 2, 4, 6, 8, 8, 8])
            mean = n_pass / K
            profiles.append({"turn_id": tid, "trajectory_id": traj, "domain": domain, "policy_fp": "p", "sampling_fp": "s",
                             "verifier_fp": "v", "k": K, "reward_mean": mean, "reward_var": mean * (1 - mean),
                             "reward_std": (mean * (1 - mean)) ** 0.5, "n_pass": n_pass, "n_distinct_actions": 2})
            for s in range(K):
                rewards.append((tid, s, 1.0 if s < n_pass else 0.0))
        trajectories.append({"trajectory_id": traj, "source": "bench", "record": str(t), "source_format": "openai",
                             "domain": domain, "messages": messages, "tools": "[]", "outcome_reward": None})
    reward_frame = pl.DataFrame(rewards, schema=["turn_id", "sample_index", "reward"], orient="row").with_columns(
        pl.lit("p").alias("policy_fp"), pl.lit("s").alias("sampling_fp"), pl.lit("v").alias("verifier_fp"),
        pl.lit("ok").alias("reason"), pl.lit(None, pl.Utf8).alias("action"))
    return pl.DataFrame(turns), pl.DataFrame(profiles), reward_frame, pl.DataFrame(trajectories)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(label: str, fn, results: list, n: int):
    start_rss, start = rss_mib(), time.perf_counter()
    value = fn()
    results.append((n, label, time.perf_counter() - start, rss_mib() - start_rss))
    return value


def main(sizes: list[int]) -> None:
    import tempfile

    from pivot_assets.curation.contracts import run_contract
    from pivot_assets.curation.exports import save_hf, to_hf_dataset, to_nemo_gym_rows, write_jsonl

    results: list = []
    timed("import great_expectations + first tiny validation", lambda: run_contract("quarantine", pl.DataFrame(
        {"source": ["s"], "record": ["0"], "reason": ["r"], "raw": ["{}"]})), results, 0)
    for n in sizes:
        turns, profiles, rewards, trajectories = synthetic(n)
        sel = timed("select_pivots", lambda: select_pivots(profiles, turns, PivotsSection(max_per_trajectory=5)), results, n)
        for table, frame, related in (
            ("turns", turns, {}),
            ("rollout_rewards", rewards, {}),
            ("turn_profiles", profiles, {"rollout_rewards": rewards}),
            ("pivots_adv", sel["pivots_adv"], {"turns": turns}),
        ):
            result = timed(f"contract {table} ({frame.height} rows)", lambda: run_contract(table, frame, related=related), results, n)
            assert result.success, result.summary()
        with tempfile.TemporaryDirectory() as tmp:
            adv = sel["pivots_adv"]
            timed(f"export hf ({adv.height} pivots)", lambda: save_hf(to_hf_dataset(adv, trajectories), Path(tmp) / "hf"), results, n)
            timed(f"export nemo-gym ({adv.height} pivots)", lambda: write_jsonl(to_nemo_gym_rows(adv, trajectories), Path(tmp) / "p.jsonl"), results, n)
    print("| turns | step | seconds | peak RSS growth (MiB) |")
    print("|---:|---|---:|---:|")
    for n, label, seconds, rss in results:
        print(f"| {n} | {label} | {seconds:.2f} | {rss:.0f} |")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1000, 20000])
