"""sharegpt: ShareGPT `conversations` [{from, value}].

Roles: system, human/user, gpt/assistant, function_call (an assistant tool call: JSON {name, arguments} or a list
of them), observation/tool/function_response (tool results, matched in order to the pending calls); optional
top-level `system` and `tools`. A `conversations` list of role/content messages is the openai format.
"""

from __future__ import annotations

import json

from .messages import content_text, message, record_domain, record_reward, tool_call
from .records import Origin, RecordError
from .registry import Format, register

SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "function_call": "call", "tool_call": "call",
                  "observation": "tool", "tool": "tool", "function_response": "tool", "ipython": "tool"}


def adapt_sharegpt(value: dict, origin: Origin) -> dict:
    """ShareGPT `conversations` [{from, value}]; tool results answer the pending calls in order."""
    conv = value.get("conversations")
    if not isinstance(conv, list):
        raise RecordError("wrong_type", f"conversations is {type(conv).__name__}")
    messages = []
    if isinstance(value.get("system"), str) and value["system"]:
        messages.append(message("system", value["system"]))
    for i, turn in enumerate(conv):
        where = f"conversation turn {i}"
        if not isinstance(turn, dict):
            raise RecordError("wrong_type", f"{where} is {type(turn).__name__}")
        role = SHAREGPT_ROLES.get(turn.get("from")) if isinstance(turn.get("from"), str) else None
        if role is None:
            raise RecordError("unknown_role", f"{where} has from={turn.get('from')!r}")
        text = content_text(turn.get("value"), where)
        if role == "call":
            messages.append(message("assistant", tool_calls=_sharegpt_calls(text, where)))
        else:
            messages.append(message(role, text))
    return {"messages": messages, "tools": value.get("tools"), "reward": record_reward(value),
            "domain": record_domain(value)}


def _sharegpt_calls(text: str | None, where: str) -> list[dict]:
    try:
        parsed = json.loads(text or "")
    except json.JSONDecodeError as e:
        raise RecordError("bad_arguments", f"{where}: function_call value is not JSON ({e.msg})") from None
    items = parsed if isinstance(parsed, list) else [parsed]
    if not all(isinstance(c, dict) for c in items):
        raise RecordError("wrong_type", f"{where}: function_call value is not an object")
    return [tool_call(c.get("name"), c.get("arguments", c.get("parameters")), c.get("id"), where) for c in items]


def is_sharegpt(value: dict, file: dict | None = None) -> bool:
    conv = value.get("conversations")
    return isinstance(conv, list) and bool(conv) and isinstance(conv[0], dict) and "from" in conv[0]


register(Format(
    name="sharegpt", description="ShareGPT, `conversations` of {from, value} (human, gpt, function_call, observation)",
    keys=("conversations",), adapt=adapt_sharegpt, detect=is_sharegpt, json_keys=("conversations", "tools")))
