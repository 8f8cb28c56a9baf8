"""Stage 1 library: the configured inputs -> `trajectories` (canonical) + `quarantine` (every rejected record)."""

from __future__ import annotations

from pathlib import Path

from pivot_assets.core.catalog import QUARANTINE_SCHEMA, TRAJECTORY_SCHEMA
from pivot_assets.core.config import ConfigError, PivotConfig
from pivot_assets.core.ids import canonical_json, short_hash
from pivot_assets.core.warehouse import Warehouse

from .bfcl_records import answers_file
from .formats import load_tools_file

INGEST_VERSION = "4"  # 2: streaming ingest, conversation_id; 3: BFCL, compressed files, tool-call `acceptable`;
# 4: trajectories.environment (BFCL multi-turn worlds)


def resolved_inputs(cfg: PivotConfig) -> list[dict]:
    """The configured inputs with absolute paths (a `tools:` file checked here, with a one-line ConfigError);
    the embedded synthetic sample when none are given."""
    if cfg.inputs:
        return [{**spec.model_dump(), "path": str(cfg.resolve(spec.path)), "tools": _tools_path(cfg, i, spec.tools),
                 "answers": str(cfg.resolve(spec.answers)) if spec.answers else None}
                for i, spec in enumerate(cfg.inputs)]
    from .sample_data import write_sample

    sample = cfg.warehouse_dir / "inputs" / f"embedded_sample_{cfg.sample.n_trajectories}_{cfg.sample.seed}.jsonl"
    if not sample.exists():
        write_sample(sample, n=cfg.sample.n_trajectories, seed=cfg.sample.seed)
    return [{"path": str(sample), "format": "openai", "domain": None, "tools": None, "answers": None}]


def _tools_path(cfg: PivotConfig, index: int, tools: str | None) -> str | None:
    if tools is None:
        return None
    path = cfg.resolve(tools)
    try:
        load_tools_file(path)
    except ValueError as exc:
        raise ConfigError(f"inputs.{index}.tools: {exc}") from None
    return str(path)


def inputs_fingerprint(cfg: PivotConfig) -> str:
    """Code version of ingestion: the input specs plus (name, size, mtime) of every matching file,
    so adding or changing an input file makes `trajectories` stale."""
    import glob

    files = []
    for spec in cfg.inputs or []:
        pattern = str(cfg.resolve(spec.path))
        matches = [pattern] if Path(pattern).is_file() else glob.glob(pattern, recursive=True)
        for m in sorted(matches):
            if Path(m).is_dir():
                paths = sorted(p for p in Path(m).rglob("*") if p.is_file())
            else:  # a file named alone: its BFCL possible answers beside it count too
                paths = [Path(m), *filter(None, [answers_file(m)])]
            files += [(str(p), p.stat().st_size, int(p.stat().st_mtime)) for p in paths]
        for side in (spec.tools, spec.answers):  # an edited tools or answers file re-ingests
            if side and cfg.resolve(side).exists():
                t = cfg.resolve(side)
                side_files = sorted(p for p in t.rglob("*") if p.is_file()) if t.is_dir() else [t]
                files += [(str(p), p.stat().st_size, int(p.stat().st_mtime)) for p in side_files]
    specs = [s.model_dump() for s in cfg.inputs] if cfg.inputs else cfg.sample.model_dump()
    return short_hash(canonical_json({"v": INGEST_VERSION, "specs": specs, "files": files}))


def write_ingest(wh: Warehouse, inputs: list[dict], *, workers: int | None = None) -> dict:
    """Stream every input record into `trajectories` or `quarantine`; returns the counts.

    Bounded memory (streaming.py): units of the input flow through worker processes into two Parquet writers,
    identical trajectories are kept once. Invariant (checked, reported as metadata):
    read = ingested + quarantined + duplicates.
    """
    from .streaming import stream_ingest

    with wh.table_writer("trajectories", TRAJECTORY_SCHEMA) as traj_w, wh.table_writer(
        "quarantine", QUARANTINE_SCHEMA
    ) as quar_w:
        return stream_ingest(inputs, traj_w, quar_w, workers=workers)


def skipped_files_line(skipped: list[dict], shown: int = 50) -> str:
    """The log line naming the files the inputs held that were not read as records, grouped by reason."""
    by_reason: dict[str, list[str]] = {}
    for s in skipped[:shown]:
        by_reason.setdefault(s["reason"], []).append(s["path"])
    names = "; ".join(f"{reason}: {', '.join(paths)}" for reason, paths in by_reason.items())
    more = f"; and {len(skipped) - shown} more (all in the metadata `skipped`)" if len(skipped) > shown else ""
    return f"skipped {len(skipped)} file(s), not read as records: {names}{more}"


def write_turns(wh: Warehouse) -> int:
    """`trajectories` -> `turns` (one streaming DuckDB COPY into a temp file, then renamed or uploaded whole)."""
    from .turn_extraction import extract_turns_parquet

    with wh.atomic_path(wh.table_path("turns")) as tmp:
        return extract_turns_parquet(wh.table_path("trajectories"), tmp)


def action_kind_mix(wh: Warehouse) -> dict[str, int]:
    import duckdb

    return dict(duckdb.sql(
        f"select action_kind, count(*) from read_parquet('{wh.table_path('turns')}') group by 1 order by 1"
    ).fetchall())
