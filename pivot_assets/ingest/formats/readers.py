"""Readers: an input path -> RawRecords, one per record, parsed or carrying the error that stopped it.

Chosen by file name (files.py: `.gz` / `.zst` compressed JSON and JSON Lines are read decompressed; in a directory
every other file is skipped, and each skipped file is reported with its reason, see `scan_paths`):
  .json      a top-level list (one record per element), an object (one record), or a tau2 results object
             ({"simulations": [...]}: one record per simulation, `record` = the simulation index, the rest of the
             file its `context`); a file that does not parse is one quarantined record (record 0) whose reason
             names the line and column that broke. A .json file that holds JSON Lines (BFCL's convention;
             files.json_layout) is read as .jsonl.
  .jsonl     one record per non-blank line; `record` = 0-based line number (line = record + 1); a bad line is
             quarantined and the rest of the file continues.
  .parquet   pyarrow, in row batches (all row groups, or a range of them: a streaming unit).
  a directory with dataset_info.json / state.json / dataset_dict.json: a Hugging Face `datasets` dataset saved
             with save_to_disk (every split, in order; all rows, or a range of them: a streaming unit).
Text records larger than MAX_RECORD_BYTES are quarantined ("oversized") without being parsed.
The streaming ingest (streaming.py) reads its units with these same readers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import files
from .records import MAX_RECORD_BYTES, PARQUET_BATCH_ROWS, RAW_CAP, RawRecord, RecordError, parse_json_text


def expand_paths(path: str) -> list[Path]:
    """A file, a directory (recursively: data files and HF dataset dirs) or a glob -> sorted data paths."""
    return files.scan(path)[0]


def scan_paths(path: str) -> tuple[list[Path], list[tuple[str, str]]]:
    """(data paths, [(skipped file, reason)]) of an input path (files.scan: a directory's other files and BFCL's
    companion folders are skipped, each with its reason)."""
    return files.scan(path)


def iter_raw_records(path: str) -> Iterator[RawRecord]:
    """Every record under `path`, file by file, as RawRecord (parsed or carrying its error)."""
    for p in expand_paths(path):
        if p.is_dir():
            yield from read_hf_dataset(p)
            continue
        kind = files.data_kind(p)
        if kind == "jsonl":
            yield from read_jsonl(p)
        elif kind == "parquet":
            yield from read_parquet(p)
        else:  # .json, and any file named explicitly: try JSON
            yield from read_json(p)


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError("non_utf8", f"invalid UTF-8 byte 0x{data[e.start]:02x} at byte {e.start}") from None


def _parse_bytes(data: bytes) -> Any:
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError("oversized", f"{len(data)} bytes > cap {MAX_RECORD_BYTES}")
    return parse_json_text(_decode(data))


def _raw_text(data: bytes) -> str:
    return data[: RAW_CAP * 4].decode("utf-8", errors="replace")[:RAW_CAP]


def read_jsonl(p: Path) -> Iterator[RawRecord]:
    """One record per non-blank line; record = 0-based line number; a bad line does not stop the file."""
    for lineno, line in enumerate(files.iter_lines(p)):
        if line.strip():
            yield jsonl_record(str(p), lineno, line)


def jsonl_record(source: str, lineno: int, line: bytes) -> RawRecord:
    """One non-blank JSONL line (with its newline, as read) -> RawRecord, parsed or carrying its error."""
    try:
        value = _parse_bytes(line)
    except RecordError as err:
        return RawRecord(source, lineno, error=_with_line(err, lineno), raw=_raw_text(line))
    return RawRecord(source, lineno, value=value, raw=None)


def _with_line(err: RecordError, lineno: int) -> RecordError:
    category, _, detail = str(err).partition(": ")
    return RecordError(category, f"{detail} (file line {lineno + 1})")


def read_json(p: Path) -> Iterator[RawRecord]:
    """A top-level list, one object, or a tau2 results object (one record per simulation); JSON Lines in a .json
    file are read as .jsonl."""
    if files.json_layout(p) == "lines":
        yield from read_jsonl(p)
        return
    data = files.read_bytes(p)
    try:
        text = _decode(data)
        value = parse_json_text(text)
    except RecordError as err:
        yield RawRecord(str(p), 0, error=err, raw=_raw_text(data))
        return
    if isinstance(value, dict) and isinstance(value.get("simulations"), list):
        context = {k: v for k, v in value.items() if k != "simulations"}
        for i, sim in enumerate(value["simulations"]):
            yield _sized(RawRecord(str(p), i, value=sim, context=context))
    elif isinstance(value, list):
        for i, element in enumerate(value):
            yield _sized(RawRecord(str(p), i, value=element))
    else:
        yield _sized(RawRecord(str(p), 0, value=value))


def _sized(raw: RawRecord) -> RawRecord:
    # Elements of a JSON file were parsed with the file; the cap still applies to each record's own size.
    if len(data := json.dumps(raw.value, ensure_ascii=False)) > MAX_RECORD_BYTES:
        raw.error = RecordError("oversized", f"{len(data)} characters > cap {MAX_RECORD_BYTES}")
        raw.raw = data[:RAW_CAP]
    return raw


def read_parquet(p: Path, row_groups: Sequence[int] | None = None, first_record: int = 0) -> Iterator[RawRecord]:
    """Rows of a Parquet file (of `row_groups` only, when given: their first row is record `first_record`), read in
    batches of PARQUET_BATCH_ROWS."""
    import pyarrow.parquet as pq

    index = first_record
    for batch in pq.ParquetFile(p).iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=row_groups):
        for row in batch.to_pylist():
            yield RawRecord(str(p), index, value=row)
            index += 1


def hf_splits(p: Path) -> list:
    """The splits of a `datasets` dataset saved to disk, in order (a Dataset is its one split)."""
    import datasets

    loaded = datasets.load_from_disk(str(p))
    return [loaded[name] for name in loaded] if isinstance(loaded, datasets.DatasetDict) else [loaded]


def read_hf_dataset(p: Path, start: int = 0, stop: int | None = None) -> Iterator[RawRecord]:
    """A `datasets` dataset saved to disk: its splits in order, records numbered on across them (records `start`
    to `stop` only, when given)."""
    base = 0
    for split in hf_splits(p):
        lo, hi = max(start - base, 0), len(split) if stop is None else min(stop - base, len(split))
        for i in range(lo, hi):
            yield RawRecord(str(p), base + i, value=split[i])
        base += len(split)
