"""Ingest benchmark: `pivot run --select trajectories,turns` vs a plain Python script doing the same job, on real
tau-bench airline trajectories (OpenAI chat JSONL) replicated with distinct content, at two sizes.

    .venv/bin/python bench/bench_ingest.py [--replicas 1248] [--out bench/RESULTS_ingest.md]

Input: the 50 simulations of ../shared/data/tau2-bench/airline_run1.json as OpenAI chat records (the policy as the
system message, string tool-call arguments, tool schemas inferred from the calls), each replica with its first
user message and record id made distinct; `--replicas` at full size (1248 = ~740k turns; half of it, ~370k, too), so
doubling the input is measured. For each size, in one run:
  - plain: json.loads per line, a loop over the messages (canonical arguments, content-hash id, dedup, turns),
    pyarrow Parquet writers in batches: the same two tables;
  - pivot: `pivot run --select trajectories,turns` (Dagster, streaming ingest with worker processes, DuckDB turn
    extraction, and the data-contract checks Dagster runs with the assets), stage times from the run's events.
Peak memory is the largest sum of RSS over the process tree (the run, its child, the ingest workers), sampled
every 0.1 s. Prints a markdown table and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests/tau2_chat.py: the chat records this bench ingests
SHARED = REPO.parent / "shared" / "data" / "tau2-bench" / "airline_run1.json"
PIVOT = Path(sys.executable).parent / "pivot"


# ---------------------------------------------------------------------------------------------- input


def airline_chat_records() -> list[dict]:
    """The shared tau2 airline simulations as OpenAI chat records, with tool schemas inferred from the calls."""
    from tests.tau2_chat import tau2_as_openai_chat

    results = json.loads(SHARED.read_text())
    schemas: dict[str, dict] = {}
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    for sim in results["simulations"]:
        for m in sim["messages"]:
            for call in m.get("tool_calls") or []:
                props = schemas.setdefault(call["name"], {})
                for key, value in (call["arguments"] or {}).items():
                    props.setdefault(key, {"type": kinds.get(type(value), "string")})
    tools = [{"type": "function", "function": {"name": name, "description": f"The airline tool {name}.",
              "parameters": {"type": "object", "properties": props, "required": sorted(props)}}}
             for name, props in sorted(schemas.items())]
    return tau2_as_openai_chat(results, tools)


def write_replicated(path: Path, replicas: int) -> tuple[int, int]:
    """`replicas` copies of the airline records, each made distinct; returns (records, turns)."""
    base = airline_chat_records()
    turns = sum(m["role"] == "assistant" for r in base for m in r["messages"])
    with open(path, "w") as f:
        for r in range(replicas):
            for record in base:
                messages = [dict(m) for m in record["messages"]]
                first_user = next(m for m in messages if m["role"] == "user")
                first_user["content"] = f"{first_user['content']} [ref R{r:06d}]"
                f.write(json.dumps({**record, "id": f"{record['id']}-r{r}", "messages": messages}) + "\n")
    return replicas * len(base), replicas * turns


# ---------------------------------------------------------------------------------------------- plain script

PLAIN = r'''
import hashlib, json, sys
import pyarrow as pa, pyarrow.parquet as pq
from pivot_assets.core.catalog import TRAJECTORY_SCHEMA, TURNS_SCHEMA

def canon(o):
    return json.dumps(o, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

def main(path, out):
    seen, trajectories, turns, n = set(), [], [], 0
    tw = pq.ParquetWriter(f"{out}/trajectories.parquet", TRAJECTORY_SCHEMA, compression="zstd")
    uw = pq.ParquetWriter(f"{out}/turns.parquet", TURNS_SCHEMA, compression="zstd")
    with open(path, "rb") as f:
        for lineno, line in enumerate(f):
            record = json.loads(line)
            messages = []
            for m in record["messages"]:
                calls = [{"id": c["id"], "name": c["function"]["name"], "arguments": canon(json.loads(c["function"]["arguments"]))}
                         for c in m.get("tool_calls") or []] or None
                messages.append({"role": m["role"], "content": m.get("content"), "reasoning": m.get("reasoning"),
                                 "tool_calls": calls, "tool_call_id": m.get("tool_call_id")})
            tools = canon(record.get("tools") or [])
            tid = hashlib.sha256(canon({"messages": messages, "tools": json.loads(tools)}).encode()).hexdigest()[:16]
            if tid in seen:
                continue
            seen.add(tid)
            domain = record.get("domain") or "default"
            trajectories.append({"trajectory_id": tid, "source": path, "record": lineno, "source_format": "openai",
                                 "domain": domain, "messages": messages, "tools": tools,
                                 "outcome_reward": record.get("reward"), "conversation_id": tid})
            k = 0
            for i, m in enumerate(messages):
                if m["role"] != "assistant":
                    continue
                calls = m["tool_calls"] or []
                if len(calls) == 1:
                    kind, action = "tool_call", {"type": "function_call", "name": calls[0]["name"], "arguments": calls[0]["arguments"]}
                elif calls:
                    kind, action = "tool_call_batch", {"type": "function_call_batch", "calls": [
                        {"type": "function_call", "name": c["name"], "arguments": c["arguments"]} for c in calls]}
                else:
                    kind, action = "message", {"type": "message", "content": m["content"] or ""}
                turns.append({"turn_id": hashlib.md5(f"{tid}:{i}".encode()).hexdigest()[:16], "trajectory_id": tid,
                              "domain": domain, "message_index": i, "turn_index": k, "action_kind": kind,
                              "expert_action": canon(action), "tool_names": [c["name"] for c in calls]})
                k += 1
            if len(trajectories) >= 2048:
                tw.write_table(pa.Table.from_pylist(trajectories, schema=TRAJECTORY_SCHEMA))
                uw.write_table(pa.Table.from_pylist(turns, schema=TURNS_SCHEMA))
                n += len(turns)
                trajectories, turns = [], []
    tw.write_table(pa.Table.from_pylist(trajectories, schema=TRAJECTORY_SCHEMA))
    uw.write_table(pa.Table.from_pylist(turns, schema=TURNS_SCHEMA))
    tw.close(); uw.close()
    print(json.dumps({"turns": n + len(turns)}))

main(sys.argv[1], sys.argv[2])
'''


# ---------------------------------------------------------------------------------------------- engine floor

# The least any ingest of this input does, with the engine at its best: DuckDB on every core parses each line
# straight into typed messages, writes their JSON once, hashes it with DuckDB's fast non-cryptographic hash, and
# writes zstd Parquet. None of the format rules, quarantine, dedup, sha256 ids, turns or checks; no Dagster. A
# lower bound for the ingest step, not a competitor: it shows how much of pivot's ingest time the rules cost.
FLOOR = r'''
import os, sys, duckdb
con = duckdb.connect(config={"threads": os.cpu_count()})
columns = ("{id: 'VARCHAR', messages: 'STRUCT(role VARCHAR, content VARCHAR, tool_calls STRUCT(id VARCHAR, "
           "function STRUCT(name VARCHAR, arguments VARCHAR))[], tool_call_id VARCHAR)[]', tools: 'JSON', reward: 'JSON'}")
con.execute(f"""COPY (SELECT hash(to_json(messages), tools) AS id, messages, tools, reward
                      FROM read_json('{sys.argv[1]}', format='newline_delimited', columns={columns},
                                     maximum_object_size=100000000))
                TO '{sys.argv[2]}/trajectories.parquet' (COMPRESSION zstd)""")
'''


# ---------------------------------------------------------------------------------------------- measuring


def run_measured(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run a command; wall seconds, peak RSS summed over its process tree (sampled), stdout+stderr."""
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    peak = [0]

    def sample() -> None:
        try:
            root = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            return
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.communicate()[0]
    wall = time.perf_counter() - start
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed:\n{output[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every waited-for descendant: workers included
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_mib": peak[0] / 2**20, "output": output}


STEP = re.compile(r'Finished execution of step "(\w+)" in ([\d.]+)(ms|s)')
EVENT_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) .*? - (RUN_START|RUN_SUCCESS) -", re.MULTILINE)


def stage_times(output: str) -> dict[str, float]:
    """Seconds per Dagster step, from the run's DEBUG events."""
    times = {}
    for step, value, unit in STEP.findall(output):
        times[step] = float(value) / (1000 if unit == "ms" else 1)
    return times


def measure_size(tmp: Path, replicas: int) -> dict:
    data = tmp / f"airline_x{replicas}.jsonl"
    t0 = time.perf_counter()
    records, turns = write_replicated(data, replicas)
    generated = time.perf_counter() - t0
    plain_out = tmp / f"plain_{replicas}"
    plain_out.mkdir()
    plain = run_measured([sys.executable, "-c", PLAIN, str(data), str(plain_out)], env={**os.environ, "PYTHONPATH": str(REPO)})
    floor_out = tmp / f"floor_{replicas}"
    floor_out.mkdir()
    floor = run_measured([sys.executable, "-c", FLOOR, str(data), str(floor_out)])
    project = tmp / f"pivot_{replicas}"
    project.mkdir()
    (project / "pivot.yaml").write_text(f"warehouse: ./wh\ninputs:\n  - path: {data}\n")
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), "PIVOT_LOG_LEVEL": "DEBUG"}
    pivot = run_measured([str(PIVOT), "run", "--select", "trajectories,turns", "--config", str(project / "pivot.yaml")],
                         env=env, cwd=project)
    ingest = re.search(r"read (\d+) records: (\d+) ingested, (\d+) quarantined, (\d+) duplicates", pivot["output"])
    extracted = re.search(r"extracted (\d+) turns", pivot["output"])
    assert ingest and int(ingest.group(2)) == records and int(extracted.group(1)) == turns, pivot["output"][-2000:]
    assert json.loads(plain["output"].strip().splitlines()[-1])["turns"] == turns
    return {"replicas": replicas, "records": records, "turns": turns, "bytes": data.stat().st_size, "generated_s": generated,
            "plain": plain, "pivot": pivot, "floor": floor, "stages": stage_times(pivot["output"])}


# ---------------------------------------------------------------------------------------------- report


def render(results: list[dict], load_before: float, load_after: float) -> str:
    lines = [
        "# Ingest benchmark: `pivot run --select trajectories,turns` vs a plain script",
        "",
        f"`.venv/bin/python bench/bench_ingest.py` on {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 1-min load average {load_before:.1f} before, "
        f"{load_after:.1f} after (the box is shared: both sides of each ratio ran back to back under the same load).",
        "Input: the 50 real tau2-bench airline simulations as OpenAI chat JSONL, replicated with distinct content "
        "(first user message and record id); peak memory = the largest RSS sum over the process tree.",
        "",
        "| input | records | turns | MiB | plain s | plain CPU s | plain turns/s | plain peak MiB | pivot run s | "
        "pivot CPU s | pivot turns/s | pivot peak MiB | speed-up (wall) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p, q = r["plain"], r["pivot"]
        lines.append(f"| x{r['replicas']} | {r['records']:,} | {r['turns']:,} | {r['bytes'] / 2**20:,.0f} | {p['wall_s']:.1f} | "
                     f"{p['cpu_s']:.1f} | {r['turns'] / p['wall_s']:,.0f} | {p['peak_mib']:,.0f} | {q['wall_s']:.1f} | "
                     f"{q['cpu_s']:.1f} | {r['turns'] / q['wall_s']:,.0f} | {q['peak_mib']:,.0f} | "
                     f"**{p['wall_s'] / q['wall_s']:.2f}x** |")
    lines += ["", "Stages of `pivot run` (seconds, from the run's step events; the rest of the wall time is process start, "
              "definitions and the Dagster run itself):", "",
              "| input | " + " | ".join(sorted(results[-1]["stages"])) + " | steps total | wall |",
              "|---|" + "---:|" * (len(results[-1]["stages"]) + 2)]
    for r in results:
        stages = r["stages"]
        lines.append(f"| x{r['replicas']} | " + " | ".join(f"{stages.get(k, 0):.1f}" for k in sorted(results[-1]["stages"]))
                     + f" | {sum(stages.values()):.1f} | {r['pivot']['wall_s']:.1f} |")
    if len(results) == 2:
        small, big = results
        lines += ["", f"Memory when the input doubles: pivot {big['pivot']['peak_mib'] / small['pivot']['peak_mib']:.2f}x "
                  f"(target <= 1.2x), plain script {big['plain']['peak_mib'] / small['plain']['peak_mib']:.2f}x."]
    big = results[-1]
    stages, wall = big["stages"], big["pivot"]["wall_s"]
    checks = sum(v for k, v in stages.items() if k.endswith("_data_contract"))
    lines += ["", "Where the time of the largest run goes:",
              f"- ingest step: {stages.get('ingest', 0):.1f} s = {big['records'] / max(stages.get('ingest', 1e-9), 1e-9):,.0f} "
              f"records/s ({big['bytes'] / 2**20 / max(stages.get('ingest', 1e-9), 1e-9):,.0f} MiB/s of JSONL) with one worker "
              "process per core;",
              f"- turns step (DuckDB COPY): {stages.get('turns', 0):.1f} s; contract checks: {checks:.1f} s (the first one "
              "includes importing Great Expectations);",
              f"- outside the steps (process start, definitions, the Dagster run): {wall - sum(stages.values()):.1f} s;",
              f"- CPU seconds, all processes: pivot {big['pivot']['cpu_s']:.0f}, plain {big['plain']['cpu_s']:.0f}: "
              "the speed-up comes from using both cores, so it shrinks when the box is shared."]
    return "\n".join(lines + budget_lines(big)) + "\n"


def budget_lines(big: dict) -> list[str]:
    """What 3x the plain script leaves for the ingest step, against the engine floor measured in the same run."""
    target = big["plain"]["wall_s"] / 3
    ingest = big["stages"].get("ingest", 0.0)
    rest = big["pivot"]["wall_s"] - ingest  # the other steps and the run around them
    floor = big["floor"]
    return ["", f"Against 3x (x{big['replicas']}):",
            f"- 3x the plain script is {target:.1f} s end to end; the rest of `pivot run` (turns, checks, start-up) took "
            f"{rest:.1f} s, which leaves {target - rest:.1f} s for the ingest step; it took {ingest:.1f} s;",
            f"- the engine floor (DuckDB on {os.cpu_count()} threads: parse, message JSON, a non-cryptographic hash, "
            f"zstd Parquet; no rules, quarantine, dedup, sha256 ids, turns or checks) took {floor['wall_s']:.1f} s "
            f"({floor['cpu_s']:.1f} CPU s); pivot's ingest step used {ingest / max(floor['wall_s'], 1e-9):.1f}x its wall time."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1248, help="copies of the 50 simulations at full size (1248: ~740k turns)")
    parser.add_argument("--out", default=str(REPO / "bench" / "RESULTS_ingest.md"))
    parser.add_argument("--only-full", action="store_true", help="skip the half-size run")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    sizes = [args.replicas] if args.only_full else [args.replicas // 2, args.replicas]
    with tempfile.TemporaryDirectory(dir=os.environ.get("PIVOT_BENCH_TMP")) as tmp:
        results = [measure_size(Path(tmp), n) for n in sizes]
    report = render(results, load_before, os.getloadavg()[0])
    print(report)
    Path(args.out).write_text(report)


if __name__ == "__main__":
    main()
