"""The record-level rules every format's messages go through after its adapter (Dagster-free).

validate_messages: missing call ids get deterministic ids `call_<message index>_<k>`; tool results are matched to
calls; an assistant message with no text (empty or whitespace) and no tool calls would be an empty target action:
the record is quarantined ("empty_assistant_message"; the shared data has none: tau2 0 of 593 assistant messages,
NeMo-Gym: every merged group holds a message or a function call); a record with no assistant message is
"no_assistant_turn".
"""

from __future__ import annotations

from typing import Any

from pivot_assets.core.ids import canonical_json
from pivot_assets.core.shapes import ROLES

from .records import RecordError, parse_json_text


def validate_messages(messages: list[dict]) -> list[dict]:
    """Fill missing call ids, match tool results to calls, and apply the record-level rules.

    Raises RecordError: unknown_role, orphan_tool_result, empty_assistant_message, no_assistant_turn.
    """
    issued: set[str] = set()
    pending: list[str] = []  # calls not yet answered, in order: a tool result without an id answers the oldest
    n_assistant = 0
    for i, m in enumerate(messages):
        if m["role"] not in ROLES:
            raise RecordError("unknown_role", f"message {i} has role {m['role']!r}")
        if m["role"] == "assistant":
            n_assistant += 1
            for k, call in enumerate(m["tool_calls"] or []):
                if not call["id"]:
                    call["id"] = f"call_{i}_{k}"
                issued.add(call["id"])
                pending.append(call["id"])
            if not m["tool_calls"] and not (m["content"] or "").strip():
                raise RecordError("empty_assistant_message", f"message {i} has no text and no tool calls")
        elif m["role"] == "tool":
            tcid = m["tool_call_id"]
            if tcid is None:
                if not pending:
                    raise RecordError("orphan_tool_result", f"message {i} is a tool result with no pending call")
                m["tool_call_id"] = tcid = pending[0]
            if tcid not in issued:
                raise RecordError("orphan_tool_result", f"message {i} answers call {tcid!r}, which no assistant made")
            if tcid in pending:
                pending.remove(tcid)
    if n_assistant == 0:
        raise RecordError("no_assistant_turn", "record has no assistant message")
    return messages


def normalize_tools(tools: Any) -> list[dict]:
    """Chat, flat (Responses) or bare function schemas -> [{"type": "function", "function": {...}}]."""
    if tools is None:
        return []
    if isinstance(tools, str):
        tools = parse_json_text(tools) if tools.strip() else []
    if not isinstance(tools, list):
        raise RecordError("wrong_type", f"tools is {type(tools).__name__}, expected a list")
    out = []
    for k, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RecordError("wrong_type", f"tool {k} is not a function schema")
        params = fn.get("parameters")
        out.append({"type": "function", "function": {
            "name": fn["name"], "description": fn.get("description") or "",
            "parameters": params if isinstance(params, dict) else {"type": "object", "properties": {}}}})
    return out


def parse_reward(value: Any) -> float | None:
    """bool -> 1.0/0.0, number -> float, None -> None; anything else is a wrong type."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    raise RecordError("wrong_type", f"reward is {type(value).__name__}")


def check_encodable(messages: list[dict], tools: list) -> None:
    # A lone surrogate ("\ud800" in JSON) decodes into Python but cannot be written as UTF-8 (Parquet, DuckDB).
    try:
        canonical_json([messages, tools]).encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError("non_utf8", f"text holds an unpaired surrogate at offset {e.start}") from None
