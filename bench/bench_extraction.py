"""Turn-extraction benchmark: DuckDB fast path vs a plain-Python per-message loop, on >= 1M generated turns.

    .venv/bin/python bench/bench_extraction.py [--trajectories 200000] [--out bench/RESULTS_extraction.md]

Generates a trajectories Parquet (formats.TRAJECTORY_SCHEMA; 12 messages and 5 assistant turns per
trajectory, built column-wise with pyarrow) at half and full size in a temp dir, then runs each measurement
in its own subprocess so that peak RSS (getrusage ru_maxrss) belongs to that measurement alone:
  - fast path: turn_extraction.extract_turns_parquet at both sizes (memory should not grow with the input),
  - loop: Parquet batches -> to_pylist -> extract_turns per trajectory -> Parquet writer (same in/out),
  - baseline: the worker's imports only (the RSS floor both paths pay).
Prints a markdown table and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from pivot_assets.ingest.formats import MESSAGE_TYPE, TRAJECTORY_SCHEMA  # noqa: E402

# One trajectory: role, number of tool calls, whether it is a tool result, whether it has reasoning.
TEMPLATE = [
    ("system", 0), ("user", 0), ("assistant", 1), ("tool", 0), ("assistant", 0), ("user", 0),
    ("assistant", 2), ("tool", 0), ("tool", 0), ("assistant", 1), ("tool", 0), ("assistant", 0),
]
TURNS_PER_TRAJECTORY = sum(role == "assistant" for role, _ in TEMPLATE)
CALL_NAMES = ["get_order_status", "cancel_order", "get_product_details", "track_shipment"]
LOOP_BATCH_ROWS = 2048


def _content(i: int, position: int) -> str | None:
    texts = {0: "You are the assistant of a toy shop.", 1: f"Where is my order ORD-{i}?",
             3: f'{{"order_id": "ORD-{i}", "status": "shipped"}}', 4: f"Order ORD-{i} is shipped.",
             5: f"Cancel ORD-{i + 1} and tell me about P-{i % 997}.", 7: '{"cancelled": true}',
             8: f'{{"price": {i % 90}}}', 10: '{"carrier": "DHL"}', 11: "Done. Anything else?"}
    return texts.get(position)


def build_chunk(start: int, n: int) -> pa.Table:
    """Trajectories start..start+n-1 as a TRAJECTORY_SCHEMA table, built column-wise."""
    m = len(TEMPLATE)
    idx = np.arange(start, start + n)
    roles = pa.array(np.tile(np.array([r for r, _ in TEMPLATE], dtype=object), n), pa.string())
    contents = pa.array([_content(int(i), p) for i in idx for p in range(m)], pa.string())
    reasoning = pa.array([("check the carrier" if p == 9 else None) for _ in idx for p in range(m)], pa.string())
    call_ids, names, args = [], [], []
    for i in idx:
        for k, name in enumerate(CALL_NAMES):
            call_ids.append(f"c{i}_{k}")
            names.append(name)
            args.append(f'{{"order_id":"ORD-{i + (k == 1)}"}}')
    calls = pa.StructArray.from_arrays([pa.array(call_ids), pa.array(names), pa.array(args),
                                        pa.nulls(len(call_ids), pa.string())],  # no accepted values
                                       fields=list(MESSAGE_TYPE.field("tool_calls").type.value_type))
    n_calls = np.tile(np.array([c for _, c in TEMPLATE]), n)
    offsets = pa.array(np.concatenate([[0], np.cumsum(n_calls)]).astype(np.int32))
    tool_calls = pa.ListArray.from_arrays(offsets, calls, type=MESSAGE_TYPE.field("tool_calls").type,
                                          mask=pa.array(n_calls == 0))
    answered = {3: 0, 7: 1, 8: 2, 10: 3}  # tool message position -> call k
    tool_call_ids = pa.array([(f"c{i}_{answered[p]}" if p in answered else None) for i in idx for p in range(m)],
                             pa.string())
    messages_flat = pa.StructArray.from_arrays([roles, contents, reasoning, tool_calls, tool_call_ids],
                                               fields=list(MESSAGE_TYPE))
    messages = pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * m, m, dtype=np.int32)), messages_flat,
                                        type=pa.list_(MESSAGE_TYPE))
    ids = pa.array([f"{i:016x}" for i in idx])
    return pa.Table.from_arrays([
        ids, pa.array(["bench"] * n), pa.array(idx, pa.int64()),
        pa.array(["openai"] * n), pa.array(["toy_shop"] * n), messages, pa.array(["[]"] * n),
        pa.array(np.ones(n)), ids,  # conversation_id: each trajectory its own conversation
    ], schema=TRAJECTORY_SCHEMA)


def write_input(path: Path, n_trajectories: int, chunk: int = 10_000) -> None:
    with pq.ParquetWriter(path, TRAJECTORY_SCHEMA) as writer:
        for start in range(0, n_trajectories, chunk):
            writer.write_table(build_chunk(start, min(chunk, n_trajectories - start)), row_group_size=chunk)


# ---------------------------------------------------------------------------------------------- workers


def run_loop(inp: Path, out: Path) -> int:
    """The plain-Python baseline: per-trajectory extract_turns over streamed batches, written as Parquet."""
    from pivot_assets.core.catalog import TURNS_SCHEMA
    from pivot_assets.ingest.turn_extraction import extract_turns

    n = 0
    with pq.ParquetWriter(out, TURNS_SCHEMA) as writer:
        for batch in pq.ParquetFile(inp).iter_batches(batch_size=LOOP_BATCH_ROWS):
            rows = [turn for traj in batch.to_pylist() for turn in extract_turns(traj)]
            writer.write_table(pa.Table.from_pylist(rows, schema=TURNS_SCHEMA))
            n += len(rows)
    return n


def worker(kind: str, inp: str, out: str) -> None:
    from pivot_assets.ingest.turn_extraction import extract_turns_parquet

    import duckdb  # noqa: F401  (imported for the baseline too, so the floor is comparable)

    t0, c0 = time.perf_counter(), _cpu_seconds()
    if kind == "fast":
        n = extract_turns_parquet(inp, out, memory_limit="1GB")
    elif kind == "loop":
        n = run_loop(Path(inp), Path(out))
    else:
        n = 0
    seconds, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"turns": n, "seconds": seconds, "cpu_seconds": cpu, "peak_rss_mb": peak_mb}))


def _cpu_seconds() -> float:
    # user + system time of this process, all threads: unlike wall time, barely moved by other load on the box
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(kind: str, inp: Path, out: Path, repeats: int = 1) -> dict:
    """Best of `repeats` fresh subprocesses (min wall, min CPU, max peak RSS): the box is shared, and the
    minimum is the run least disturbed by other load."""
    runs = []
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, __file__, "--worker", kind, str(inp), str(out)],
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"turns": runs[0]["turns"], "seconds": min(r["seconds"] for r in runs),
            "cpu_seconds": min(r["cpu_seconds"] for r in runs), "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "repeats": repeats}


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=200_000, help="full-size input (x5 turns)")
    parser.add_argument("--out", default=str(REPO / "bench" / "RESULTS_extraction.md"))
    parser.add_argument("--repeats", type=int, default=3, help="best-of runs for the fast path (loop: 2)")
    parser.add_argument("--worker", nargs=3, metavar=("KIND", "IN", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    full, half = args.trajectories, args.trajectories // 2
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        for n in (half, full):
            write_input(tmp / f"in_{n}.parquet", n)
        gen_s = time.perf_counter() - t0
        results = [("baseline (imports only)", 0, measure("noop", tmp / f"in_{half}.parquet", tmp / "x"))]
        for n in (half, full):
            results.append(("fast path (DuckDB COPY)", n,
                            measure("fast", tmp / f"in_{n}.parquet", tmp / "f.parquet", args.repeats)))
        results.append(("Python loop (extract_turns)", full,
                        measure("loop", tmp / f"in_{full}.parquet", tmp / "l.parquet", min(args.repeats, 2))))
        sizes = {n: (tmp / f"in_{n}.parquet").stat().st_size / 2**20 for n in (half, full)}
    fast_full, loop_full = results[2][2], results[3][2]
    assert fast_full["turns"] == loop_full["turns"] == full * TURNS_PER_TRAJECTORY, (fast_full, loop_full)
    speedup = loop_full["seconds"] / fast_full["seconds"]
    cpu_speedup = loop_full["cpu_seconds"] / fast_full["cpu_seconds"]
    report = render(results, sizes, speedup, cpu_speedup, gen_s, os.getloadavg()[0])
    print(report)
    Path(args.out).write_text(report)


def render(results, sizes, speedup, cpu_speedup, gen_s, load) -> str:
    lines = [
        "# Turn extraction benchmark",
        "",
        f"`.venv/bin/python bench/bench_extraction.py` on {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 1-min load average at the end: {load:.1f} "
        "(the box is shared: wall times stretch under load, CPU seconds much less).",
        f"Input: generated trajectories, {len(TEMPLATE)} messages and {TURNS_PER_TRAJECTORY} assistant turns each "
        f"(tool calls, a 2-call batch, tool results, reasoning); Parquet of {', '.join(f'{v:.0f} MiB' for v in sizes.values())}, "
        f"generated in {gen_s:.0f} s. Each row is the best of fresh subprocesses (min wall, min CPU, max peak RSS = "
        "ru_maxrss of the process).",
        "",
        "| path | trajectories | turns | best of | wall s | turns/s (wall) | CPU s | turns per CPU-s | peak RSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, n, r in results:
        rate = f"{r['turns'] / r['seconds']:,.0f}" if r["turns"] else "-"
        cpu_rate = f"{r['turns'] / r['cpu_seconds']:,.0f}" if r["turns"] else "-"
        lines.append(f"| {name} | {n:,} | {r['turns']:,} | {r['repeats']} | {r['seconds']:.2f} | {rate} | {r['cpu_seconds']:.2f} | "
                     f"{cpu_rate} | {r['peak_rss_mb']:.0f} |")
    lines += ["", f"Fast path vs loop at full size: **{speedup:.1f}x** wall-clock turns/s, **{cpu_speedup:.1f}x** per "
              "CPU-second (target >= 10x; the fast path uses both cores, the loop one). "
              "Fast-path peak RSS at half vs full input size shows whether memory follows the batch size "
              "(DuckDB memory_limit=1GB) rather than the input size.", "",
              "Notes (from a single-thread DuckDB profile on the 500k-turn input, 2026-11-30): of ~2.2 CPU-s, "
              "Parquet decode + filter/unnest of the assistant messages ~0.7 s, md5 turn_id ~0.25 s, the action JSON "
              "~0.35 s, tool_names ~0.25 s, Parquet encode ~0.45 s. The loop is comparatively strong because "
              "`to_pylist` is C++ and `extract_turns` is a few dict operations per message (~20-27 CPU-us per turn). "
              "A pyarrow.compute + numpy version of the fast path (vectorized escaping, Python md5) produced identical "
              "rows at the same CPU cost, so it was not kept. On an idle 2-core box the fast path's two DuckDB "
              "threads would roughly halve its wall time; on this shared box (load ~7) they do not.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
