"""Benchmark: checking a warehouse's parts (core/parts.py) against reading them, on one local warehouse.

Usage: .venv/bin/python bench/bench_parts.py [N_PARTS] [ROWS_PER_PART]   (default: 10000 50)
Writes N_PARTS rollouts parts with plain pq.write_table (the baseline) and through Warehouse.append_part (temp
file, rename, record), then times, in one run:
  - baseline: DuckDB counting every row of every part (what any run's first read of the table costs);
  - `pivot check --parts`'s check: footers, records and sha256 of every part;
  - the run's pre-check: footers and records only (what `pivot run` does before it reads anything).
Prints a markdown table.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from pivot_assets.core import parts  # noqa: E402
from pivot_assets.core.catalog import ROLLOUTS_SCHEMA  # noqa: E402
from pivot_assets.core.warehouse import Warehouse  # noqa: E402


def part(rows: int, i: int) -> pa.Table:
    return pa.Table.from_pylist([{"turn_id": f"t{i:06d}-{j}", "trajectory_id": f"x{i}", "policy_fp": "p",
                                  "sampling_fp": "s", "sample_index": j, "completion": f"<tool_call>{i} {j}</tool_call>",
                                  "n_prompt_tokens": 900, "n_completion_tokens": 30, "finish_reason": "stop"}
                                 for j in range(rows)], schema=ROLLOUTS_SCHEMA)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(n_parts: int = 10_000, rows: int = 50) -> None:
    with tempfile.TemporaryDirectory() as d:
        wh = Warehouse(Path(d) / "wh")
        tables = [part(rows, i) for i in range(n_parts)]
        plain = Path(d) / "plain"
        plain.mkdir()
        plain_s, _ = timed(lambda: [pq.write_table(t, plain / f"part-{i}.parquet", compression="zstd")
                                    for i, t in enumerate(tables)])
        write_s, _ = timed(lambda: [wh.append_part("rollouts", t) for t in tables])
        glob = wh.source_glob("rollouts")
        read_s, count = timed(lambda: duckdb.sql(f"select count(*) from read_parquet('{glob}')").fetchone()[0])
        full_s, full = timed(lambda: parts.check_table(wh, "rollouts", checksum=True))
        quick_s, quick = timed(lambda: parts.check_table(wh, "rollouts", checksum=False))
        size = sum(p.stat().st_size for p in wh.part_files("rollouts"))
    assert count == n_parts * rows and not full.problems and not quick.problems
    print(f"{n_parts} parts x {rows} rows ({size / 2**20:.1f} MiB)\n")
    print("| step | seconds | parts/s |\n|---|---:|---:|")
    for name, s in (("baseline: pq.write_table of every part", plain_s),
                    ("Warehouse.append_part (temp file, rename, record)", write_s),
                    ("baseline: DuckDB count(*) over every part", read_s),
                    ("pivot check --parts (footer, record, sha256)", full_s),
                    ("pivot run's pre-check (footer, record)", quick_s)):
        print(f"| {name} | {s:.2f} | {n_parts / s:,.0f} |")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
