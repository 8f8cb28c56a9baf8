"""Canonical shapes shared by every stage (Dagster-free).

Message (canonical):  {"role": "system"|"user"|"assistant"|"tool", "content": str|None,
                       "reasoning": str|None, "tool_calls": [ToolCall]|None, "tool_call_id": str|None}
ToolCall:             {"id": str, "name": str, "arguments": str, "acceptable"?: str|None}
                      # arguments: canonical JSON text; acceptable: canonical JSON of {argument: [accepted values]}
Tools:                list of OpenAI chat tool schemas {"type": "function", "function": {name, description, parameters}}
Action (NeMo-Gym's expected_action shape):
    {"type": "function_call", "name": str, "arguments": str|dict, "acceptable"?: {argument: [accepted values]}}
    {"type": "message", "content": str}
    {"type": "function_call_batch", "calls": [function_call, ...]}
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
ACTION_KINDS = ("tool_call", "message", "tool_call_batch")

# In an expected call's `acceptable` list of values: "this argument may be left out" (BFCL's possible_answer marker).
# Ingest writes it, the verifiers read it: one definition.
OMITTABLE = ""


class ContentError(ValueError):
    """Message content that is not text: not a string, None or a list of text parts."""


def content_text(content: Any) -> str | None:
    """Message content -> text, the one rule for inputs and completions alike: a string, None, or a list of parts
    that are strings or {text} / {refusal} objects (OpenAI's text, output_text and refusal parts), joined. Any other
    part (an image, audio, a file) is a ContentError naming its type: it is never dropped silently."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ContentError(f"content is {type(content).__name__}")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text", part.get("refusal")), str):
            texts.append(part.get("text", part.get("refusal")))
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ContentError(f"unsupported content part {kind!r}")
    return "".join(texts)


def rebuild_state(messages: list[dict], message_index: int) -> list[dict]:
    """A turn's state: every message before its assistant message (the tools travel separately)."""
    return list(messages[:message_index])


def action_from_message(message: dict) -> tuple[str, dict]:
    """(action_kind, action) of a canonical assistant message.

    Tool calls win over text: an assistant message with both text and calls is a tool-call action
    (the text stays in the message, visible in later states). Reasoning is never part of an action. A call's
    `acceptable` (when it has one) goes into its function_call: what the verifier accepts, never shown to a model.
    """
    calls = message.get("tool_calls") or []
    if len(calls) == 1:
        return "tool_call", _function_call(calls[0])
    if len(calls) > 1:
        return "tool_call_batch", {"type": "function_call_batch", "calls": [_function_call(c) for c in calls]}
    return "message", {"type": "message", "content": message.get("content") or ""}


def _function_call(call: dict) -> dict:
    action = {"type": "function_call", "name": call["name"], "arguments": call["arguments"]}
    if call.get("acceptable") is not None:
        action["acceptable"] = json.loads(call["acceptable"])
    return action


def action_tool_names(action: dict) -> list[str]:
    if action["type"] == "function_call":
        return [action["name"]]
    if action["type"] == "function_call_batch":
        return [c["name"] for c in action["calls"]]
    return []


# -- message shapes: canonical <-> the OpenAI / chat-template shape ----------------------------------
def as_list(value: Any, what: str) -> list:
    """Messages / tools arrive as lists or as JSON text (the trajectories table stores tools as JSON)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if hasattr(value, "tolist"):  # numpy arrays out of parquet
        value = value.tolist()
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list or JSON text of a list, got {type(value).__name__}")
    return value


def as_canonical_messages(messages: Any) -> list[dict]:
    """State messages in the canonical shape render_prompt takes, from either shape in use.

    The HF export stores template-shaped messages (tool_calls as {type, function: {name, arguments}});
    the warehouse stores canonical ones ({id, name, arguments}). Both render to the same prompt text.
    """
    out = []
    for m in as_list(messages, "messages") or []:
        calls = []
        for c in m.get("tool_calls") or []:
            fn = c.get("function") if isinstance(c.get("function"), dict) else c
            calls.append({"id": c.get("id") or "", "name": fn["name"], "arguments": fn.get("arguments")})
        out.append({"role": m["role"], "content": m.get("content"), "tool_calls": calls or None,
                    "tool_call_id": m.get("tool_call_id")})
    return out


def arguments_dict(name: str, arguments: Any) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if arguments not in (None, "") else {}
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"tool call {name!r}: arguments are not JSON text ({exc})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"tool call {name!r}: arguments must be a JSON object, got {type(parsed).__name__}")
    return parsed


def to_template_messages(messages: list[dict]) -> list[dict]:
    """Canonical messages -> the shape the chat template reads.

    Tool-call arguments become dicts (canonical stores JSON text); tool calls take the OpenAI/HF
    shape {"type": "function", "function": {"name", "arguments"}}; `reasoning` is dropped (policies/models.py
    says why); content None becomes "".
    """
    out = []
    for m in messages:
        msg = {"role": m["role"], "content": m.get("content") or ""}
        calls = m.get("tool_calls") or []
        if calls:
            msg["tool_calls"] = [
                {"type": "function", "function": {"name": c["name"], "arguments": arguments_dict(c["name"], c.get("arguments"))}}
                for c in calls
            ]
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out
