"""Streaming ingest: the configured inputs -> bounded work units -> rows in input order -> dedup -> Parquet.

Memory follows the unit size, not the input (Dagster-free):
  - the input is cut into units: a JSONL file (and a .json file holding JSON Lines) into byte ranges of whole
    lines (UNIT_BYTES), a compressed one into blocks of whole decompressed lines read here and carried by the unit
    (a compressed stream cannot be cut by offset), a Parquet file into row groups, a Hugging Face dataset into row
    ranges (UNIT_RECORDS), a .json document is one unit (memory follows the largest such file);
  - each unit is processed on its own, in worker processes when the input is large enough to pay for them:
    JSONL lines go through the DuckDB chat adapter (chat_sql.py) and whatever it hands back, like every record
    of the other readers (formats/readers.py, reading the unit's range), through the Python adapters of the
    formats package (the reference), which return a row or a quarantine reason; at most `workers + 1` units are
    in flight;
  - the parent takes unit results in input order, drops trajectories whose content hash it has seen (the only
    state that grows: one short id per distinct trajectory) and streams both tables into Parquet.
Invariant, per unit and in total: read = ingested + quarantined + duplicates. Files a directory holds that are
not data are skipped, each named with its reason in the counts (`skipped`); an input that yields no record at all
fails the ingest with one line (NoRecordsError).
"""

from __future__ import annotations

import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pivot_assets.core.catalog import QUARANTINE_SCHEMA, TRAJECTORY_SCHEMA

from . import files, formats
from .formats import readers, registry

UNIT_BYTES = 4 << 20  # JSONL bytes per unit: amortizes ~25 ms of fixed cost per unit; a unit takes ~20x its bytes in a worker
WORKERS_FROM_UNITS = 64  # an input of fewer units is adapted in the parent (default_workers)
UNIT_RECORDS = 2048  # records per unit for the row readers (Parquet row groups are merged up to this)
SQL_FORMATS = ("auto", "openai")  # inputs whose JSONL lines the DuckDB chat adapter may take
# The formats chat_sql.py knows (it hands back the lines they detect): with another one registered, an auto input's
# line could be that format's, so auto inputs then take the Python path only (slower, never different).
SQL_KNOWN_FORMATS = frozenset({"openai", "responses", "tau2", "sharegpt", "bfcl", "bfcl_multi_turn"})
BLANK = b" \t\n\r\x0b\x0c"  # what bytes.strip() removes: a line of only these is no record


@dataclass(frozen=True)
class Unit:
    """One bounded piece of one input file."""

    kind: str  # "jsonl" (byte range), "parquet" (row groups), "hf" (row range), "json" (whole file)
    path: str
    fmt: str
    domain: str | None
    offset: int = 0  # jsonl: first byte; parquet: first row group; hf: first row
    length: int = 0  # jsonl: bytes; parquet: row groups; hf: rows
    first_record: int = 0  # record number of the unit's first line / row
    tools: str | None = None  # the input's `tools:` file, for records without tools
    answers: str | None = None  # the input's BFCL answers (None: beside each file)
    input: int = 0  # index of the configured input the unit belongs to
    data: bytes | None = field(default=None, repr=False)  # jsonl: the lines themselves (a compressed file)
    # modules of the formats registered from outside the formats package: a spawned worker imports them too
    format_modules: tuple[str, ...] = ()


class NoRecordsError(ValueError):
    """A configured input that yields no record (the one-line message names it and what was skipped)."""


@dataclass
class UnitResult:
    trajectories: pa.Table  # candidates (before dedup), in record order
    quarantine: pa.Table
    read: int  # records read (non-blank lines, rows, JSON elements)
    by_path: Counter = field(default_factory=Counter)  # "sql" / "python": how the accepted rows were adapted
    input: int = 0  # the configured input the unit belongs to


# ---------------------------------------------------------------------------------------------- planning


def plan_units(inputs: Iterable, unit_bytes: int = UNIT_BYTES, unit_records: int = UNIT_RECORDS,
               skipped: list | None = None) -> Iterator[Unit]:
    """Units of every input in input order (paths expanded as formats.scan_paths does); the files a directory
    holds that are not data are appended to `skipped` as (input index, path, reason)."""
    for index, item in enumerate(inputs):
        spec = formats.as_input(item)
        paths, skips = readers.scan_paths(spec.path)
        if skipped is not None:
            skipped.extend((index, path, reason) for path, reason in skips)
        for path in paths:
            yield from _file_units(path, spec, index, unit_bytes, unit_records)


def _file_units(path: Path, spec: formats.Input, index: int, unit_bytes: int, unit_records: int) -> Iterator[Unit]:
    common = {"path": str(path), "fmt": spec.format, "domain": spec.domain, "tools": spec.tools,
              "answers": spec.answers, "input": index, "format_modules": registry.outside_modules()}
    kind = None if path.is_dir() else files.data_kind(path)
    if path.is_dir():
        n_rows = _hf_rows(path)
        for start in range(0, n_rows, unit_records):
            yield Unit("hf", offset=start, length=min(unit_records, n_rows - start), first_record=start, **common)
    elif kind == "jsonl" or (kind == "json" and files.json_layout(path) == "lines"):
        yield from (_inline_jsonl_units if files.compression(path) else _jsonl_units)(path, common, unit_bytes)
    elif kind == "parquet":
        yield from _parquet_units(path, common, unit_records)
    else:
        yield Unit("json", **common)


def _jsonl_units(path: Path, common: dict, unit_bytes: int) -> Iterator[Unit]:
    """Byte ranges of whole lines; the parent reads each range once to count its lines (the record numbers)."""
    offset, line = 0, 0
    with open(path, "rb") as f:
        while True:
            block = f.read(unit_bytes)
            if not block:
                return
            end = block.rfind(b"\n") + 1
            if end == 0:  # a line longer than the unit: extend to its end
                rest = f.readline()
                block, end = block + rest, len(block) + len(rest)
            f.seek(offset + end)
            yield Unit("jsonl", offset=offset, length=end, first_record=line, **common)
            line += block.count(b"\n", 0, end)
            offset += end


def _inline_jsonl_units(path: Path, common: dict, unit_bytes: int) -> Iterator[Unit]:
    """A compressed JSON Lines file: blocks of whole decompressed lines, carried by the units (read lazily, as the
    stream asks for units: at most the units in flight are held)."""
    line, rest = 0, b""
    with files.open_binary(path) as f:
        while block := f.read(unit_bytes):
            data = rest + block
            end = data.rfind(b"\n") + 1
            if end == 0:  # a line longer than the unit: read on to its end
                rest = data
                continue
            yield Unit("jsonl", length=end, first_record=line, data=data[:end], **common)
            line += data.count(b"\n", 0, end)
            rest = data[end:]
    if rest:
        yield Unit("jsonl", length=len(rest), first_record=line, data=rest, **common)


def _parquet_units(path: Path, common: dict, unit_records: int) -> Iterator[Unit]:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    group, record = 0, 0
    while group < meta.num_row_groups:
        first, rows = group, 0
        while group < meta.num_row_groups and (rows == 0 or rows + meta.row_group(group).num_rows <= unit_records):
            rows += meta.row_group(group).num_rows
            group += 1
        yield Unit("parquet", offset=first, length=group - first, first_record=record, **common)
        record += rows


def _hf_rows(path: Path) -> int:
    return sum(len(split) for split in readers.hf_splits(path))


# ---------------------------------------------------------------------------------------------- one unit


def run_unit(unit: Unit) -> UnitResult:
    """Adapt every record of one unit: trajectory rows (not yet deduplicated) and quarantine rows. Records without
    tools get the input's `tools:` file here, before dedup sees their ids (as the reference loop, tests/ingest/reference.py, does)."""
    registry.load(unit.format_modules)
    result = _run_jsonl(unit) if unit.kind == "jsonl" else _adapt_in_python(_unit_records(unit), unit)
    result.input = unit.input
    if unit.tools:
        stat = os.stat(unit.tools)
        tools = _tools(unit.tools, stat.st_mtime_ns, stat.st_size)
        result.trajectories = formats.with_default_tools(result.trajectories, {unit.path: tools})
    return result


@lru_cache(maxsize=16)
def _tools(path: str, mtime_ns: int, size: int) -> list[dict]:
    """A tools file, read once per version (a long-lived process sees an edited file)."""
    return formats.load_tools_file(path)


def _run_jsonl(unit: Unit) -> UnitResult:
    data = unit.data
    if data is None:
        with open(unit.path, "rb") as f:
            f.seek(unit.offset)
            data = f.read(unit.length)
    lines = split_lines(data, unit.first_record)
    accepted = _sql_rows(lines, unit) if _sql_may_take(unit.fmt) and lines.num_rows else None
    numbers = lines.column("line_no").to_numpy()
    handed_back = ~np.isin(numbers, accepted.column("record").to_numpy()) if accepted is not None else np.ones(len(numbers), bool)
    starts, ends = lines.column("start").to_numpy(), lines.column("end").to_numpy()
    rest = [readers.jsonl_record(unit.path, int(numbers[i]), data[starts[i]:ends[i]]) for i in np.flatnonzero(handed_back)]
    result = _adapt_in_python(rest, unit, read=lines.num_rows)
    if accepted is not None and accepted.num_rows:
        result.trajectories = _in_record_order(accepted, result.trajectories)
        result.by_path["sql"] += accepted.num_rows
    return result


def _sql_may_take(fmt: str) -> bool:
    """Whether the DuckDB chat adapter may take an input's lines (it hands back what it cannot prove openai)."""
    return fmt == "openai" or (fmt in SQL_FORMATS and set(registry.names()) <= SQL_KNOWN_FORMATS)


def _in_record_order(accepted: pa.Table, adapted: pa.Table) -> pa.Table:
    """Both adapters' rows merged in record order (dedup keeps the first occurrence, as the reference does)."""
    if adapted.num_rows == 0 and bool(np.all(np.diff(accepted.column("record").to_numpy()) > 0)):
        return accepted  # the common case: nothing handed back, already in line order (no copy)
    both = pa.concat_tables([accepted, adapted])
    return both.take(pc.sort_indices(both.column("record")))


def split_lines(data: bytes, first_line: int) -> pa.Table:
    """(line_no, start, end, line) of every non-blank line of `data` (whole lines; the text keeps its newline,
    as Python's binary line iteration does). A line that is not valid UTF-8 gets line = null."""
    buf = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(buf == 10) + 1
    if len(data) and (not len(ends) or ends[-1] != len(data)):
        ends = np.append(ends, len(data))
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    table = pa.table({"line_no": np.arange(first_line, first_line + len(ends), dtype=np.int64), "start": starts,
                      "end": ends.astype(np.int64), "line": _text_column(data, starts, ends)})
    keep = _non_blank(buf, starts, ends)
    return table if keep.all() else table.filter(pa.array(keep))


def _non_blank(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    # Most lines start with "{": only the others are checked byte by byte.
    keep = np.ones(len(starts), bool)
    for i in np.flatnonzero(buf[starts] != ord("{")) if len(starts) else []:
        keep[i] = bool(bytes(buf[starts[i]:ends[i]]).strip(BLANK))
    return keep


def _text_column(data: bytes, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The lines (contiguous) as a large_string array: zero-copy over `data` when it is valid UTF-8; else the
    invalid lines are null (formats.jsonl_record quarantines them as non_utf8)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        texts = []
        for a, b in zip(starts, ends):
            try:
                texts.append(data[a:b].decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(None)
        return pa.array(texts, pa.large_string())
    offsets = np.append(starts, ends[-1:] if len(ends) else [0]).astype(np.int64)
    return pa.LargeStringArray.from_buffers(len(starts), pa.py_buffer(offsets), pa.py_buffer(data))


def _sql_rows(lines: pa.Table, unit: Unit) -> pa.Table:
    """The lines the DuckDB chat adapter accepts, as TRAJECTORY_SCHEMA rows."""
    from . import chat_sql

    usable = lines.filter(pc.is_valid(lines.column("line")))
    rows = chat_sql.accepted_records(_connection(), usable.select(["line_no", "line"]))
    n = rows.num_rows
    domain = (pa.array([unit.domain] * n, pa.string()) if unit.domain
              else pc.fill_null(rows.column("record_domain"), "default"))
    return pa.table({
        "trajectory_id": rows.column("trajectory_id"),
        "source": pa.array([unit.path] * n, pa.string()),
        "record": rows.column("line_no"),
        "source_format": rows.column("source_format"),
        "domain": domain,
        "messages": rows.column("messages"),
        "tools": rows.column("tools"),
        "outcome_reward": rows.column("outcome_reward"),
        "conversation_id": rows.column("conversation_id"),
        "environment": pa.nulls(n, pa.string()),  # the chat formats it adapts carry no executable environment
    }).cast(TRAJECTORY_SCHEMA)


_CONNECTION = None


def _connection():
    """One DuckDB connection per process, single-threaded: parallelism comes from the worker processes."""
    global _CONNECTION
    if _CONNECTION is None:
        from . import chat_sql

        _CONNECTION = chat_sql.connect(threads=1)
    return _CONNECTION


def _unit_records(unit: Unit) -> Iterator[formats.RawRecord]:
    """The records of a json, parquet or hf unit, read by the reference readers over the unit's range."""
    path = Path(unit.path)
    if unit.kind == "json":
        yield from readers.read_json(path)
    elif unit.kind == "parquet":
        groups = list(range(unit.offset, unit.offset + unit.length))
        yield from readers.read_parquet(path, row_groups=groups, first_record=unit.first_record)
    elif unit.kind == "hf":
        yield from readers.read_hf_dataset(path, start=unit.offset, stop=unit.offset + unit.length)


def _adapt_in_python(records: Iterable[formats.RawRecord], unit: Unit, read: int | None = None) -> UnitResult:
    """The reference adapters, one record at a time: (row or reason) each."""
    rows: dict[str, list] = {"trajectory": [], "quarantine": []}
    n = 0
    for raw in records:
        kind, row = formats.ingest_record(raw, unit.fmt, unit.domain, unit.answers)
        rows[kind].append(row)
        n += 1
    return UnitResult(
        trajectories=pa.Table.from_pylist(rows["trajectory"], schema=TRAJECTORY_SCHEMA),
        quarantine=pa.Table.from_pylist(rows["quarantine"], schema=QUARANTINE_SCHEMA),
        read=n if read is None else read,
        by_path=Counter({"python": len(rows["trajectory"])}),
    )


# ---------------------------------------------------------------------------------------------- the stream


def unit_results(units: Iterable[Unit], workers: int) -> Iterator[UnitResult]:
    """Results in unit order; with workers > 1, at most workers + 1 units in flight in spawned processes."""
    if workers <= 1:
        for unit in units:
            yield run_unit(unit)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: the parent may be a threaded Dagster process, which must not be forked
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: deque = deque()
        for unit in units:
            pending.append(pool.submit(run_unit, unit))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


class Deduplicator:
    """Keeps the first row of each trajectory_id across the whole input; holds only the ids seen."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def first_occurrences(self, table: pa.Table) -> tuple[pa.Table, int]:
        keep = []
        for tid in table.column("trajectory_id").to_pylist():
            keep.append(tid not in self.seen)
            self.seen.add(tid)
        mask = pa.array(keep, pa.bool_())
        return table.filter(mask), len(keep) - sum(keep)


def default_workers(inputs: list, unit_bytes: int = UNIT_BYTES) -> int:
    """Worker processes for an input: one per core ($PIVOT_INGEST_WORKERS caps it), none below WORKERS_FROM_UNITS
    units: a worker costs a second to start and ~300 MB, and the parent's own share (dedup, Parquet) leaves little
    to gain below that (35k sample trajectories, 90 MB: 6.3 s in the parent, 5.6 s with 2 workers, at 482 vs 953 MB
    peak on 2 cores)."""
    total = 0
    for item in inputs:
        for path in readers.expand_paths(formats.as_input(item).path):  # compressed files count as stored
            total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
    if total < WORKERS_FROM_UNITS * unit_bytes:
        return 1
    return max(1, min(os.cpu_count() or 1, int(os.environ.get("PIVOT_INGEST_WORKERS", "64"))))


def stream_ingest(inputs: list, trajectory_writer, quarantine_writer, *, workers: int | None = None,
                  unit_bytes: int = UNIT_BYTES) -> dict:
    """Write every input record to `trajectory_writer` or `quarantine_writer` (pyarrow ParquetWriter-likes);
    returns the counts: read, ingested, quarantined, duplicates, by_format, quarantine_reasons, by_adapter."""
    workers = default_workers(inputs, unit_bytes) if workers is None else workers
    dedup = Deduplicator()
    counts: Counter = Counter()
    by_format: Counter = Counter()
    reasons: Counter = Counter()
    by_adapter: Counter = Counter()
    read_by_input: Counter = Counter()
    skipped: list[tuple[int, str, str]] = []
    for result in unit_results(plan_units(inputs, unit_bytes, skipped=skipped), workers):
        if result.read != result.trajectories.num_rows + result.quarantine.num_rows:
            raise RuntimeError(f"ingest lost records in a unit: read {result.read}, adapted "
                               f"{result.trajectories.num_rows + result.quarantine.num_rows}")
        kept, duplicates = dedup.first_occurrences(result.trajectories)
        if kept.num_rows:
            trajectory_writer.write_table(kept)
        if result.quarantine.num_rows:
            quarantine_writer.write_table(result.quarantine)
        counts.update(read=result.read, ingested=kept.num_rows, quarantined=result.quarantine.num_rows,
                      duplicates=duplicates)
        by_format.update(_value_counts(kept.column("source_format")))
        reasons.update(_value_counts(_categories(result.quarantine)))
        by_adapter.update(result.by_path)
        read_by_input[result.input] += result.read
    if counts["read"] != counts["ingested"] + counts["quarantined"] + counts["duplicates"]:
        raise RuntimeError(f"ingest counts do not add up: {dict(counts)}")
    for index, item in enumerate(inputs):
        if read_by_input[index] == 0:
            raise NoRecordsError(no_records_message(index, formats.as_input(item).path,
                                                    [(p, r) for i, p, r in skipped if i == index]))
    return {"read": counts["read"], "ingested": counts["ingested"], "quarantined": counts["quarantined"],
            "duplicates": counts["duplicates"], "by_format": dict(by_format), "quarantine_reasons": dict(reasons),
            "by_adapter": dict(by_adapter), "workers": workers,
            "skipped": [{"path": path, "reason": reason} for _, path, reason in skipped]}


def no_records_message(index: int, path: str, skipped: list[tuple[str, str]]) -> str:
    """One line: which input gave no record, and what was skipped in it."""
    if not skipped:
        return f"inputs.{index} ({path}): no records in it (no data file, or only empty ones)"
    shown = "; ".join(f"{Path(p).name}: {reason}" for p, reason in skipped[:5])
    more = f"; and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    return f"inputs.{index} ({path}): no records in it; {len(skipped)} file(s) skipped ({shown}{more})"


def _categories(quarantine: pa.Table) -> pa.Array:
    return pa.array([reason.split(":", 1)[0] for reason in quarantine.column("reason").to_pylist()], pa.string())


def _value_counts(column) -> dict:
    if isinstance(column, list) or len(column) == 0:
        return {}
    return {row["values"]: row["counts"] for row in pc.value_counts(column).to_pylist()}
