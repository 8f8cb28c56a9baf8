"""openai: OpenAI chat completions records (also the generic chat shape most trainers write).

Messages under `messages`, `traj` or `conversation` (or `conversations` holding role/content messages); assistant
`tool_calls` [{id, type, function: {name, arguments}}] (arguments a JSON string or an object; the flat
{id, name, arguments} form and the legacy `function_call` are accepted too); `role: tool` results with
`tool_call_id`; reasoning from `reasoning` / `reasoning_content` / `thinking`; optional `tools`; outcome reward from
`reward`, `success` or `score` (a bool becomes 1.0 / 0.0); an optional executable `environment`. Our own
trajectories Parquet (TRAJECTORY_SCHEMA) reads back as this format with the same trajectory_ids.
JSONL lines of this format usually go through chat_sql.py, the same adapter as one DuckDB query.
"""

from __future__ import annotations

from .messages import chat_messages, record_domain, record_reward
from .records import Origin
from .registry import Format, register

MESSAGE_KEYS = ("messages", "traj", "conversation", "conversations")


def adapt_openai(value: dict, origin: Origin) -> dict:
    """OpenAI chat completions record."""
    key = next((k for k in MESSAGE_KEYS if k in value), "messages")
    return {"messages": chat_messages(value.get(key)), "tools": value.get("tools"),
            "reward": record_reward(value), "domain": record_domain(value), "environment": value.get("environment")}


def holds_messages(value: dict, file: dict | None = None) -> bool:
    return any(isinstance(value.get(k), list) for k in MESSAGE_KEYS)


register(Format(
    name="openai",
    description="OpenAI chat, `messages` (or `traj` / `conversation`) with `tool_calls` and `role: tool`",
    keys=MESSAGE_KEYS, adapt=adapt_openai, detect=holds_messages, json_keys=(*MESSAGE_KEYS, "tools"), generic=True))
