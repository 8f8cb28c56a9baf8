"""responses: OpenAI Responses / NeMo-Gym rollouts and pivot rows.

`responses_create_params.instructions` (a system message), `responses_create_params.input` (a string = one user
message, or items) then `response.output` items: message, function_call, function_call_output, reasoning;
`reward`. Tools are flat {type, name, description, parameters} and become chat tool schemas.
Merge rule: consecutive assistant-side items (reasoning, assistant message, function_call) with no tool output or
user/system item between them are ONE assistant message (one model call); the start of `response.output` also
starts a new model call.
Pivot rows (NeMo-Gym's single-step format: `expected_action`): the input is the state and the expected action is
appended as the final assistant message, so the row is one trajectory whose last turn is the pivot. A `response` on
such a row is a policy sample scored against the expected action (example_rollouts.jsonl), not expert data: it is
ignored and outcome_reward is null (its reward scores the sample, not the trajectory). A pivot row's own profile
(pass_rate, pass_rate_total, pass_rate_passed, `<model>_info`: profiles.py) is checked here, so a malformed one
quarantines the row ("bad_profile: ..."); ingest/imported_profiles.py reads the profiles of the rows ingested.
The same pivot row in example.jsonl and example_rollouts.jsonl is therefore one trajectory plus one duplicate.
Task rows with no assistant output (workplace_assistant/example.jsonl: input + `ground_truth`, a list of required
calls that a rollout spreads over several model calls) have no expert turn: they are quarantined as
"no_assistant_turn". (An input-only row whose input already holds assistant turns is ingested as that input.)
"""

from __future__ import annotations

from typing import Any

from pivot_assets.core.ids import canonical_json

from .messages import CHAT_ROLES, content_text, message, record_domain, tool_call
from .profiles import row_profile
from .records import Origin, RecordError
from .registry import Format, register

RESPONSES_ASSISTANT_ITEMS = ("reasoning", "function_call")


def adapt_responses(value: dict, origin: Origin) -> dict:
    """OpenAI Responses / NeMo-Gym rollout or pivot row (see the module docstring for the merge rule)."""
    rcp = value.get("responses_create_params")
    if not isinstance(rcp, dict):
        raise RecordError("wrong_type", f"responses_create_params is {type(rcp).__name__}")
    messages: list[dict] = []
    if isinstance(rcp.get("instructions"), str) and rcp["instructions"]:
        messages.append(message("system", rcp["instructions"]))
    items = rcp.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    _append_items(messages, items, "input")
    reward = value.get("reward")
    if "expected_action" in value:
        messages.append(_expected_action_message(value["expected_action"]))
        row_profile(value)  # a malformed profile quarantines the row (ingest/imported_profiles.py reads the good ones)
        reward = None  # the row's reward (if any) scores a policy sample, not this trajectory
    elif value.get("response") is not None:
        response = value["response"]
        if not isinstance(response, dict):
            raise RecordError("wrong_type", f"response is {type(response).__name__}")
        _append_items(messages, response.get("output"), "output")
    elif not any(m["role"] == "assistant" for m in messages):
        extra = " (it has ground_truth: a task, not a demonstration)" if "ground_truth" in value else ""
        raise RecordError("no_assistant_turn", f"input-only row: no response and no expected_action{extra}")
    return {"messages": messages, "tools": rcp.get("tools"), "reward": reward, "domain": record_domain(value)}


def _append_items(messages: list[dict], items: Any, where: str) -> None:
    if items is None:
        return
    if not isinstance(items, list):
        raise RecordError("wrong_type", f"{where} is {type(items).__name__}, expected a list")
    open_call: dict | None = None  # the assistant message being assembled (one model call)
    for i, item in enumerate(items):
        w = f"{where} item {i}"
        if not isinstance(item, dict):
            raise RecordError("wrong_type", f"{w} is {type(item).__name__}")
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind in RESPONSES_ASSISTANT_ITEMS or (kind == "message" and role == "assistant"):
            if open_call is None:
                open_call = message("assistant")
                messages.append(open_call)
            _merge_assistant_item(open_call, kind, item, w)
            continue
        open_call = None
        if kind == "message":
            if not isinstance(role, str) or CHAT_ROLES.get(role) not in ("system", "user"):
                raise RecordError("unknown_role", f"{w} has role {role!r}")
            messages.append(message(CHAT_ROLES[role], content_text(item.get("content"), w)))
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else (
                content_text(output, w) if isinstance(output, list) else canonical_json(output))
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise RecordError("wrong_type", f"{w}: call_id is {type(call_id).__name__}")
            messages.append(message("tool", text, tool_call_id=call_id))
        else:
            raise RecordError("unknown_item_type", f"{w} has type {kind!r}")


def _merge_assistant_item(msg: dict, kind: str, item: dict, where: str) -> None:
    if kind == "reasoning":
        text = _reasoning_text(item, where)
        if text:
            msg["reasoning"] = text if msg["reasoning"] is None else msg["reasoning"] + "\n" + text
    elif kind == "function_call":
        call = tool_call(item.get("name"), item.get("arguments"), item.get("call_id") or item.get("id"), where)
        msg["tool_calls"] = (msg["tool_calls"] or []) + [call]
    else:
        text = content_text(item.get("content"), where)
        if text is not None:
            msg["content"] = text if msg["content"] is None else msg["content"] + "\n" + text


def _reasoning_text(item: dict, where: str) -> str:
    """A reasoning item's text: its raw `content` parts when present (open models), else its `summary` parts."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise RecordError("wrong_type", f"{where}: reasoning {key} is {type(parts).__name__}")
        texts = [p.get("text") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if texts:
            return "\n".join(texts)
    return ""


def _expected_action_message(action: Any) -> dict:
    """NeMo-Gym's expected_action (core/shapes.py's action shape) -> the final assistant message."""
    where = "expected_action"
    if not isinstance(action, dict):
        raise RecordError("wrong_type", f"{where} is {type(action).__name__}")
    kind = action.get("type")
    if kind == "message":
        return message("assistant", content_text(action.get("content"), where))
    if kind == "function_call":
        return message("assistant", tool_calls=[tool_call(action.get("name"), action.get("arguments"), None, where,
                                                            action.get("acceptable"))])
    if kind == "function_call_batch" and isinstance(action.get("calls"), list):
        calls = [tool_call(c.get("name"), c.get("arguments"), None, f"{where} call {k}", c.get("acceptable"))
                 if isinstance(c, dict)
                 else tool_call(None, None, None, f"{where} call {k}") for k, c in enumerate(action["calls"])]
        return message("assistant", tool_calls=calls)
    raise RecordError("wrong_type", f"{where} has type {kind!r}")


register(Format(
    name="responses", description="OpenAI Responses / NeMo-Gym, `responses_create_params` then "
    "`response.output` (or `expected_action`)", keys=("responses_create_params",), adapt=adapt_responses,
    json_keys=("responses_create_params", "response", "expected_action", "tools")))
