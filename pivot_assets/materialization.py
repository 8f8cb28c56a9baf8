"""What every stage's assets.py uses when it materializes: publishing a table to Dagster (views, row count,
preview, data version), timing the work, the figures a cached rerun reused, and the guard that keeps one run in
flight per shard."""

from __future__ import annotations

import time
from contextlib import contextmanager

import dagster as dg
import polars as pl

from pivot_assets.core.parallel import process_gone
from pivot_assets.core.warehouse import Warehouse


def table_preview(wh: Warehouse, table: str, limit: int = 5) -> str:
    """A markdown preview of a table, for asset metadata."""
    con = wh.connect(read_only=True)
    try:
        df = con.sql(f"select * from {table} limit {int(limit)}").pl()
    finally:
        con.close()
    cols = preview_columns(df)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.select(cols).iter_rows():
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


def preview_columns(df: pl.DataFrame, limit: int = 10) -> list[str]:
    """What a reader scans first: the row's id, then the figures, then the other text. Scalar columns only (nested
    messages or lists make an unreadable preview), and no fingerprints (`*_fp`: long hashes that push the figures
    off the right edge)."""
    scalar = [c for c in df.columns if (df[c].dtype.is_numeric() or df[c].dtype == pl.Utf8) and not c.endswith("_fp")]
    ids = [c for c in scalar if c.endswith("_id")][:1]
    numbers = [c for c in scalar if df[c].dtype.is_numeric()]
    return (ids + numbers + [c for c in scalar if c not in ids and c not in numbers])[:limit]


def _cell(v) -> str:
    s = "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
    s = s.replace("|", "\\|").replace("\n", " ")
    return s if len(s) <= 60 else s[:57] + "..."


def publish(
    wh: Warehouse,
    table: str,
    metadata: dict | None = None,
    *,
    preview: bool = True,
    asset: str | None = None,
    data_version: str | None = None,
) -> dg.MaterializeResult:
    """Refresh the DuckDB views and describe a freshly written table to Dagster.

    The data version is a content fingerprint of the table, so downstream assets go stale only when
    the data really changed (a rerun that writes identical rows keeps them fresh). A model asset
    describes its side table (e.g. `sft_policy` -> `sft_steps`) and is versioned by its model key.
    """
    wh.refresh_views()
    con = wh.connect(read_only=True)
    try:
        n_rows = con.sql(f"select count(*) from {table}").fetchone()[0]
    finally:
        con.close()
    md = {
        "dagster/row_count": dg.MetadataValue.int(int(n_rows)),
        "path": dg.MetadataValue.path(wh.source_glob(table)),
        "sql": dg.MetadataValue.md(f"`duckdb {wh.duckdb_path} -c \"select * from {table} limit 10\"`"),
    }
    if preview and n_rows:
        md["preview"] = dg.MetadataValue.md(table_preview(wh, table))
    for k, v in (metadata or {}).items():
        md[k] = v
    return dg.MaterializeResult(
        asset_key=asset or table,
        metadata=md,
        data_version=dg.DataVersion(data_version or wh.data_version(table)),
    )


@contextmanager
def timed():
    """Yields a dict whose 'seconds' is filled in when the block ends."""
    out: dict = {}
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out["seconds"] = time.perf_counter() - t0


def number_table(rows: dict[str, float | int], name: str = "stage", value: str = "turns") -> dg.MetadataValue:
    """A two-column table for the UI (a funnel, counts by reason), numbers typed, not strings."""
    return dg.MetadataValue.table(
        [dg.TableRecord({name: k, value: v}) for k, v in rows.items()],
        schema=dg.TableSchema([dg.TableColumn(name, "string"),
                               dg.TableColumn(value, "int" if all(isinstance(v, int) for v in rows.values()) else "float")]),
    )


def reused_figures(context: dg.AssetExecutionContext, keys: tuple[str, ...]) -> dict:
    """The figures of the work a cached rerun reused (from this asset's last materialization), marked as such,
    so a rerun that computes nothing keeps showing what that work cost instead of zeros."""
    event = context.instance.get_latest_materialization_event(context.asset_key)
    meta = event.asset_materialization.metadata if event and event.asset_materialization else {}
    out = {k: meta[k] for k in keys if k in meta}
    if out:
        out["reused_from_run"] = dg.MetadataValue.text(event.run_id)
    return out


# -- shard runs ----------------------------------------------------------------------------------------------
# A shard's run never touches pivot.duckdb (one writer: the unpartitioned steps refresh its views), so shard
# runs can be in flight at once. Its data version is the shard's own content fingerprint.
SHARD_TAG = "dagster/partition"  # Dagster tags every partition run with it; the run queue limit keys on it
# The process a run of `pivot run` executes in (core.parallel.process_token): a later run can tell it is gone.
PROCESS_TAG = "pivot/process"


def require_only_run_of_shard(context: dg.AssetExecutionContext) -> None:
    """One run in flight per shard: a second run of the same shard stops before writing anything.

    Both runs are registered (STARTED) before their first step, so of two that start together each sees the
    other and neither writes (never both). The instance's run queue limit on SHARD_TAG (docs/scale.md) keeps the
    UI's and the daemon's runs from getting this far. A run of `pivot run` whose process is gone (killed with no
    chance to record its end: kill -9, a lost machine) is marked canceled here instead of blocking the shard."""
    in_flight = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)
    others = [r for r in context.instance.get_runs(
        filters=dg.RunsFilter(tags={SHARD_TAG: context.partition_key}, statuses=list(in_flight)))
        if r.run_id != context.run_id]
    for run in [r for r in others if _process_gone(r)]:
        context.log.warning(f"run {run.run_id} of shard {context.partition_key} lost its process "
                            f"({run.tags[PROCESS_TAG]}): marked canceled")
        context.instance.report_run_canceled(run, message="its process is gone (killed)")
        others.remove(run)
    if others:
        raise RuntimeError(f"shard {context.partition_key} already has run {others[0].run_id} in flight; wait for "
                           "it (or, if its process is gone, terminate it in the Dagster UI) and run again")


def _process_gone(run: dg.DagsterRun) -> bool:
    token = run.tags.get(PROCESS_TAG)
    return token is not None and process_gone(token)