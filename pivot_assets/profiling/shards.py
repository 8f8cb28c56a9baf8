"""Shards of the profiling tables (Dagster-free): shard = hash(trajectory_id) mod S.

A trajectory's turns always land in one shard, so the prefix a backend reuses between consecutive turns of a
trajectory stays inside one shard run. Shard NNN's parts live under <table>/shard=NNN/; with `scale.shards: 1`
nothing is sharded and the tables keep the single-process layout (<table>/part-*.parquet, turn_profiles.parquet).

The shard count is part of the layout: rows generated under S shards sit in the folders S chose, and another S
would put the same trajectory in another folder (a rerun would then generate it twice). The first profiling run
records S beside the tables (`profiling_layout.json`: in the warehouse dir, or on the object store, where a shard
job on any node sees it); a later run under another S stops with a one-line error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable


from pivot_assets.core.ids import short_hash
from pivot_assets.core.warehouse import Warehouse

LAYOUT_FILE = "profiling_layout.json"
SHARDED_TABLES = ("rollouts", "rollout_rewards", "turn_profiles")
# DuckDB 1.5 and pyarrow read `shard=NNN` folders as a hive partition column (DuckDB: VARCHAR '001', pyarrow:
# dictionary<int32>): every read of a sharded table turns that off, so a table has the same columns whatever S is
# (the shard is a function of trajectory_id, never stored).
PARQUET_OPTIONS = "hive_partitioning = false, union_by_name = true"


def partition_key(shard: int) -> str:
    """The Dagster partition key of a shard: zero-padded like its folder (shard=007 -> '007')."""
    return f"{shard:03d}"


def partition_keys(shards: int) -> list[str]:
    return [partition_key(i) for i in range(shards)]


def shard_of(trajectory_id: str, shards: int) -> int:
    """Stable across processes, machines and Python versions (md5 of the id, not Python's salted hash())."""
    return int(hashlib.md5(trajectory_id.encode("utf-8")).hexdigest()[:15], 16) % shards


def parse_shard(key: str, shards: int) -> int:
    """A partition key ('007' or '7') as a shard number, checked against the configured count."""
    try:
        shard = int(key)
    except ValueError:
        raise ValueError(f"shard {key!r} is not a number (scale.shards is {shards}: 0..{shards - 1})") from None
    if not 0 <= shard < shards:
        raise ValueError(f"shard {key!r} is out of range (scale.shards is {shards}: 0..{shards - 1})")
    return shard


def read_sql(wh: Warehouse, name: str, shard: int | None = None) -> str:
    """`read_parquet(...)` of an incremental table, all shards or one, without the hive shard column."""
    return f"read_parquet('{wh.source_glob(name, shard)}', {PARQUET_OPTIONS})"


def turns_by_trajectory(wh: Warehouse, turn_ids: Iterable[str]) -> dict[str, str]:
    """turn_id -> trajectory_id for the given turns."""
    import pyarrow as pa

    con = wh.duck()
    con.register("wanted", pa.table({"turn_id": pa.array(sorted(set(turn_ids)), pa.string())}))
    rows = con.execute(f"select turn_id, trajectory_id from read_parquet('{wh.table_path('turns')}') "
                       "join wanted using (turn_id)").fetchall()
    con.close()
    return dict(rows)


def shard_turns(wh: Warehouse, turn_ids: list[str], shard: int, shards: int) -> list[str]:
    """The turns of `turn_ids` (kept in order) whose trajectory falls in `shard`."""
    trajectory = turns_by_trajectory(wh, turn_ids)
    return [t for t in turn_ids if shard_of(trajectory[t], shards) == shard]


def shard_data_version(wh: Warehouse, name: str, shard: int) -> str:
    """A shard's content fingerprint: (name, size) of its parts. Part names are keyed, so identical work
    rewritten gives the same version and a shard that gained rows gets a new one."""
    h = hashlib.sha256()
    for p in wh.part_files(name, shard):
        h.update(f"{p.name}:{p.stat().st_size};".encode())
    return h.hexdigest()[:16]


def shard_row_count(wh: Warehouse, name: str, shard: int) -> int:
    if not wh.part_files(name, shard):
        return 0
    with wh.duck() as con:
        return con.sql(f"select count(*) from {read_sql(wh, name, shard)}").fetchone()[0]


def part_key(*fields: str, rows: Iterable[str]) -> str:
    """A deterministic part name for one unit of work: the same rows under the same fingerprints always get the
    same name, so a retried or rerun write overwrites its earlier copy instead of adding a second one."""
    return short_hash("|".join([*fields, *sorted(rows)]))


def check_layout(wh: Warehouse, shards: int) -> None:
    """Record the shard count on the first profiling run; refuse another count later (see module doc)."""
    path = wh.file_path(LAYOUT_FILE)  # beside the tables: shard jobs on other nodes check the same record
    if path.exists():
        recorded = json.loads(path.read_text(encoding="utf-8"))["shards"]
        if recorded != shards:
            raise ValueError(
                f"scale.shards is {shards} but the warehouse {wh.tables_uri} was profiled with shards: {recorded}; "
                f"set shards: {recorded} again, or use a new warehouse for {shards} shards")
        return
    parts = [p for name in SHARDED_TABLES for p in wh.part_files(name)]
    if parts or wh.table_path("turn_profiles").exists():
        # rows from before the layout was recorded: sharded folders, or the single-process layout (shards 1)
        sharded = any(p.parent.name.startswith("shard=") for p in parts)
        if sharded or shards != 1:
            found = "sharded rows of an unrecorded shard count" if sharded else "rows profiled with shards: 1"
            raise ValueError(f"scale.shards is {shards} but the warehouse {wh.tables_uri} holds {found}; "
                             "use a new warehouse (or the shard count it was profiled with)")
    wh.write_text(LAYOUT_FILE, json.dumps({"shards": shards}))  # atomic: shard runs may record it at once
