"""Input files: which are data, how to open them (decompressed), and what a `.json` file holds (Dagster-free).

A data file is named `<name>.json`, `.jsonl` or `.parquet`, optionally compressed as `.gz` or `.zst` / `.zstd`
(JSON and JSON Lines only: Parquet compresses its own pages). In a directory, every other file is skipped with
a reason (`scan`), and so are the companions BFCL keeps beside its data (read with their data file instead):
`possible_answer/` and `multi_turn_func_doc/`. A file named explicitly is always read (as JSON when its name says
nothing else).

A `.json` file holds JSON Lines when its first non-blank line is a complete JSON value on its own and some
non-blank text follows it (BFCL names its JSON Lines files `.json`); otherwise it is one JSON document.
"""

from __future__ import annotations

import glob as globlib
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
DATA_KINDS = {".json": "json", ".jsonl": "jsonl", ".parquet": "parquet"}
HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
# BFCL's companion folders: read with the data file beside them (ingest/bfcl.py), never as records of their own
COMPANION_DIRS = {"possible_answer": "BFCL possible answers (read with the data file of the same name)",
                  "multi_turn_func_doc": "BFCL function docs (read with the multi-turn data)"}
FIRST_LINE_CAP = 64 << 20  # bytes of a first line read to decide a .json file's layout


def compression(path: Path) -> str | None:
    """"gzip", "zstd" or None, from the file name."""
    return COMPRESSIONS.get(path.suffix.lower())


def inner_suffix(path: Path) -> str:
    """The suffix that says what the data is: `.jsonl` for `a.jsonl.gz`, `.json` for `a.json`."""
    name = path.name[: -len(path.suffix)] if compression(path) else path.name
    return Path(name).suffix.lower()


def data_kind(path: Path) -> str | None:
    """"json", "jsonl" or "parquet" for a data file name, else None."""
    kind = DATA_KINDS.get(inner_suffix(path))
    return None if kind == "parquet" and compression(path) else kind


def skip_reason(path: Path) -> str:
    """Why a file found in a directory is not read (it is not a data file, or it is a BFCL companion)."""
    if path.parent.name in COMPANION_DIRS:
        return COMPANION_DIRS[path.parent.name]
    if compression(path) and inner_suffix(path) == ".parquet":
        return "compressed Parquet is not read (Parquet compresses its own pages)"
    suffix = "".join(path.suffixes[-2:]) if compression(path) else path.suffix
    return (f"not a data file ({suffix or 'no suffix'}; data is .json, .jsonl, .parquet, "
            "or .json / .jsonl in .gz / .zst)")


def is_hf_dataset(p: Path) -> bool:
    return p.is_dir() and any((p / m).exists() for m in HF_MARKERS)


def scan(path: str) -> tuple[list[Path], list[tuple[str, str]]]:
    """A file, a directory (recursively: data files and HF dataset dirs) or a glob -> (sorted data paths,
    [(skipped file, reason)]). Raises FileNotFoundError when the path or a glob match does not exist."""
    if any(ch in path for ch in "*?["):
        matches = sorted(Path(p) for p in globlib.glob(path, recursive=True))
    else:
        matches = [Path(path)]
    found: list[Path] = []
    skipped: list[tuple[str, str]] = []
    for p in matches:
        if not p.exists():
            raise FileNotFoundError(f"input path not found: {p}")
        _walk(p, found, skipped, top=True)
    return found, skipped


def _walk(p: Path, found: list[Path], skipped: list[tuple[str, str]], top: bool = False) -> None:
    if p.is_file():
        if top or (data_kind(p) and p.parent.name not in COMPANION_DIRS):
            found.append(p)
        else:
            skipped.append((str(p), skip_reason(p)))
        return
    if is_hf_dataset(p):
        found.append(p)
        return
    for child in sorted(p.iterdir()):
        _walk(child, found, skipped)


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when its name says so (a buffered stream: line iteration works)."""
    kind = compression(path)
    if kind == "gzip":
        return gzip.open(path, "rb")
    if kind == "zstd":
        import zstandard

        raw = open(path, "rb")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True,
                                                                             closefd=True))
    return open(path, "rb")


def read_bytes(path: Path) -> bytes:
    with open_binary(path) as f:
        return f.read()


def iter_lines(path: Path) -> Iterator[bytes]:
    """Every line of the (decompressed) file, with its newline."""
    with open_binary(path) as f:
        yield from f


def json_layout(path: Path) -> str:
    """"lines" when a .json file holds JSON Lines (module docstring), else "document"."""
    with open_binary(path) as f:
        first = b""
        for line in iter(lambda: f.readline(FIRST_LINE_CAP), b""):
            if line.strip():
                first = line
                break
        if not first or not first.endswith(b"\n") or not any(line.strip() for line in f):
            return "document"  # one line only (or longer than the cap): nothing follows it, nothing to parse twice
        try:
            json.loads(first)
        except (ValueError, RecursionError):
            return "document"
        return "lines"


def read_records(path: Path) -> list:
    """Every JSON value of a small side file (JSON Lines, or a JSON list / object), for files read whole with
    their data (BFCL answers, function docs). ValueError naming the line that broke."""
    if data_kind(path) == "jsonl" or json_layout(path) == "lines":
        values = []
        for lineno, line in enumerate(iter_lines(path)):
            if line.strip():
                try:
                    values.append(json.loads(line))
                except ValueError as exc:
                    raise ValueError(f"{path}: line {lineno + 1} is not JSON ({exc})") from None
        return values
    try:
        value = json.loads(read_bytes(path))
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    return value if isinstance(value, list) else [value]
