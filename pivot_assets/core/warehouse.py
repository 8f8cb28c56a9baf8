"""The warehouse: Parquet files are the storage of record, DuckDB views make them queryable (Dagster-free).

Layout under the warehouse dir:
    <table>.parquet            a whole table, rewritten atomically (temp file, then rename)
    <table>/part-*.parquet     an incremental table: append-only parts, each written atomically, so a
                               crash (even kill -9) loses at most the part being written
    <table>/shard=NNN/part-*.parquet   the same, per shard (`scale.shards` > 1); a part written with a `key`
                               has a deterministic name (part-<key>.parquet), so a rerun overwrites, never duplicates
    pivot.duckdb               one view per table and per sql/*.sql file, plus the macros in sql/*macros.sql
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pivot_assets.core.catalog import SQL_DIR
DUCKDB_FILE = "pivot.duckdb"
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


_KEY = re.compile(r"^[A-Za-z0-9_.=-]+$")


def _check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"invalid part key {key!r}")
    return key


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"invalid table name {name!r}")
    return name


class Warehouse:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    # -- paths ----------------------------------------------------------------------------
    @property
    def duckdb_path(self) -> Path:
        return self.root / DUCKDB_FILE

    def table_path(self, name: str) -> Path:
        return self.root / f"{_check_name(name)}.parquet"

    def parts_dir(self, name: str) -> Path:
        return self.root / _check_name(name)

    def shard_dir(self, name: str, shard: int) -> Path:
        return self.parts_dir(name) / f"shard={shard:03d}"

    def part_files(self, name: str, shard: int | None = None) -> list[Path]:
        """Every part of an incremental table (all shards), or one shard's parts."""
        d = self.parts_dir(name) if shard is None else self.shard_dir(name, shard)
        if not d.is_dir():
            return []
        return sorted(d.glob("part-*.parquet") if shard is not None else
                      [*d.glob("part-*.parquet"), *d.glob("shard=*/part-*.parquet")])

    def model_dir(self, name: str) -> Path:
        """Where a trained policy (an HF model dir) of this warehouse lives: models/<name>."""
        return self.root / "models" / _check_name(name)

    def exists(self, name: str) -> bool:
        return self.table_path(name).exists() or bool(self.part_files(name))

    def source_glob(self, name: str, shard: int | None = None) -> str:
        """What DuckDB's read_parquet should read for this table (or one shard of it)."""
        if self.table_path(name).exists():
            return str(self.table_path(name))
        if shard is not None:
            return str(self.shard_dir(name, shard) / "part-*.parquet")
        return str(self.parts_dir(name) / "**" / "part-*.parquet")

    # -- writes ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def atomic_path(self, final: Path) -> Iterator[Path]:
        """Yield a temp path beside `final`; rename it over `final` only if the block succeeds."""
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            yield tmp
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                tmp.unlink()

    def write_table(self, name: str, table: pa.Table) -> Path:
        final = self.table_path(name)
        with self.atomic_path(final) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        return final

    @contextlib.contextmanager
    def table_writer(self, name: str, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
        """Stream record batches into a whole table; it replaces the old one only when complete."""
        final = self.table_path(name)
        with self.atomic_path(final) as tmp:
            writer = pq.ParquetWriter(tmp, schema, compression="zstd")
            try:
                yield writer
            finally:
                writer.close()

    def append_part(self, name: str, table: pa.Table, shard: int | None = None, key: str | None = None) -> Path:
        """Write one part of an incremental table (atomic: temp file then rename).

        `shard`: under <table>/shard=NNN/. `key`: a deterministic file name (part-<key>.parquet) that a rerun
        of the same work overwrites; without it the name is time-ordered and unique.
        """
        folder = self.parts_dir(name) if shard is None else self.shard_dir(name, shard)
        stem = _check_key(key) if key is not None else f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        final = folder / f"part-{stem}.parquet"
        with self.atomic_path(final) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        return final

    def clean_temp_files(self, name: str) -> int:
        """Remove temp files a killed writer left behind (they are never read)."""
        removed = 0
        shards = list(self.parts_dir(name).glob("shard=*")) if self.parts_dir(name).is_dir() else []
        for d in (self.root, self.parts_dir(name), *shards):
            if d.is_dir():
                for f in d.glob(".tmp-*"):
                    f.unlink(missing_ok=True)
                    removed += 1
        return removed

    def clean_all_temp_files(self) -> int:
        """Temp files and model dirs a killed process left anywhere in the warehouse (none is ever read)."""
        import shutil

        removed = 0
        for f in self.root.rglob(".tmp-*"):
            f.unlink(missing_ok=True)
            removed += 1
        models = self.root / "models"
        for d in (list(models.glob(".*.tmp-*")) + list(models.glob(".*.trainer-*"))) if models.is_dir() else []:
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
        return removed

    # -- reads ----------------------------------------------------------------------------
    def read_arrow(self, name: str, columns: list[str] | None = None) -> pa.Table:
        if self.table_path(name).exists():
            return pq.read_table(self.table_path(name), columns=columns)
        parts = self.part_files(name)
        if not parts:
            raise FileNotFoundError(f"table {name!r} has not been materialized in {self.root}")
        # partitioning=None: a `shard=NNN` folder is a layout, not a column (DuckDB reads below say the same)
        return pq.ParquetDataset([str(p) for p in parts], partitioning=None).read(columns=columns)

    def read(self, name: str, columns: list[str] | None = None):
        import polars as pl

        return pl.from_arrow(self.read_arrow(name, columns))

    def data_version(self, name: str) -> str:
        """A content fingerprint: file bytes for a whole table, (name, size) of parts for a parted one."""
        h = hashlib.sha256()
        if self.table_path(name).exists():
            with open(self.table_path(name), "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
        else:
            for p in self.part_files(name):
                h.update(f"{p.name}:{p.stat().st_size};".encode())
        return h.hexdigest()[:16]

    # -- DuckDB ---------------------------------------------------------------------------
    def tables(self) -> list[str]:
        names = {p.stem for p in self.root.glob("*.parquet")}
        names |= {d.name for d in self.root.iterdir() if d.is_dir() and self.part_files(d.name)}
        return sorted(n for n in names if _NAME.match(n))

    def connect(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        return duckdb.connect(str(self.duckdb_path), read_only=read_only)

    def refresh_views(self) -> dict[str, str]:
        """(Re)create one view per table, then the named sql/ views and macros that bind.

        Returns {view: "ok" | reason} for the sql/ files, so callers can report views that cannot
        exist yet (e.g. pivot statistics before profiling ran).
        """
        status: dict[str, str] = {}
        with self.connect() as con:
            for name in self.tables():
                con.execute(
                    f"create or replace view {name} as "
                    f"select * from read_parquet('{self.source_glob(name)}', union_by_name = true, hive_partitioning = false)"
                )
            for path in sorted(SQL_DIR.glob("*.sql")):
                text = path.read_text(encoding="utf-8")
                try:
                    if path.stem.endswith("macros"):
                        con.execute(text)
                    else:
                        con.execute(f"create or replace view {path.stem} as {_strip_sql(text)}")
                    status[path.stem] = "ok"
                except duckdb.Error as e:
                    status[path.stem] = str(e).splitlines()[0]
        return status


def _strip_sql(text: str) -> str:
    """A named query as a view body: drop a trailing semicolon."""
    return text.strip().rstrip(";").strip()


def named_query(name_or_sql: str) -> str:
    """`pivot sql NAME` runs sql/NAME.sql; anything else is taken as a query."""
    candidate = SQL_DIR / f"{name_or_sql}.sql"
    if _NAME.match(name_or_sql) and candidate.is_file():
        return _strip_sql(candidate.read_text(encoding="utf-8"))
    if _NAME.match(name_or_sql):
        known = ", ".join(sorted(p.stem for p in SQL_DIR.glob("*.sql") if not p.stem.endswith("macros")))
        raise ValueError(f"no query named {name_or_sql!r} in sql/ (known: {known})")
    return name_or_sql
