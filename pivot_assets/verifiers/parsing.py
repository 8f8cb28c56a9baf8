"""Candidate parsing: raw model output (or an action/message dict) -> action, never an exception.

Accepted shapes
- text with Hermes/Qwen `<tool_call>{json}</tool_call>` blocks (several = a batch). A final `<tool_call>` with
  no closing tag is accepted when its JSON is complete (stop sequences often eat the tag); a cut-off JSON is
  TRUNCATED (see below).
- a bare JSON tool call `{"name": ..., "arguments": ...}` (or `parameters`), a JSON list of them, optionally
  in a ```json fence.
- Llama 3.x JSON tool calls: `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`, several
  separated by `;` (the llama3_json format of Meta's template and vLLM's parser).
- Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (v3 tokenizers) and
  `[TOOL_CALLS]name[ARGS]{...}` repeated per call (v11+ tokenizers); text before the first marker is dropped
  (tool calls win).
- `<think>...</think>` reasoning is stripped; text after an orphan `</think>` (template opened the block) is
  the answer. A `<think>` never closed, or a final `<tool_call>` cut inside its JSON, means the generation ran
  out of tokens: a ParseError whose message starts with TRUNCATED_PREFIX (the verifier's reason TRUNCATED).
- dicts: an action (`type` function_call / message / function_call_batch), an OpenAI chat message
  (`tool_calls` with `function.name/arguments`, or content), a canonical message, a bare call dict; lists of
  Responses output items or of tool-call objects.
- anything else -> plain text -> message action. Empty output -> PARSE_ERROR.

Tool calls win over text (same rule as schema.action_from_message).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, NamedTuple

from pivot_assets.core.shapes import OMITTABLE, ContentError, content_text

from .canonical import canonical_args, canonical_key, canonicalize, loads_canonical, reload_canonical


class Accepted(NamedTuple):
    """The accepted values of one argument of an expected call (its `acceptable` list)."""

    values: tuple  # accepted values in canonical form (JSON in strings decoded), the omit marker left out
    keys: frozenset  # canonical JSON text of each value as given (dicts aside): a value written the same is accepted
    omittable: bool  # the list holds "" (BFCL's marker): the argument may be left out


class Call(NamedTuple):
    name: str
    args: Any  # canonical python value (a dict)
    key: str  # canonical JSON text of args: the equality key
    raw: Any  # arguments as sent (JSON strings not decoded): what schema validation sees
    raw_key: str  # canonical JSON text of raw: equal to `key` unless a string held JSON
    # Expected calls only: argument -> its accepted values (the action's `acceptable`); None: `args` alone
    acceptable: dict[str, Accepted] | None = None


class Parsed(NamedTuple):
    kind: str  # "text" | "calls"
    text: str
    calls: tuple[Call, ...]

    @property
    def key(self) -> str:
        """Canonical text of the whole action (equal keys = identical actions)."""
        if self.kind == "text":
            return canonical_key({"type": "message", "content": self.text})
        return canonical_key([[c.name, c.key] for c in self.calls])


class ParseError(ValueError):
    pass


TRUNCATED_PREFIX = "truncated: "  # parse errors that mean "ran out of tokens", not "answered wrongly"


def is_truncation(error: str | None) -> bool:
    return bool(error) and error.startswith(TRUNCATED_PREFIX)


_THINK_RE = re.compile(r"<think>.*?</think>", re.S)
_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_MAX_ERR = 160


def _short(msg: str) -> str:
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= _MAX_ERR else msg[:_MAX_ERR] + "..."


# ---------------------------------------------------------------------------------------------------
# building calls


def _args_value(raw: Any, where: str) -> Any:
    """Arguments as given (JSON text, dict, None) -> dict (numbers canonical when parsed from text)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            raw = loads_canonical(raw)
        except RecursionError:
            raise ParseError(f"{where}: arguments nested too deeply") from None
        except ValueError as e:
            raise ParseError(f"{where}: arguments are not valid JSON ({_short(e)})") from None
        if isinstance(raw, str) and raw.strip().startswith("{"):
            # Doubly encoded arguments ("\"{\\\"a\\\": 1}\"") are a common serializer slip.
            return _args_value(raw, where)
    if not isinstance(raw, dict):
        raise ParseError(f"{where}: arguments must be a JSON object, got {type(raw).__name__}")
    return raw


def make_call(name: Any, raw_args: Any, where: str = "tool call") -> Call:
    if not isinstance(name, str) or not name:
        raise ParseError(f"{where}: missing tool name")
    try:
        # Arguments already decoded by loads_canonical (the usual case) skip the checks of _args_value.
        raw = raw_args if type(raw_args) is dict else _args_value(raw_args, f"{where} {name!r}")
        args, key, raw_key = canonical_args(raw)
        return Call(name, args, key, raw, raw_key)
    except RecursionError:
        raise ParseError(f"{where} {name!r}: arguments nested too deeply") from None




def parse_acceptable(acceptable: Any, call: Call, where: str) -> dict[str, Accepted]:
    """An expected call's `acceptable` ({argument: [accepted values]}) checked and indexed.

    Every argument the call passes must be listed (the demonstration is one of the accepted calls).
    """
    if not isinstance(acceptable, dict):
        raise ParseError(f"{where} {call.name!r}: acceptable must map arguments to lists of accepted values")
    out = {}
    for arg, options in acceptable.items():
        if not isinstance(options, list) or not options:
            raise ParseError(f"{where} {call.name!r}: acceptable[{arg!r}] must be a non-empty list of accepted values")
        as_given = [v for v in options if not (isinstance(v, str) and v == OMITTABLE)]
        # A dict among the values lists accepted values per key (a pattern), so it is never a value as written.
        literal = frozenset(canonical_key(v) for v in as_given if not _holds_dict(v))
        out[arg] = Accepted(tuple(canonicalize(v) for v in as_given), literal, len(as_given) < len(options))
    unlisted = sorted(set(call.args) - set(out))
    if unlisted:
        raise ParseError(f"{where} {call.name!r}: argument {unlisted[0]!r} is not in acceptable")
    return out


def _holds_dict(value: Any) -> bool:
    return isinstance(value, dict) or (isinstance(value, list) and any(_holds_dict(v) for v in value))


def _expected_call(obj: dict, where: str) -> Call:
    """A call of an expected action: its arguments, and its accepted values when it carries `acceptable`."""
    call = _call_from_obj(obj, where)
    if obj.get("acceptable") is None:
        return call
    return call._replace(acceptable=parse_acceptable(obj["acceptable"], call, where))


def _is_call_dict(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("name"), str) and (
        "arguments" in obj or "parameters" in obj or set(obj) <= {"name", "id", "type"})


def _call_from_obj(obj: dict, where: str) -> Call:
    """OpenAI tool_call object ({function: {...}}), flat call dict or Responses function_call item."""
    fn = obj.get("function")
    if isinstance(fn, dict):
        obj = fn
    raw_args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    return make_call(obj.get("name"), raw_args, where)


def _calls_parsed(calls: list[Call]) -> Parsed:
    return Parsed("calls", "", tuple(calls))


# ---------------------------------------------------------------------------------------------------
# text


def _strip_reasoning(text: str) -> str:
    """The answer part of a completion. Reasoning comes first, so only think tags before the first
    `<tool_call>` count, and none when the text opens with a JSON call: a tag inside arguments is data."""
    if "think>" not in text:  # the common case, without a regex scan
        return text
    start = text.lstrip()
    if start[:1] in ("{", "[") or start.startswith("```"):
        return text
    cut = text.find("<tool_call>")
    head, tail = (text, "") if cut < 0 else (text[:cut], text[cut:])
    head = _THINK_RE.sub("", head)
    if "</think>" in head:  # the chat template opened <think> in the prompt: the answer follows the close
        head = head.rsplit("</think>", 1)[1]
    if "<think>" in head:
        before = head.split("<think>", 1)[0]
        if not before.strip():
            raise ParseError(TRUNCATED_PREFIX + "reasoning block never closed: no answer after <think>")
        return before
    return head + tail


def _json_payload_calls(payload: str, where: str) -> list[Call]:
    try:
        obj = loads_canonical(payload)
    except RecursionError:
        raise ParseError(f"{where}: JSON nested too deeply") from None
    except ValueError as e:
        raise ParseError(f"{where}: invalid JSON ({_short(e)})") from None
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        raise ParseError(f"{where}: empty list of calls")
    calls = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ParseError(f"{where}: a call must be a JSON object, got {type(item).__name__}")
        calls.append(_call_from_obj(item, where if len(items) == 1 else f"{where}[{i}]"))
    return calls


def _tool_call_blocks(text: str) -> tuple[list[str], str | None]:
    """(closed <tool_call> block bodies, body of a final unclosed block or None); str.find, no regex scan."""
    open_tag, close_tag = "<tool_call>", "</tool_call>"
    blocks, pos = [], 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return blocks, None
        end = text.find(close_tag, start + len(open_tag))
        # a close tag inside a JSON string (an argument's value) is data: the block ends at the next one outside
        while end >= 0 and _ends_inside_string(text[start + len(open_tag):end]):
            later = text.find(close_tag, end + len(close_tag))
            if later < 0:
                break
            end = later
        if end < 0:
            return blocks, text[start + len(open_tag):]
        blocks.append(text[start + len(open_tag):end])
        pos = end + len(close_tag)


_UNESCAPED_QUOTE = re.compile(r'(?<!\\)(?:\\\\)*"')


def _ends_inside_string(body: str) -> bool:
    """Whether `body` ends inside a JSON string: an odd number of unescaped double quotes."""
    return '"' in body and len(_UNESCAPED_QUOTE.findall(body)) % 2 == 1


def _hermes_calls(text: str) -> list[Call] | None:
    if "<tool_call>" not in text:
        return None
    blocks, unclosed = _tool_call_blocks(text)
    calls: list[Call] = []
    for i, block in enumerate(blocks):
        calls.extend(_json_payload_calls(block.strip(), f"<tool_call> block {i + 1}"))
    if unclosed is not None:
        try:
            calls.extend(_json_payload_calls(unclosed.strip(), "unclosed <tool_call>"))
        except ParseError as e:
            raise ParseError(f"{TRUNCATED_PREFIX}tool call cut off: {e}") from None
    return calls


_MISTRAL_TAG, _MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
_PYTHON_TAG = "<|python_tag|>"


def _mistral_calls(text: str) -> list[Call] | None:
    """Mistral's `[TOOL_CALLS]` output, both generations of the format; None when the marker is absent."""
    if _MISTRAL_TAG not in text:
        return None
    segments = [seg.strip() for seg in text.split(_MISTRAL_TAG)[1:]]
    if len(segments) == 1 and segments[0][:1] == "[":  # v3: one JSON list of {name, arguments}
        return _json_payload_calls(segments[0], _MISTRAL_TAG)
    calls = []
    for i, seg in enumerate(segments):
        name, sep, payload = seg.partition(_MISTRAL_ARGS)
        where = f"{_MISTRAL_TAG} call {i + 1}"
        if not sep:
            calls.extend(_json_payload_calls(seg, where))
            continue
        name = name.split("[CALL_ID]")[0].strip()  # some versions put a call id between the name and [ARGS]
        calls.append(make_call(name, payload.strip() or "{}", where))
    return calls


def _json_sequence(t: str) -> list | None:
    """`{...}; {...}` (Llama 3's separator for several calls) -> its objects; None when not such a sequence."""
    decoder, items, pos = json.JSONDecoder(), [], 0
    while pos < len(t):
        try:
            _, end = decoder.raw_decode(t, pos)
        except ValueError:
            return None
        items.append(loads_canonical(t[pos:end]))
        pos = end
        while pos < len(t) and t[pos] in " \n\t;":
            pos += 1
    return items if len(items) > 1 else None


def _bare_json_calls(text: str) -> list[Call] | None:
    """A whole-text JSON tool call (or list of them); None when the text is not shaped like one."""
    t = text.strip()
    if t.startswith(_PYTHON_TAG):
        t = t[len(_PYTHON_TAG):].strip()
    m = _FENCE_RE.match(t)
    if m:
        t = m.group(1)
    if not t or t[0] not in "{[" or t[-1] not in "}]":
        return None
    try:
        obj = loads_canonical(t)
    except (ValueError, RecursionError):
        obj = _json_sequence(t)
        if obj is None:
            return None  # JSON-looking prose: a message
    if isinstance(obj, dict) and isinstance(obj.get("tool_calls"), list):
        return [_call_from_obj(c, "tool_calls") for c in obj["tool_calls"] if isinstance(c, dict)] or None
    if _is_call_dict(obj) or (isinstance(obj, dict) and isinstance(obj.get("function"), dict)):
        return [_call_from_obj(obj, "JSON tool call")]
    if isinstance(obj, list) and obj and all(_is_call_dict(o) for o in obj):
        return [_call_from_obj(o, f"JSON tool call [{i}]") for i, o in enumerate(obj)]
    return None


def _parse_text(text: str) -> Parsed:
    text = _strip_reasoning(text)
    # a text that opens with a JSON call is that call: a "<tool_call>" or "[TOOL_CALLS]" in its arguments is data
    opens_json = text.lstrip()[:1] in ("{", "[")
    calls = _bare_json_calls(text) if opens_json else None
    if calls is None:
        calls = _hermes_calls(text)
    if calls is None and not opens_json:
        calls = _bare_json_calls(text)
    if calls is None:
        calls = _mistral_calls(text)
    if calls:
        return _calls_parsed(calls)
    if not text.strip():
        raise ParseError("empty completion")
    return Parsed("text", text.strip(), ())


# ---------------------------------------------------------------------------------------------------
# dicts and lists


def _content_text(content: Any) -> str:
    """Message content as str (core/shapes.content_text's rule, None as ""); anything else is a parse error."""
    try:
        return content_text(content) or ""
    except ContentError as e:
        raise ParseError(f"message content: {e}") from None


def _parse_action_dict(obj: dict, expected: bool = False) -> Parsed:
    """An action dict; `expected`: the expert's, whose calls keep their `acceptable` (a candidate's is ignored)."""
    kind = obj.get("type")
    one_call = _expected_call if expected else _call_from_obj
    if kind == "function_call":
        return _calls_parsed([one_call({"name": obj.get("name"), "arguments": obj.get("arguments"),
                                        "acceptable": obj.get("acceptable")}, "function_call")])
    if kind == "function_call_batch":
        calls = obj.get("calls")
        if not isinstance(calls, list) or not calls:
            raise ParseError("function_call_batch needs a non-empty 'calls' list")
        return _calls_parsed([one_call(c, f"batch call {i}") if isinstance(c, dict)
                              else _raise(f"batch call {i} is not an object") for i, c in enumerate(calls)])
    if kind == "message":
        return Parsed("text", _content_text(obj.get("content")).strip(), ())
    raise ParseError(f"unknown action type {kind!r}")


def _raise(msg: str):
    raise ParseError(msg)


def _parse_dict(obj: dict) -> Parsed:
    if obj.get("type") in ("function_call", "function_call_batch", "message") and "role" not in obj:
        return _parse_action_dict(obj)
    if "tool_calls" in obj or "role" in obj or "content" in obj:  # a chat message
        tool_calls = obj.get("tool_calls") or []
        if not isinstance(tool_calls, list):
            raise ParseError("tool_calls must be a list")
        if tool_calls:
            return _calls_parsed([_call_from_obj(c, f"tool_calls[{i}]") if isinstance(c, dict)
                                  else _raise(f"tool_calls[{i}] is not an object") for i, c in enumerate(tool_calls)])
        return _parse_text(_content_text(obj.get("content")))
    if _is_call_dict(obj) or isinstance(obj.get("function"), dict):
        return _calls_parsed([_call_from_obj(obj, "tool call")])
    raise ParseError(f"unrecognized candidate object with keys {sorted(obj)[:8]}")


def _parse_list(items: list) -> Parsed:
    """Responses output items and/or tool-call objects; calls win, text items are joined."""
    calls, texts = [], []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ParseError(f"item {i} is not an object")
        t = item.get("type")
        if t == "reasoning":
            continue
        if t == "message" or "role" in item:
            texts.append(_content_text(item.get("content")))
        elif t in ("function_call", "function") or _is_call_dict(item) or isinstance(item.get("function"), dict):
            calls.append(_call_from_obj(item, f"item {i}"))
        else:
            raise ParseError(f"item {i}: unrecognized output item type {t!r}")
    if calls:
        return _calls_parsed(calls)
    return _parse_text("\n".join(texts))


# ---------------------------------------------------------------------------------------------------
# entry points


@lru_cache(maxsize=131072)
def _prepare_text_cached(text: str) -> tuple[Parsed | None, str | None]:
    try:
        return _parse_text(text), None
    except ParseError as e:
        return None, str(e)
    except RecursionError:
        return None, "completion nested too deeply"


def prepare_candidate(candidate: Any) -> tuple[Parsed | None, str | None]:
    """Candidate (text, bytes, dict, list) -> (Parsed, None) or (None, one-line error). Never raises."""
    if isinstance(candidate, str):
        return _prepare_text_cached(candidate)
    if isinstance(candidate, (bytes, bytearray)):
        return _prepare_text_cached(bytes(candidate).decode("utf-8", errors="replace"))
    if isinstance(candidate, (dict, list)):
        try:  # numbers canonical (1.0 -> 1) and only JSON types from here on, as for parsed text
            candidate = reload_canonical(candidate)
        except (TypeError, ValueError, RecursionError) as e:
            return None, f"candidate is not JSON-serializable ({_short(e)})"
    try:
        if isinstance(candidate, dict):
            return _parse_dict(candidate), None
        if isinstance(candidate, list):
            return _parse_list(candidate), None
    except ParseError as e:
        return None, str(e)
    except RecursionError:
        return None, "candidate nested too deeply"
    return None, f"unsupported candidate type {type(candidate).__name__}"


@lru_cache(maxsize=65536)
def _prepare_expected_text(text: str) -> tuple[Parsed | None, str | None]:
    try:
        obj = loads_canonical(text)
    except (ValueError, RecursionError) as e:
        return None, f"expected_action is not valid JSON ({_short(e)})"
    if not isinstance(obj, dict):
        return None, "expected_action must be a JSON object"
    try:
        return _parse_action_dict(obj, expected=True), None
    except ParseError as e:
        return None, f"expected_action: {e}"
    except RecursionError:
        return None, "expected_action nested too deeply"


def prepare_expected(expected: Any) -> tuple[Parsed | None, str | None]:
    """Expert action (dict or its JSON text) -> (Parsed, None) or (None, error). Cached on the JSON text."""
    if isinstance(expected, str):
        return _prepare_expected_text(expected)
    if isinstance(expected, dict):
        try:
            text = json.dumps(expected, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as e:
            return None, f"expected_action is not JSON-serializable ({_short(e)})"
        return _prepare_expected_text(text)
    return None, f"expected_action must be an action object, got {type(expected).__name__}"


def parsed_to_action(parsed: Parsed) -> dict:
    """Internal parsed form -> action dict in core/shapes.py's shape (arguments as canonical JSON text)."""
    if parsed.kind == "text":
        return {"type": "message", "content": parsed.text}
    calls = [{"type": "function_call", "name": c.name, "arguments": c.key} for c in parsed.calls]
    if len(calls) == 1:
        return calls[0]
    return {"type": "function_call_batch", "calls": calls}


def parse_candidate(text_or_obj: Any) -> tuple[dict | None, str | None]:
    """Raw completion (or action/message dict) -> (action, None) or (None, one-line error). Never raises."""
    parsed, err = prepare_candidate(text_or_obj)
    if parsed is None:
        return None, err
    return parsed_to_action(parsed), None
