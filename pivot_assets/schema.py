"""Canonical shapes shared by every stage (Dagster-free).

Message (canonical):  {"role": "system"|"user"|"assistant"|"tool", "content": str|None,
                       "reasoning": str|None, "tool_calls": [ToolCall]|None, "tool_call_id": str|None}
ToolCall:             {"id": str, "name": str, "arguments": str}   # arguments: canonical JSON text
Tools:                list of OpenAI chat tool schemas {"type": "function", "function": {name, description, parameters}}
Action (DESIGN.md, NeMo-Gym's expected_action shape):
    {"type": "function_call", "name": str, "arguments": str|dict}
    {"type": "message", "content": str}
    {"type": "function_call_batch", "calls": [function_call, ...]}
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
ACTION_KINDS = ("tool_call", "message", "tool_call_batch")


def canonical_json(obj: Any) -> str:
    """Deterministic JSON text: sorted keys, no whitespace, UTF-8 kept as is."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def short_hash(text: str, n: int = 16) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def trajectory_id(messages: list[dict], tools: list | None) -> str:
    """Content hash of a canonical trajectory: same messages + tools -> same id, whatever the source."""
    return short_hash(canonical_json({"messages": messages, "tools": tools or []}))


def turn_id(trajectory_id_: str, message_index: int) -> str:
    """Stable turn key; the DuckDB twin is `substr(md5(trajectory_id || ':' || message_index), 1, 16)`."""
    return hashlib.md5(f"{trajectory_id_}:{message_index}".encode()).hexdigest()[:16]


def rebuild_state(messages: list[dict], message_index: int) -> list[dict]:
    """A turn's state: every message before its assistant message (the tools travel separately)."""
    return list(messages[:message_index])


def action_from_message(message: dict) -> tuple[str, dict]:
    """(action_kind, action) of a canonical assistant message.

    Tool calls win over text: an assistant message with both text and calls is a tool-call action
    (the text stays in the message, visible in later states). Reasoning is never part of an action.
    """
    calls = message.get("tool_calls") or []
    if len(calls) == 1:
        c = calls[0]
        return "tool_call", {"type": "function_call", "name": c["name"], "arguments": c["arguments"]}
    if len(calls) > 1:
        return "tool_call_batch", {
            "type": "function_call_batch",
            "calls": [{"type": "function_call", "name": c["name"], "arguments": c["arguments"]} for c in calls],
        }
    return "message", {"type": "message", "content": message.get("content") or ""}


def action_tool_names(action: dict) -> list[str]:
    if action["type"] == "function_call":
        return [action["name"]]
    if action["type"] == "function_call_batch":
        return [c["name"] for c in action["calls"]]
    return []
