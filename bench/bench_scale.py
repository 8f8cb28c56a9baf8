"""Scale benchmark: 0.5M and 1M rollouts through `rollout_rewards` -> `turn_profiles` -> the pivot sets, each with
its data-contract checks, via `pivot run`; plus the rollouts contract on a 10M-row table.

    .venv/bin/python bench/bench_scale.py [--rollouts 1000000] [--k 8] [--contract-rows 10000000]

Inputs are real and the work is real: the turns come from the shared tau2-bench airline simulations (as OpenAI
chat JSONL, replicated with distinct content, ingested by `pivot run --select trajectories,turns`); only the
completions are synthetic (per sample: the expert's call, the call with one argument changed, a reply, or text
that does not parse), so the `tool_call` verifier, the profiles, the selection and the contracts all do their
normal work. Rollouts are written as the profiler writes them (parts of whole turns) under the fingerprints of
an `openai` backend config, so `rollouts` is never regenerated. Each stage runs as its own `pivot run`
(Dagster includes the asset checks of the selected assets), so its wall time and its peak memory (the largest RSS
sum over the process tree, sampled every 0.1 s) are its own; the step times come from the run's events.
Writes bench/RESULTS_scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_ingest import PIVOT, run_measured, stage_times, write_replicated

from pivot_assets.curation.contracts import GX_SAMPLE_ROWS

TURNS_PER_REPLICA = 593  # assistant turns in the 50 shared airline simulations
STAGES = [
    ("rollout_rewards", "rollout_rewards"),
    ("turn_profiles", "turn_profiles"),
    ("pivot sets", "pivots_mixed,pivots_adv,pivots_cand,pivot_selection_log"),
]


def config_text(data: Path, k: int) -> str:
    # The openai backend names its policy by URL and model, so no model is loaded: rollouts are ours.
    return (f"warehouse: ./wh\ninputs:\n  - path: {data}\n"
            f"policy: {{backend: openai, base_url: 'http://127.0.0.1:9/v1', model: synthetic, k: {k}, max_new_tokens: 64}}\n"
            "verifier:\n  default: {name: tool_call}\npivots: {lambda_diff: 0.6, seed: 0}\n")


def completion(action: dict, rng: random.Random) -> str:
    draw = rng.random()
    if action["type"] == "function_call":
        arguments = json.loads(action["arguments"])
        if draw < 0.45:
            return "<tool_call>" + json.dumps({"name": action["name"], "arguments": arguments}) + "</tool_call>"
        if draw < 0.7 and arguments:
            arguments[sorted(arguments)[0]] = "XYZ999"
            return "<tool_call>" + json.dumps({"name": action["name"], "arguments": arguments}) + "</tool_call>"
    elif action["type"] == "message" and draw < 0.5:
        return action["content"]
    return rng.choice(["I can help with that.", "<tool_call>{not json</tool_call>", "Please hold on."])


def write_rollouts(project: Path, k: int, seed: int = 0) -> int:
    """K synthetic samples per turn, as parts of whole turns, keyed as the configured profiler keys them."""
    import duckdb
    import pyarrow as pa

    from pivot_assets.core.catalog import ROLLOUTS_SCHEMA
    from pivot_assets.core.config import load_config
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.profiling.profiler import Profiler
    from pivot_assets.verifiers import DomainVerifiers

    cfg = load_config(project / "pivot.yaml")
    wh = Warehouse(cfg.warehouse_dir)
    profiler = Profiler(wh, cfg.policy, DomainVerifiers(cfg.verifier))
    policy_fp, sampling_fp = profiler.policy_fp, profiler.sampling.fingerprint
    rng = random.Random(seed)
    turns = duckdb.sql(f"select turn_id, trajectory_id, expert_action from read_parquet('{wh.table_path('turns')}') "
                       "order by turn_id").fetchall()
    rows = []
    for tid, trid, action in turns:
        parsed = json.loads(action)
        for s in range(k):
            rows.append({"turn_id": tid, "trajectory_id": trid, "policy_fp": policy_fp, "sampling_fp": sampling_fp,
                         "sample_index": s, "completion": completion(parsed, rng), "n_prompt_tokens": 0,
                         "n_completion_tokens": 16, "finish_reason": "stop"})
        if len(rows) >= 64 * 1024:
            wh.append_part("rollouts", pa.Table.from_pylist(rows, schema=ROLLOUTS_SCHEMA))
            rows = []
    if rows:
        wh.append_part("rollouts", pa.Table.from_pylist(rows, schema=ROLLOUTS_SCHEMA))
    return len(turns) * k


def measure_size(tmp: Path, rollouts: int, k: int) -> dict:
    replicas = max(1, round(rollouts / k / TURNS_PER_REPLICA))
    project = tmp / f"scale_{rollouts}"
    project.mkdir()
    data = project / "airline.jsonl"
    write_replicated(data, replicas)
    (project / "pivot.yaml").write_text(config_text(data, k))
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), "PIVOT_LOG_LEVEL": "DEBUG"}
    run = [str(PIVOT), "run", "--config", str(project / "pivot.yaml"), "--select"]
    setup = run_measured([*run, "trajectories,turns"], env=env, cwd=project)
    t0 = time.perf_counter()
    n = write_rollouts(project, k)
    written_s = time.perf_counter() - t0
    stages = []
    for name, selection in STAGES:
        result = run_measured([*run, selection], env=env, cwd=project)
        steps = stage_times(result["output"])
        stages.append({"stage": name, "wall_s": result["wall_s"], "peak_mib": result["peak_mib"], "steps": steps})
    funnel = pivot_funnel(project)
    return {"rollouts": n, "turns": n // k, "replicas": replicas, "setup_s": setup["wall_s"], "written_s": written_s,
            "stages": stages, "funnel": funnel}


def pivot_funnel(project: Path) -> dict:
    import duckdb

    wh = project / "wh"
    return {name: duckdb.sql(f"select count(*) from read_parquet('{wh}/{name}.parquet')").fetchone()[0]
            for name in ("turn_profiles", "pivots_mixed", "pivots_adv", "pivots_cand")}


def measure_contract(tmp: Path, rows: int) -> dict:
    """The rollouts contract on a `rows`-row Parquet table made in DuckDB (K=8 samples per turn)."""
    path = tmp / "rollouts_10m.parquet"
    import duckdb

    duckdb.sql(f"""COPY (SELECT substr(md5(CAST(i // 8 AS VARCHAR)), 1, 16) AS turn_id,
                        substr(md5('t' || CAST(i // 64 AS VARCHAR)), 1, 16) AS trajectory_id,
                        'policy-fp' AS policy_fp, 'sampling-fp' AS sampling_fp, CAST(i % 8 AS INTEGER) AS sample_index,
                        'completion ' || CAST(i % 1000 AS VARCHAR) AS completion, CAST(100 AS INTEGER) AS n_prompt_tokens,
                        CAST(i % 64 AS INTEGER) AS n_completion_tokens, 'stop' AS finish_reason
                 FROM range({rows}) t(i)) TO '{path}' (FORMAT parquet)""")
    script = ("import json, sys, time; from pivot_assets.curation.contracts import _context, check_parquet; _context(); "
              "t = time.perf_counter(); r = check_parquet('rollouts', {'rollouts': sys.argv[1]}); "
              "print(json.dumps({'seconds': time.perf_counter() - t, 'success': r.success, 'rows': r.n_rows, "
              "'stats': r.statistics}))")
    result = run_measured([sys.executable, "-c", script, str(path)], env={**os.environ, "PYTHONPATH": str(REPO)})
    report = json.loads(result["output"].strip().splitlines()[-1])
    return {"rows": report["rows"], "check_s": report["seconds"], "process_s": result["wall_s"],
            "peak_mib": result["peak_mib"], "success": report["success"], "bytes": path.stat().st_size}


def render(results: list[dict], contract: dict | None, load_before: float, load_after: float) -> str:
    lines = [
        "# Scale benchmark: rollout_rewards -> turn_profiles -> pivot sets (with their contract checks)",
        "",
        f"`.venv/bin/python bench/bench_scale.py` on {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 1-min load average {load_before:.1f} before, "
        f"{load_after:.1f} after (shared box).",
        "Real turns (the shared tau2 airline simulations, replicated with distinct content), synthetic completions, "
        "the real `tool_call` verifier, profiles, selection and Great Expectations contracts. Each stage is its own "
        "`pivot run`: `wall` includes process start and the Dagster run; `step` columns are the Dagster steps "
        "(the asset, then its checks); peak = largest RSS sum over the process tree.",
        "",
        "| rollouts | turns | stage | wall s | steps (s) | peak MiB |",
        "|---:|---:|---|---:|---|---:|",
    ]
    for r in results:
        for s in r["stages"]:
            steps = ", ".join(f"{k} {v:.1f}" for k, v in s["steps"].items())
            lines.append(f"| {r['rollouts']:,} | {r['turns']:,} | {s['stage']} | {s['wall_s']:.1f} | {steps} | {s['peak_mib']:,.0f} |")
    lines.append("")
    for r in results:
        lines.append(f"- {r['rollouts']:,} rollouts: funnel {r['funnel']}; scoring "
                     f"{r['rollouts'] / r['stages'][0]['steps'].get('rollout_rewards', float('nan')):,.0f} rollouts/s "
                     f"(step time); ingest + turns of the input {r['setup_s']:.0f} s, rollouts written in {r['written_s']:.0f} s.")
    if len(results) == 2:
        small, big = results
        ratios = ", ".join(f"{a['stage']} {b['peak_mib'] / a['peak_mib']:.2f}x" for a, b in zip(small["stages"], big["stages"]))
        lines.append(f"- Peak memory at 2x the rollouts: {ratios}.")
    if contract:
        lines += ["", f"Rollouts contract on {contract['rows']:,} rows ({contract['bytes'] / 2**20:,.0f} MiB Parquet): "
                  f"{'PASS' if contract['success'] else 'FAIL'} in {contract['check_s']:.1f} s (exact SQL counts over every row "
                  f"+ the GE suite on a {GX_SAMPLE_ROWS}-row sample, Great Expectations already imported; {contract['process_s']:.1f} s with the process and the "
                  f"Great Expectations import), peak {contract['peak_mib']:,.0f} MiB."]
    return "\n".join(lines) + "\n"





def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1_000_000, help="full size (half of it is measured too)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--contract-rows", type=int, default=10_000_000, help="0 to skip")
    parser.add_argument("--out", default=str(REPO / "bench" / "RESULTS_scale.md"))
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=os.environ.get("PIVOT_BENCH_TMP")) as tmp:
        results = [measure_size(Path(tmp), n, args.k) for n in (args.rollouts // 2, args.rollouts)]
        contract = measure_contract(Path(tmp), args.contract_rows) if args.contract_rows else None
    report = render(results, contract, load_before, os.getloadavg()[0])
    print(report)
    Path(args.out).write_text(report)


if __name__ == "__main__":
    main()
