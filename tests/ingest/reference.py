"""The reference ingest: every record of every input, one at a time, through the library's per-record rules
(ingest/formats/ingest.py). The pipeline streams the same rules in batches (ingest/streaming.py); the tests (and a few
benches) read inputs with this plain loop and check the streaming ingest agrees with it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from pivot_assets.core.catalog import QUARANTINE_SCHEMA, TRAJECTORY_SCHEMA
from pivot_assets.ingest.formats.default_tools import (
    fill_default_tools,
    load_tools_file,
)
from pivot_assets.ingest.formats.ingest import as_input, ingest_record
from pivot_assets.ingest.formats.readers import iter_raw_records


def iter_ingest(inputs: Iterable[Any]) -> Iterator[tuple[str, dict]]:
    """Ingest every record of every input: yields ("trajectory"|"quarantine"|"duplicate", row).

    `inputs` items are objects or dicts with `path` (file, directory or glob), `format` and optional `domain`.
    Identical trajectories (same trajectory_id) are kept once across all inputs. Streams: one file's
    records plus the set of seen ids are held at a time.
    """
    seen: set[str] = set()
    for item in inputs:
        spec = as_input(item)
        default_tools = load_tools_file(spec.tools) if spec.tools else None
        for raw in iter_raw_records(spec.path):
            kind, row = ingest_record(raw, spec.format, spec.domain, spec.answers)
            if kind == "trajectory":
                row = fill_default_tools(row, default_tools)
                if row["trajectory_id"] in seen:
                    kind = "duplicate"
                    row = {"trajectory_id": row["trajectory_id"], "source": row["source"], "record": row["record"]}
                else:
                    seen.add(row["trajectory_id"])
            yield kind, row


def ingest_to_tables(inputs: Iterable[Any]) -> tuple[pa.Table, pa.Table, dict]:
    """Convenience for small inputs and tests: (trajectories, quarantine, counts) held in memory."""
    rows: dict[str, list] = {"trajectory": [], "quarantine": [], "duplicate": []}
    for kind, row in iter_ingest(inputs):
        rows[kind].append(row)
    counts = {k: len(v) for k, v in rows.items()}
    counts["read"] = sum(counts.values())
    return (pa.Table.from_pylist(rows["trajectory"], schema=TRAJECTORY_SCHEMA),
            pa.Table.from_pylist(rows["quarantine"], schema=QUARANTINE_SCHEMA), counts)
