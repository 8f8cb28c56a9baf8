"""Stage 1: raw trajectory files -> `trajectories` (canonical) + `quarantine` (every rejected record)."""


from collections import Counter
from pathlib import Path

import dagster as dg
import pyarrow as pa

from pivot_assets.config import PivotConfig
from pivot_assets.resources import PivotSettings, publish, timed
from pivot_assets.schema import canonical_json, short_hash
from pivot_assets.warehouse import Warehouse

BATCH_ROWS = 2048
INGEST_VERSION = "1"


def resolved_inputs(cfg: PivotConfig) -> list[dict]:
    """The configured inputs with absolute paths; the embedded synthetic sample when none are given."""
    if cfg.inputs:
        return [{**spec.model_dump(), "path": str(cfg.resolve(spec.path))} for spec in cfg.inputs]
    from pivot_assets.sample_data import write_sample

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
    from pivot_assets.formats import QUARANTINE_SCHEMA, TRAJECTORY_SCHEMA, iter_ingest

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


INGEST_TABLES = {
    "trajectories": "Canonical trajectories (one row per unique trajectory; content-hash id).",
    "quarantine": "Every input record that could not be ingested, with its reason and raw text.",
}


def build_ingest_assets(cfg: PivotConfig) -> list:
    version = inputs_fingerprint(cfg)

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(name, group_name="ingest", code_version=version, description=text, kinds={"parquet", "duckdb"})
            for name, text in INGEST_TABLES.items()
        ],
        can_subset=False,
    )
    def ingest(context: dg.AssetExecutionContext, settings: PivotSettings):
        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        inputs = resolved_inputs(cfg)
        with timed() as t:
            counts = write_ingest(wh, inputs)
        context.log.info(
            f"read {counts['read']} records: {counts['ingested']} ingested, "
            f"{counts['quarantined']} quarantined, {counts['duplicates']} duplicates in {t['seconds']:.1f}s"
        )
        yield publish(
            wh,
            "trajectories",
            {
                "read": counts["read"],
                "ingested": counts["ingested"],
                "quarantined": counts["quarantined"],
                "duplicates": counts["duplicates"],
                "by_format": dg.MetadataValue.json(counts["by_format"]),
                "inputs": dg.MetadataValue.json([i["path"] for i in inputs]),
                "seconds": round(t["seconds"], 2),
            },
        )
        yield publish(
            wh, "quarantine", {"reasons": dg.MetadataValue.json(counts["quarantine_reasons"])}
        )

    return [ingest]
