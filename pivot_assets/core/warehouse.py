"""The warehouse: Parquet files are the storage of record, DuckDB views make them queryable (Dagster-free).

Layout of the tables (under the warehouse dir, or under `s3://bucket/prefix` on any S3-compatible store):
    <table>.parquet            a whole table, replaced atomically (local: temp file, then rename; object store:
                               one object written in one upload, never visible half-written)
    <table>/part-*.parquet     an incremental table: append-only parts, each written atomically, so a
                               crash (even kill -9) loses at most the part being written
    <table>/shard=NNN/part-*.parquet   the same, per shard (`scale.shards` > 1); a part written with a `key`
                               has a deterministic name (part-<key>.parquet), so a rerun overwrites, never duplicates
Local state (always a local dir, `Warehouse.root`; for an object-store warehouse a state dir the config derives
from the bucket and prefix, holding `location.txt` with the URI):
    pivot.duckdb               one view per table and per sql/*.sql file, plus the macros in sql/*macros.sql
    models/ plots/ exports/ eval_cache/ inputs/   trained policies, figures, exports, caches

Object store: endpoint and credentials come only from the standard AWS environment variables
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION); they are never
logged, put in metadata or written to pivot.duckdb (DuckDB gets a temporary, in-memory secret per connection).
DuckDB reads S3 through the httpfs extension from the PyPI package `duckdb-extension-httpfs`, loaded from its
file: nothing is downloaded at run time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pivot_assets.core import parts
from pivot_assets.core.catalog import IMPORTED_PROFILES, IMPORTED_PROFILES_SCHEMA, RULE_COMPARISON, RULE_COMPARISON_SCHEMA
from pivot_assets.core.catalog import SKIPPED_TURNS, SKIPPED_TURNS_SCHEMA, SQL_DIR

# A kill test's named hold point: a process whose environment has PIVOT_HOLD_AFTER_PART=<table> stops for good once
# it has written a part of that table, so a test kills a run mid-table on any model, fast or slow, without racing it.
HOLD_AFTER_PART_ENV = "PIVOT_HOLD_AFTER_PART"


def hold_after_part(table: str) -> None:
    """Wait here until killed when the hold point names `table` (never in a run that does not set it)."""
    while os.environ.get(HOLD_AFTER_PART_ENV) == table:
        time.sleep(3600)

DUCKDB_FILE = "pivot.duckdb"
LOCATION_FILE = "location.txt"  # in an object-store warehouse's local state dir: the s3:// URI of its tables
S3_SCHEME = "s3://"
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_PART = re.compile(r"^part-.*\.parquet$")
# bucket names as S3 allows them (3-63 chars, lowercase, digits, dots, hyphens); a prefix of plain path segments
_S3_URI = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[A-Za-z0-9_.=/-]*)?$")
# a writer holds pivot.duckdb's file lock while it refreshes the views; another process waits this long for it
LOCK_WAIT_S = 60.0


_KEY = re.compile(r"^[A-Za-z0-9_.=-]+$")
_FILE = re.compile(r"^[a-z_][a-z0-9_]*\.json$")


def _check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"invalid part key {key!r}")
    return key


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"invalid table name {name!r}")
    return name


# -- object-store locations ------------------------------------------------------------------------
def is_object_store(location: str | os.PathLike | None) -> bool:
    return str(location or "").startswith(S3_SCHEME)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/prefix -> (bucket, prefix without slashes at either end); a one-line ValueError otherwise."""
    m = _S3_URI.match(uri.rstrip("/") if uri.count("/") > 2 else uri)
    if not m or ".." in uri or "//" in uri[len(S3_SCHEME):]:
        raise ValueError(f"not an S3 warehouse URI: {uri!r} (expected s3://bucket/prefix: a valid bucket name, "
                         "then path segments of letters, digits and _ . = -)")
    return m.group(1), (m.group(2) or "").strip("/")


def bind_state_dir(state_dir: Path, uri: str) -> Path:
    """Make `state_dir` the local state of the object-store warehouse at `uri` (writes location.txt once)."""
    parse_s3_uri(uri)
    state_dir.mkdir(parents=True, exist_ok=True)
    marker = state_dir / LOCATION_FILE
    if not marker.is_file() or marker.read_text(encoding="utf-8").strip() != uri:
        marker.write_text(uri + "\n", encoding="utf-8")
    return state_dir


# quoted in docs/troubleshooting.md (generated from here)
S3_CREDENTIALS_MISSING = ("an s3:// warehouse needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment "
                          "(and AWS_ENDPOINT_URL for a store other than AWS)")


@dataclass(frozen=True)
class S3Settings:
    """Where the store is and who we are, from the standard AWS variables; repr never shows a credential."""

    endpoint: str | None  # host[:port], or None for AWS itself
    scheme: str
    region: str
    key_id: str
    secret: str
    session_token: str | None

    def __repr__(self) -> str:
        return f"S3Settings(endpoint={self.endpoint!r}, scheme={self.scheme!r}, region={self.region!r}, credentials=<from env>)"

    @classmethod
    def from_env(cls, env=os.environ) -> S3Settings:
        key_id, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if not key_id or not secret:
            raise ValueError(S3_CREDENTIALS_MISSING)
        url = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        scheme, endpoint = "https", None
        if url:
            m = re.match(r"^(https?)://([^/?#]+)/?$", url)
            if not m:
                raise ValueError("AWS_ENDPOINT_URL must look like http://host:port or https://host")
            scheme, endpoint = m.group(1), m.group(2)
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        return cls(endpoint, scheme, region, key_id, secret, env.get("AWS_SESSION_TOKEN") or None)

    def filesystem(self):
        from pyarrow import fs

        return fs.S3FileSystem(access_key=self.key_id, secret_key=self.secret, session_token=self.session_token,
                               region=self.region, scheme=self.scheme, endpoint_override=self.endpoint,
                               allow_bucket_creation=False, allow_bucket_deletion=False)

    def duckdb_secret_sql(self) -> str:
        """A TEMPORARY secret: it lives in the connection's memory, never in the database file."""
        q = lambda s: "'" + s.replace("'", "''") + "'"
        fields = [f"KEY_ID {q(self.key_id)}", f"SECRET {q(self.secret)}", f"REGION {q(self.region)}"]
        if self.session_token:
            fields.append(f"SESSION_TOKEN {q(self.session_token)}")
        if self.endpoint:  # a self-hosted store: path-style URLs (bucket in the path, not the host name)
            fields += [f"ENDPOINT {q(self.endpoint)}", "URL_STYLE 'path'", f"USE_SSL {str(self.scheme == 'https').lower()}"]
        return f"CREATE OR REPLACE TEMPORARY SECRET pivot_s3 (TYPE s3, {', '.join(fields)})"


def httpfs_extension_path() -> Path:
    """The httpfs extension shipped by the PyPI package for this exact duckdb version (never downloaded)."""
    try:
        import duckdb_extension_httpfs
    except ImportError:
        raise ValueError(f"an s3:// warehouse needs the DuckDB httpfs extension: "
                         f"pip install duckdb-extension-httpfs=={duckdb.__version__}") from None
    path = Path(duckdb_extension_httpfs.__file__).parent / "extensions" / f"v{duckdb.__version__}" / "httpfs.duckdb_extension"
    if not path.is_file():
        raise ValueError(f"duckdb-extension-httpfs does not match duckdb {duckdb.__version__}: "
                         f"pip install duckdb-extension-httpfs=={duckdb.__version__}")
    return path


def _attach_s3(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    con.execute("SET autoinstall_known_extensions = false")
    con.execute(f"LOAD '{httpfs_extension_path()}'")
    con.execute(S3Settings.from_env().duckdb_secret_sql())
    return con


def _remote(target) -> bool:
    if isinstance(target, Warehouse):
        return target.is_remote
    if isinstance(target, (list, tuple, set)):
        return any(_remote(t) for t in target)
    if isinstance(target, dict):
        return _remote(list(target.values()))
    return is_object_store(target)


def connect_for(target=None, database: str | os.PathLike = ":memory:", *, read_only: bool = False,
                **config) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that can read what `target` names (a Warehouse, a path, a glob or a list of them).

    Every connection that reads warehouse Parquet comes from here: for an s3:// target it loads httpfs from its
    PyPI package and adds a temporary S3 secret from the AWS environment; extensions are never auto-installed
    (downloaded). `config` is DuckDB's (memory_limit, threads, temp_directory, ...). A database file another
    process is writing is waited for (LOCK_WAIT_S): concurrent runs share one pivot.duckdb.
    """
    config = {"autoinstall_known_extensions": False, **config}
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            con = duckdb.connect(str(database), read_only=read_only, config=config)
            break
        except duckdb.IOException as e:
            if "lock" not in str(e).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    if _remote(target):
        try:
            _attach_s3(con)
        except BaseException:
            con.close()
            raise
    return con


_DEFAULT_CONNECTIONS_WITH_S3: set[int] = set()


def _configure_default_connection() -> None:
    """`duckdb.sql(...)` uses a process-wide default connection; give it S3 access once per process."""
    con = duckdb.default_connection()
    if id(con) not in _DEFAULT_CONNECTIONS_WITH_S3:
        _attach_s3(con)
        _DEFAULT_CONNECTIONS_WITH_S3.add(id(con))


class ObjectPath:
    """A file or folder on the object store, with the few pathlib.Path members the stages use.

    str() and os.fspath() give the s3:// URI, which DuckDB (with httpfs) and pyarrow (from the AWS environment)
    both open; exists()/stat() ask the store."""

    __slots__ = ("fs", "key")

    def __init__(self, fs, key: str):
        self.fs, self.key = fs, key.strip("/")

    def __str__(self) -> str:
        return S3_SCHEME + self.key

    __fspath__ = __str__

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectPath) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __lt__(self, other: ObjectPath) -> bool:
        return self.key < other.key

    def __truediv__(self, part: str) -> ObjectPath:
        return ObjectPath(self.fs, f"{self.key}/{part}")

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def stem(self) -> str:
        return self.name.rsplit(".", 1)[0]

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.fs, self.key.rsplit("/", 1)[0])

    def _info(self):
        return self.fs.get_file_info(self.key)

    def exists(self) -> bool:
        from pyarrow import fs

        return self._info().type != fs.FileType.NotFound

    def is_file(self) -> bool:
        from pyarrow import fs

        return self._info().type == fs.FileType.File

    def is_dir(self) -> bool:
        from pyarrow import fs

        return self._info().type == fs.FileType.Directory

    def stat(self) -> os.stat_result:
        info = self._info()
        mtime = info.mtime.timestamp() if info.mtime else 0.0
        return os.stat_result((0, 0, 0, 1, 0, 0, info.size or 0, mtime, mtime, mtime))

    def read_text(self, encoding: str = "utf-8") -> str:
        with self.fs.open_input_stream(self.key) as f:
            return f.read().decode(encoding)

    def etag(self) -> str:
        """The store's content tag (an MD5 for one-part uploads, a deterministic digest of part MD5s otherwise);
        size and modification time where a store gives none."""
        with self.fs.open_input_file(self.key) as f:
            tag = f.metadata().get("ETag")
        if not tag:
            info = self._info()
            return f"{info.size}:{info.mtime_ns}"
        return tag.decode() if isinstance(tag, bytes) else str(tag)


TablePath = Union[Path, ObjectPath]


class Warehouse:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._views_done: dict[str, str] = {}  # refresh_views: the statements run on pivot.duckdb as last seen
        self._views_stamp: tuple | None = None
        marker = self.root / LOCATION_FILE
        self.location = marker.read_text(encoding="utf-8").strip() if marker.is_file() else None
        self._base: TablePath = self.root
        if self.location:
            bucket, prefix = parse_s3_uri(self.location)
            self._base = ObjectPath(S3Settings.from_env().filesystem(), f"{bucket}/{prefix}")
            _configure_default_connection()

    @property
    def is_remote(self) -> bool:
        return self.location is not None

    @property
    def tables_uri(self) -> str:
        """Where the Parquet tables are: the local dir, or the s3:// URI."""
        return str(self._base)

    # -- paths ----------------------------------------------------------------------------
    @property
    def duckdb_path(self) -> Path:
        return self.root / DUCKDB_FILE

    def table_path(self, name: str) -> TablePath:
        return self._base / f"{_check_name(name)}.parquet"

    def parts_dir(self, name: str) -> TablePath:
        return self._base / _check_name(name)

    def shard_dir(self, name: str, shard: int) -> TablePath:
        return self.parts_dir(name) / f"shard={shard:03d}"

    def part_files(self, name: str, shard: int | None = None) -> list[TablePath]:
        """Every part of an incremental table (all shards), or one shard's parts."""
        d = self.parts_dir(name) if shard is None else self.shard_dir(name, shard)
        if isinstance(d, ObjectPath):
            return self._object_parts(d, recursive=shard is None)
        if not d.is_dir():
            return []
        return sorted(d.glob("part-*.parquet") if shard is not None else
                      [*d.glob("part-*.parquet"), *d.glob("shard=*/part-*.parquet")])

    def _object_parts(self, d: ObjectPath, recursive: bool) -> list[ObjectPath]:
        from pyarrow import fs

        infos = d.fs.get_file_info(fs.FileSelector(d.key, recursive=recursive, allow_not_found=True))
        parts = []
        for info in infos:
            rel = info.path[len(d.key) + 1:].split("/")
            if info.type == fs.FileType.File and _PART.match(rel[-1]) and (
                    len(rel) == 1 or (len(rel) == 2 and rel[0].startswith("shard="))):
                parts.append(ObjectPath(d.fs, info.path))
        return sorted(parts)

    def file_path(self, filename: str) -> TablePath:
        """A small record beside the tables (e.g. profiling_layout.json), where every machine that reads or
        writes the tables sees it: the warehouse dir, or the object store (never a node's local state dir)."""
        if not _FILE.match(filename):
            raise ValueError(f"invalid warehouse file name {filename!r}")
        return self._base / filename

    def write_text(self, filename: str, text: str) -> TablePath:
        """Replace a record beside the tables atomically (temp file and rename, or one whole object)."""
        final = self.file_path(filename)
        with self.atomic_path(final) as tmp:
            tmp.write_text(text, encoding="utf-8")
        return final

    def model_dir(self, name: str) -> Path:
        """Where a trained policy (an HF model dir) of this warehouse lives: models/<name> (local state)."""
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
    def atomic_path(self, final: TablePath) -> Iterator[Path]:
        """Yield a local temp path; `final` gets its content only if the block succeeds.

        Local: the temp file sits beside `final` and is renamed over it. Object store: the temp file sits in
        the state dir and is uploaded as one object (a multipart upload becomes visible only when complete),
        so a reader never sees a partial object and a kill -9 leaves the previous one."""
        if isinstance(final, ObjectPath):
            # named after the object's key under the warehouse (rollouts~shard=001~part-x.parquet), so cleaning
            # one table's leftovers never touches another writer's upload
            rel = final.key[len(self._base.key) + 1:].replace("/", "~")
            tmp = self.root / f".tmp-{rel}-{uuid.uuid4().hex[:8]}"
        else:
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            yield tmp
            if isinstance(final, ObjectPath):
                self._upload(tmp, final)
            else:
                os.replace(tmp, final)
        finally:
            if tmp.exists():
                tmp.unlink()

    @staticmethod
    def _upload(local: Path, final: ObjectPath) -> None:
        from pyarrow import fs

        # one C++ call: no Python exception (a signal) can land between the last byte and the upload's completion
        fs.copy_files(str(local), final.key, source_filesystem=fs.LocalFileSystem(), destination_filesystem=final.fs)

    def write_table(self, name: str, table: pa.Table) -> TablePath:
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

    def append_part(self, name: str, table: pa.Table, shard: int | None = None, key: str | None = None) -> TablePath:
        """Write one part of an incremental table (atomic: temp file then rename, or one whole object).

        `shard`: under <table>/shard=NNN/. `key`: a deterministic file name (part-<key>.parquet) that a rerun
        of the same work overwrites; without it the name is time-ordered and unique.
        """
        folder = self.parts_dir(name) if shard is None else self.shard_dir(name, shard)
        stem = _check_key(key) if key is not None else f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        final = folder / f"part-{stem}.parquet"
        # encoded and hashed in memory first: the temp file lives no longer than its write (another run's
        # clean-up of killed writers' temp files never meets it mid-hash)
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer, compression="zstd")
        data = buffer.getvalue().to_pybytes()
        record = parts.record_of(data, name, table.num_rows)
        with self.atomic_path(final) as tmp:
            tmp.write_bytes(data)
        # after the part is in place: a kill in between leaves a part without a record (checked by its footer)
        with self.atomic_path(parts.record_path(final)) as tmp:
            tmp.write_text(json.dumps(record), encoding="utf-8")
        hold_after_part(name)
        return final

    def clean_temp_files(self, name: str, shard: int | None = None) -> int:
        """Remove temp files a killed writer left behind (they are never read): the table's, or with `shard` that
        shard's only (the other shards' runs may be writing theirs at this moment).

        On an object store an upload cut short is never visible; its temp file is in the local state dir."""
        if self.is_remote:
            where = f"{_check_name(name)}~shard={shard:03d}~" if shard is not None else f"{_check_name(name)}~"
            stale = [*self.root.glob(f".tmp-{where}*"),
                     *(self.root.glob(f".tmp-{name}.parquet-*") if shard is None else [])]
            for f in stale:
                f.unlink(missing_ok=True)
            return len(stale)
        removed = 0
        if shard is not None:
            dirs = [self.shard_dir(name, shard)]
        else:
            shards = list(self.parts_dir(name).glob("shard=*")) if self.parts_dir(name).is_dir() else []
            dirs = [self.root, self.parts_dir(name), *shards]
        for d in dirs:
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
        whole = self.table_path(name)
        fs = whole.fs if isinstance(whole, ObjectPath) else None
        where = (lambda p: p.key) if fs is not None else str
        if whole.exists():
            return pq.read_table(where(whole), columns=columns, filesystem=fs)
        parts = self.part_files(name)
        if not parts:
            raise FileNotFoundError(f"table {name!r} has not been materialized in {self.tables_uri}")
        # partitioning=None: a `shard=NNN` folder is a layout, not a column (DuckDB reads say the same)
        return pq.ParquetDataset([where(p) for p in parts], filesystem=fs, partitioning=None).read(columns=columns)

    def read(self, name: str, columns: list[str] | None = None):
        import polars as pl

        return pl.from_arrow(self.read_arrow(name, columns))

    def data_version(self, name: str) -> str:
        """A content fingerprint: file bytes (local) or the object's ETag (object store) for a whole table,
        (name, size) of the parts for a parted one (parts are immutable once written)."""
        h = hashlib.sha256()
        whole = self.table_path(name)
        if isinstance(whole, ObjectPath) and whole.exists():
            h.update(whole.etag().encode())
        elif isinstance(whole, Path) and whole.exists():
            with open(whole, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
        else:
            for p in self.part_files(name):
                rel = str(p)[len(str(self.parts_dir(name))) + 1:]  # shard=NNN/part-x: the shard counts too
                h.update(f"{rel}:{p.stat().st_size};".encode())
        return h.hexdigest()[:16]

    # -- DuckDB ---------------------------------------------------------------------------
    def tables(self) -> list[str]:
        if isinstance(self._base, ObjectPath):
            from pyarrow import fs

            infos = self._base.fs.get_file_info(fs.FileSelector(self._base.key, allow_not_found=True))
            names = {Path(i.path).stem for i in infos if i.type == fs.FileType.File and i.path.endswith(".parquet")}
            names |= {Path(i.path).name for i in infos
                      if i.type == fs.FileType.Directory and _NAME.match(Path(i.path).name)
                      and self.part_files(Path(i.path).name)}
        else:
            names = {p.stem for p in self.root.glob("*.parquet")}
            names |= {d.name for d in self.root.iterdir() if d.is_dir() and _NAME.match(d.name) and self.part_files(d.name)}
        return sorted(n for n in names if _NAME.match(n) and n != parts.DAMAGED_DIR)  # set-aside parts: no table

    def duck(self, **config) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB that reads this warehouse's tables (see connect_for)."""
        return connect_for(self, **config)

    def connect(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        """pivot.duckdb, able to read the tables its views point at."""
        return connect_for(self, self.duckdb_path, read_only=read_only)

    def refresh_views(self) -> dict[str, str]:
        """(Re)create one view per table, then the named sql/ views and macros that bind.

        Returns {view: "ok" | reason} for the sql/ files, so callers can report views that cannot
        exist yet (e.g. pivot statistics before profiling ran). Within one process, a statement this object
        already ran on an untouched pivot.duckdb (same file, size and mtime as after that refresh) is not run
        again: a run's publishes recreate only the views of new tables and the sql/ views that did not bind yet.
        """
        status: dict[str, str] = {}
        untouched = self._views_stamp is not None and self._views_stamp == self._duckdb_stamp()
        done = self._views_done if untouched else {}
        with self.connect() as con:
            for name, statement, named in self._view_statements():
                if done.get(name) == statement:
                    status.update({name: "ok"} if named else {})
                    continue
                try:
                    con.execute(statement)
                except duckdb.Error as e:
                    if not named:
                        raise
                    status[name] = str(e).splitlines()[0]
                    done.pop(name, None)
                    continue
                done[name] = statement
                status.update({name: "ok"} if named else {})
        self._views_done, self._views_stamp = done, self._duckdb_stamp()
        return status

    def _view_statements(self) -> list[tuple[str, str, bool]]:
        """(name, statement, from sql/) in the order they run: the tables' views, then sql/'s macros and views."""
        tables = self.tables()
        # hive_partitioning off: a view's columns are the table's, with no `shard` column inferred from the
        # shard=NNN folders (DuckDB adds one when every part sits in such a folder)
        out = [(name, f"create or replace view {name} as select * from read_parquet('{self.source_glob(name)}', "
                      "union_by_name = true, hive_partitioning = false)", False) for name in tables]
        for name, schema in _EMPTY_WHEN_ABSENT.items():
            if name not in tables:
                columns = ", ".join(f"null::{_DUCK_TYPES[str(f.type)]} as {f.name}" for f in schema)
                out.append((name, f"create or replace view {name} as select {columns} where false", False))
        for path in sorted(SQL_DIR.glob("*.sql")):
            text = path.read_text(encoding="utf-8")
            body = text if path.stem.endswith("macros") else f"create or replace view {path.stem} as {_strip_sql(text)}"
            out.append((path.stem, body, True))
        return out

    def _duckdb_stamp(self) -> tuple | None:
        try:
            st = self.duckdb_path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns


_DUCK_TYPES = {"string": "varchar", "int64": "bigint", "int32": "integer", "bool": "boolean", "double": "double",
               "list<item: double>": "double[]"}
# Tables an sql/ view reads that a warehouse may lack: none skipped (profiled before the prompt guard), no rule
# comparison (selected before the selection rules), no imported profiles (no pivot row arrived profiled); an empty
# view stands in.
_EMPTY_WHEN_ABSENT = {SKIPPED_TURNS: SKIPPED_TURNS_SCHEMA, RULE_COMPARISON: RULE_COMPARISON_SCHEMA,
                      IMPORTED_PROFILES: IMPORTED_PROFILES_SCHEMA}


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
