"""One record through its format's adapter and the shared rules (Dagster-free): what the pipeline's streaming
ingest (streaming.py) applies to every record; tests/ingest/reference.py loops over records with it one at a time,
as the reference the streaming ingest is checked against.

Every input record becomes exactly one of ("trajectory", row), ("quarantine", row) or ("duplicate", row): see the
package docstring. conversation_id: rule in the package docstring (CONVERSATION_ID_FIELDS).
"""

from __future__ import annotations

from typing import Any


from pivot_assets.core.ids import canonical_json, short_hash, trajectory_id

from . import registry
from .quarantine import quarantine_row
from .records import Input, Origin, RawRecord, RecordError, parse_json_text
from .validation import check_encodable, normalize_tools, parse_reward, validate_messages

CONVERSATION_ID_FIELDS = ("session_id", "task_id", "_ng_task_index")


def ingest_record(raw: RawRecord, fmt: str = "auto", domain: str | None = None,
                  answers: str | None = None) -> tuple[str, dict]:
    """One raw record -> ("trajectory", row) or ("quarantine", row); no dedup here. `answers`: the input's
    BFCL possible answers (None: beside the record's file)."""
    if raw.error is not None:
        return "quarantine", quarantine_row(raw, raw.error)
    try:
        source_format, adapted = adapt_record(raw.value, fmt, raw.context, source=raw.source, answers=answers)
        messages = validate_messages(adapted["messages"])
        tools = normalize_tools(adapted.get("tools"))
        reward = parse_reward(adapted.get("reward"))
        check_encodable(messages, tools)
    except RecordError as err:
        return "quarantine", quarantine_row(raw, err)
    tid = trajectory_id(messages, tools)
    row = {
        "trajectory_id": tid,
        "source": raw.source,
        "record": raw.record,
        "source_format": source_format,
        "domain": domain or adapted.get("domain") or "default",
        "messages": messages,
        "tools": canonical_json(tools),
        "outcome_reward": reward,
        "conversation_id": adapted.get("conversation_id") or conversation_id(raw.value, messages, tid),
        "environment": _environment(adapted.get("environment")),
    }
    return "trajectory", row


def adapt_record(value: Any, fmt: str, context: dict | None, source: str | None = None,
                 answers: str | None = None) -> tuple[str, dict]:
    """A parsed record -> (source_format, {messages (unvalidated canonical), tools, reward, domain} and, where the
    format names one, conversation_id). `context`: the rest of the record's file (a tau2 results file), `source`
    the record's file and `answers` the input's BFCL answers (the BFCL formats read the answer beside the file)."""
    if not isinstance(value, dict):
        raise RecordError("wrong_type", f"record is {type(value).__name__}, expected an object")
    value = _parse_json_columns(value)
    detected = registry.detect(value, context)
    if fmt == "auto":
        if detected is None:
            raise RecordError("unknown_format", f"no known format fits keys {sorted(value)[:12]}")
        fmt = detected
    elif detected != fmt and not registry.get(fmt).fits(value):
        raise RecordError("format_mismatch", f"input format is {fmt} but the record looks like {detected}")
    return fmt, registry.get(fmt).adapt(value, Origin(context or {}, source or "", answers))


def _parse_json_columns(value: dict) -> dict:
    # Parquet / HF datasets often store nested fields as JSON text.
    out = dict(value)
    for key in registry.json_keys():
        v = out.get(key)
        if isinstance(v, str) and v[:1] in "[{":
            out[key] = parse_json_text(v)
    return out


def _environment(value: Any) -> str | None:
    """An executable environment as canonical JSON text (environments/base.py), None when the record has none."""
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_json_text(value)
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        raise RecordError("wrong_type", "environment must be an object with a string 'kind'")
    return canonical_json(value)


def conversation_id(value: Any, messages: list[dict], trajectory_id_: str) -> str:
    """The source-conversation group key of a record (rule in the package docstring)."""
    value = value if isinstance(value, dict) else {}
    explicit = value.get("conversation_id")
    if isinstance(explicit, str) and explicit:
        return explicit
    ids = [[key, str(v)] for key in CONVERSATION_ID_FIELDS
           if isinstance(v := value.get(key), str) or (isinstance(v, int) and not isinstance(v, bool))]
    first_assistant = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    opening = messages[:first_assistant]
    if not ids and not any(m["role"] == "user" for m in opening):
        return trajectory_id_
    return short_hash(canonical_json({"ids": ids, "opening": opening}))


def as_input(item: Any) -> Input:
    """A configured input (a dict or an object with the same fields) -> Input; ValueError for an unknown format."""
    get = item.get if isinstance(item, dict) else (lambda k, d=None: getattr(item, k, d))
    fmt = get("format", "auto") or "auto"
    if fmt != registry.AUTO and fmt not in registry.names():
        raise ValueError(f"unknown input format {fmt!r} (one of {', '.join((registry.AUTO, *registry.names()))})")
    return Input(path=str(get("path")), format=fmt, domain=get("domain", None), tools=get("tools", None),
                 answers=get("answers", None))
