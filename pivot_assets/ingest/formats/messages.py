"""Canonical messages, built from what the chat-like formats share (Dagster-free).

A canonical message has all five keys (see schema.py): role, content (str|None), reasoning (str|None),
tool_calls ([{id, name, arguments, acceptable?}]|None, arguments = core.ids.canonical_json of the parsed object;
`acceptable` = canonical JSON of {argument: [accepted values]}, present only on calls whose source gives it: BFCL
answers, an `acceptable` on a chat tool call or on a NeMo-Gym expected_action), tool_call_id (str|None).
A format's adapter builds them with `chat_messages` (OpenAI-chat-like messages) or `message` and `tool_call`.
"""

from __future__ import annotations

import json
from typing import Any

from pivot_assets.core import shapes
from pivot_assets.core.ids import canonical_json

from .records import RecordError


def message(role: str, content: str | None = None, reasoning: str | None = None,
            tool_calls: list | None = None, tool_call_id: str | None = None) -> dict:
    return {"role": role, "content": content, "reasoning": reasoning, "tool_calls": tool_calls or None,
            "tool_call_id": tool_call_id}


def content_text(content: Any, where: str) -> str | None:
    """Message content -> text (core/shapes.content_text's rule); anything else is a quarantined record."""
    try:
        return shapes.content_text(content)
    except shapes.ContentError as e:
        raise RecordError("wrong_type", f"{where}: {e}") from None


def canonical_arguments(args: Any, where: str) -> str:
    """Tool-call arguments (JSON text or an object) -> canonical JSON text of an object."""
    if args is None or (isinstance(args, str) and not args.strip()):
        return "{}"
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise RecordError("bad_arguments", f"{where}: arguments are not JSON ({e.msg})") from None
    if not isinstance(args, dict):
        raise RecordError("bad_arguments", f"{where}: arguments are a JSON {type(args).__name__}, not an object")
    return canonical_json(args)


def tool_call(name: Any, args: Any, call_id: Any, where: str, acceptable: Any = None) -> dict:
    if not isinstance(name, str) or not name:
        raise RecordError("wrong_type", f"{where}: tool call name is {type(name).__name__}")
    if call_id is not None and not isinstance(call_id, str):
        raise RecordError("wrong_type", f"{where}: tool call id is {type(call_id).__name__}")
    call = {"id": call_id, "name": name, "arguments": canonical_arguments(args, where)}
    if acceptable is not None:  # the key exists only when the source gives it (the trajectory_id rule)
        call["acceptable"] = canonical_acceptable(acceptable, where)
    return call


def canonical_acceptable(value: Any, where: str) -> str:
    """A call's accepted values {argument: [values]} (JSON text or an object) -> canonical JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RecordError("bad_acceptable", f"{where}: acceptable is not JSON ({e.msg})") from None
    if not isinstance(value, dict) or not all(isinstance(v, list) and v for v in value.values()):
        raise RecordError("bad_acceptable", f"{where}: acceptable is not a mapping of argument -> accepted values")
    return canonical_json(value)


def chat_tool_calls(raw_calls: Any, where: str) -> list[dict]:
    if raw_calls is None:
        return []
    if not isinstance(raw_calls, list):
        raise RecordError("wrong_type", f"{where}: tool_calls is {type(raw_calls).__name__}")
    calls = []
    for k, c in enumerate(raw_calls):
        if not isinstance(c, dict):
            raise RecordError("wrong_type", f"{where}: tool call {k} is {type(c).__name__}")
        fn = c.get("function") if isinstance(c.get("function"), dict) else c
        calls.append(tool_call(fn.get("name"), fn.get("arguments"), c.get("id"), f"{where} call {k}",
                           c.get("acceptable", fn.get("acceptable"))))
    return calls


CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "human": "user",
              "assistant": "assistant", "tool": "tool", "function": "tool", "ipython": "tool"}


def chat_messages(raw_messages: Any) -> list[dict]:
    """OpenAI-chat-like messages (also tau2's) -> canonical messages (ids not yet filled)."""
    if not isinstance(raw_messages, list):
        raise RecordError("wrong_type", f"messages is {type(raw_messages).__name__}, expected a list")
    out = []
    for i, m in enumerate(raw_messages):
        where = f"message {i}"
        if not isinstance(m, dict):
            raise RecordError("wrong_type", f"{where} is {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise RecordError("unknown_role", f"{where} has role {role!r}")
        role = CHAT_ROLES[role]
        reasoning = next((m[k] for k in ("reasoning", "reasoning_content", "thinking") if m.get(k) is not None), None)
        msg = message(role, content_text(m.get("content"), where), content_text(reasoning, where + " reasoning"))
        if role == "assistant":
            calls = chat_tool_calls(m.get("tool_calls"), where)
            if isinstance(m.get("function_call"), dict):  # legacy single function call
                fc = m["function_call"]
                calls.append(tool_call(fc.get("name"), fc.get("arguments"), None, where))
            msg["tool_calls"] = calls or None
        elif m.get("tool_calls"):
            raise RecordError("wrong_type", f"{where}: a {role} message carries tool_calls")
        if role == "tool":
            tcid = m.get("tool_call_id", m.get("id"))
            if tcid is not None and not isinstance(tcid, str):
                raise RecordError("wrong_type", f"{where}: tool_call_id is {type(tcid).__name__}")
            msg["tool_call_id"] = tcid
        out.append(msg)
    return out


def record_reward(value: dict) -> Any:
    # outcome_reward: our own trajectories table, re-ingested from Parquet
    return next((value[k] for k in ("reward", "success", "score", "outcome_reward") if k in value), None)


def record_domain(value: dict) -> str | None:
    meta = value.get("metadata") if isinstance(value.get("metadata"), dict) else {}
    for d in (value.get("domain"), meta.get("domain"), value.get("domain_name")):
        if isinstance(d, str) and d:
            return d
    return None
