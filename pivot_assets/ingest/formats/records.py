"""The types every reader and adapter shares: a raw record, its error, an input, a record's origin; the caps."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_RECORD_BYTES = 8 * 1024 * 1024  # a text record larger than this is quarantined unparsed
RAW_CAP = 4096  # characters of raw text kept on a quarantine row
PARQUET_BATCH_ROWS = 512


class RecordError(ValueError):
    """A record that cannot be ingested; str() is the one-line quarantine reason "category: detail"."""

    def __init__(self, category: str, detail: str):
        one_line = " ".join(str(detail).split())
        super().__init__(f"{category}: {one_line}"[:500])
        self.category = category


@dataclass
class Input:
    """One configured input (the config's `inputs` items have the same fields)."""

    path: str
    format: str = "auto"
    domain: str | None = None
    tools: str | None = None  # a tools file for records without tools (load_tools_file)
    answers: str | None = None  # BFCL possible answers: a file or a folder (bfcl.answers_path)


@dataclass
class RawRecord:
    """What a reader yields: a parsed record, or the error that stopped it, plus its raw text when known."""

    source: str
    record: int
    value: Any = None
    error: RecordError | None = None
    raw: str | None = None
    context: dict | None = None  # file-level data a tau2 simulation needs (info, tasks)


@dataclass(frozen=True)
class Origin:
    """Where a record came from, for the adapters that need more than the record itself."""

    file: dict  # the rest of the file the record sits in (a tau2 results file minus its simulations), else {}
    source: str  # the record's file (BFCL reads the answer beside it)
    answers: str | None = None  # the input's BFCL answers (None: beside the file)


def parse_json_text(text: str) -> Any:
    """JSON text -> value; RecordError truncated_json / invalid_json naming the line and column that broke."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        truncated = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated")
        category = "truncated_json" if truncated else "invalid_json"
        raise RecordError(category, f"{e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise RecordError("invalid_json", "nesting too deep") from None
