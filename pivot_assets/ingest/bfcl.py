"""BFCL (Berkeley Function Calling Leaderboard) pieces -> the project's tools and actions (pure, Dagster-free).

BFCL describes functions with its own type names (`dict`, `float`, `tuple`, `any`) and gives the accepted
answer of a call as a list of values per argument (`possible_answer`; `""` in a list: the argument may be
omitted). These helpers are the one place that maps them: to OpenAI tool schemas (JSON Schema types) and to
`function_call` actions whose `arguments` are the first accepted value of every argument (the demonstration an
SFT turn carries) and whose `acceptable` keeps every accepted value (what the verifier accepts).
"""

from __future__ import annotations

import copy
from typing import Any

from pivot_assets.core.shapes import OMITTABLE

# BFCL type name -> JSON Schema type (None: any value, so the key is dropped)
BFCL_TYPES: dict[str, str | None] = {"dict": "object", "float": "number", "tuple": "array", "any": None,
                                     "list": "array", "int": "integer", "bool": "boolean", "str": "string"}


class BFCLError(ValueError):
    """A BFCL item that cannot be turned into tools or an action (the reason becomes a quarantine row).
    The message is "category: detail", as a quarantine reason is."""

    @property
    def category(self) -> str:
        return str(self).split(":", 1)[0]

    @property
    def detail(self) -> str:
        return str(self).split(":", 1)[-1].strip()


def json_schema(node: Any) -> Any:
    """A BFCL parameter schema as JSON Schema: type names mapped at every level, everything else kept."""
    if isinstance(node, list):
        return [json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            mapped = BFCL_TYPES.get(value, value)
            if mapped is not None:
                out[key] = mapped
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(prop) for name, prop in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
            out[key] = json_schema(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def bfcl_tools(functions: list[dict]) -> list[dict]:
    """BFCL function docs -> OpenAI chat tool schemas."""
    tools = []
    for fn in functions:
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BFCLError(f"bfcl_function_doc: a function without a name: {str(fn)[:80]}")
        entry = {"name": fn["name"], "description": fn.get("description", ""),
                 "parameters": json_schema(fn.get("parameters") or {"type": "object", "properties": {}})}
        tools.append({"type": "function", "function": entry})
    return tools


def _first_accepted(options: list) -> tuple[bool, Any]:
    """(present, value) of the demonstration: the first accepted value; absent when that is the omit marker."""
    first = options[0]
    if isinstance(first, str) and first == OMITTABLE:
        return False, None
    return True, _demonstration(first)


def _demonstration(value: Any) -> Any:
    """An accepted value with its nested choices resolved: a dict (also one inside a list, BFCL's list of
    dicts) lists accepted values per key, and the demonstration takes the first of each."""
    if isinstance(value, dict):
        return {k: v for k, (present, v) in ((k, _first_accepted(opts) if isinstance(opts, list) and opts
                                              else (True, opts)) for k, opts in value.items()) if present}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_demonstration(v) for v in value]
    return value


def expected_call(name: str, accepted: dict) -> dict:
    """One BFCL ground-truth call {arg: [accepted values]} -> a function_call action with `acceptable`."""
    if not isinstance(accepted, dict):
        raise BFCLError(f"bfcl_answer: call {name!r}: arguments are not a mapping")
    arguments = {}
    for arg, options in accepted.items():
        if not isinstance(options, list) or not options:
            raise BFCLError(f"bfcl_answer: call {name!r}: argument {arg!r} has no accepted value")
        present, value = _first_accepted(options)
        if present:
            arguments[arg] = value
    return {"type": "function_call", "name": name, "arguments": arguments,
            "acceptable": {arg: list(options) for arg, options in accepted.items()}}


def expected_action(ground_truth: list) -> dict:
    """BFCL's single-turn `ground_truth` (a list of {function name: {arg: [accepted values]}}) -> the action:
    one function_call, or a function_call_batch for parallel calls (each call with its own `acceptable`)."""
    if not isinstance(ground_truth, list) or not ground_truth:
        raise BFCLError("bfcl_answer: empty ground truth")
    calls = []
    for entry in ground_truth:
        if not isinstance(entry, dict) or len(entry) != 1:
            raise BFCLError(f"bfcl_answer: a ground-truth call is not one {{name: arguments}}: {str(entry)[:80]}")
        (name, accepted), = entry.items()
        calls.append(expected_call(name, accepted))
    return calls[0] if len(calls) == 1 else {"type": "function_call_batch", "calls": calls}
