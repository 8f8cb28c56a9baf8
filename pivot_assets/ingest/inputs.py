"""Stage 1 library: the configured inputs -> `trajectories` (canonical) + `quarantine` (every rejected record)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa

from pivot_assets.core.catalog import QUARANTINE_SCHEMA, TRAJECTORY_SCHEMA
from pivot_assets.core.config import PivotConfig
from pivot_assets.core.ids import canonical_json, short_hash
from pivot_assets.core.warehouse import Warehouse

BATCH_ROWS = 2048
INGEST_VERSION = "1"


def resolved_inputs(cfg: PivotConfig) -> list[dict]:
    """The configured inputs with absolute paths; the embedded synthetic sample when none are given."""
    if cfg.inputs:
        return [{**spec.model_dump(), "path": str(cfg.resolve(spec.path))} for spec in cfg.inputs]
    from .sample_data import write_sample

    sample = cfg.warehouse_dir / "inputs" / f"embedded_sample_{cfg.sample.n_trajectories}_{cfg.sample.seed}.jsonl"
    if not sample.exists():
        write_sample(sample, n=cfg.sample.n_trajectories, seed=cfg.sample.seed)
    return [{"path": str(sample), "format": "openai", "domain": None}]


def inputs_fingerprint(cfg: PivotConfig) -> str:
    """Code version of ingestion: the input specs plus (name, size, mtime) of every matching file,
    so adding or changing an input file makes `trajectories` stale."""
    import glob

    files = []
    for spec in cfg.inputs or []:
        pattern = str(cfg.resolve(spec.path))
        matches = [pattern] if Path(pattern).is_file() else glob.glob(pattern, recursive=True)
        for m in sorted(matches):
            paths = sorted(p for p in Path(m).rglob("*") if p.is_file()) if Path(m).is_dir() else [Path(m)]
            files += [(str(p), p.stat().st_size, int(p.stat().st_mtime)) for p in paths]
    specs = [s.model_dump() for s in cfg.inputs] if cfg.inputs else cfg.sample.model_dump()
    return short_hash(canonical_json({"v": INGEST_VERSION, "specs": specs, "files": files}))


def write_ingest(wh: Warehouse, inputs: list[dict]) -> dict:
    """Stream every input record into `trajectories` or `quarantine`; returns the counts.

    Invariant (checked here, reported as metadata): read = ingested + quarantined + duplicates.
    """
    from .formats import iter_ingest

    counts: Counter = Counter()
    by_format: Counter = Counter()
    by_reason: Counter = Counter()
    buffers: dict[str, list[dict]] = {"trajectory": [], "quarantine": []}
    with wh.table_writer("trajectories", TRAJECTORY_SCHEMA) as traj_w, wh.table_writer(
        "quarantine", QUARANTINE_SCHEMA
    ) as quar_w:
        writers = {"trajectory": (traj_w, TRAJECTORY_SCHEMA), "quarantine": (quar_w, QUARANTINE_SCHEMA)}

        def flush(kind: str) -> None:
            if buffers[kind]:
                writer, schema = writers[kind]
                writer.write_table(pa.Table.from_pylist(buffers[kind], schema=schema))
                buffers[kind].clear()

        for kind, row in iter_ingest(inputs):
            counts["read"] += 1
            counts[kind] += 1
            if kind == "trajectory":
                by_format[row["source_format"]] += 1
            elif kind == "quarantine":
                by_reason[row["reason"].split(":", 1)[0]] += 1
            if kind in buffers:
                buffers[kind].append(row)
                if len(buffers[kind]) >= BATCH_ROWS:
                    flush(kind)
        flush("trajectory")
        flush("quarantine")
    assert counts["read"] == counts["trajectory"] + counts["quarantine"] + counts["duplicate"]
    return {
        "read": counts["read"],
        "ingested": counts["trajectory"],
        "quarantined": counts["quarantine"],
        "duplicates": counts["duplicate"],
        "by_format": dict(by_format),
        "quarantine_reasons": dict(by_reason),
    }


def write_turns(wh: Warehouse) -> int:
    """`trajectories` -> `turns` (one streaming DuckDB COPY, written to a temp file and renamed)."""
    from .turn_extraction import extract_turns_parquet

    return extract_turns_parquet(wh.table_path("trajectories"), wh.table_path("turns"))


def action_kind_mix(wh: Warehouse) -> dict[str, int]:
    import duckdb

    return dict(duckdb.sql(
        f"select action_kind, count(*) from read_parquet('{wh.table_path('turns')}') group by 1 order by 1"
    ).fetchall())
