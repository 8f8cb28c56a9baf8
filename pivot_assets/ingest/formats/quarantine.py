"""Quarantine rows: a record we could not use, with its one-line reason and its raw text (QUARANTINE_SCHEMA)."""

from __future__ import annotations

import json

from .records import RAW_CAP, RawRecord, RecordError


def quarantine_row(raw: RawRecord, err: RecordError) -> dict:
    """{source, record, reason ("category: detail"), raw (capped at RAW_CAP characters)}."""
    text = raw.raw
    if text is None:
        try:
            text = json.dumps(raw.value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(raw.value)
    return {"source": raw.source, "record": raw.record, "reason": _writable(str(err)), "raw": _writable(text[:RAW_CAP])}


def _writable(text: str) -> str:
    # A lone surrogate (a record quarantined as non_utf8 holds one) cannot be written as UTF-8: keep it as its
    # \uXXXX escape, so the row can be stored and still shows what was there.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
