"""Tool-call parsing of the common model families, on outputs in the formats their chat templates and the
serving parsers (vLLM's hermes / llama3_json / mistral tool parsers) define, and TRUNCATED for outputs that ran
out of tokens."""

from __future__ import annotations

import json

import pytest

from pivot_assets.verifiers import build_verifier, parse_candidate
from pivot_assets.verifiers.base import Reason

PARIS = {"type": "function_call", "name": "get_weather", "arguments": '{"city":"Paris"}'}
BOTH = {"type": "function_call_batch", "calls": [PARIS, {**PARIS, "arguments": '{"city":"Rome"}'}]}

FORMATS = [
    # Hermes / Qwen2.5 / Qwen3: <tool_call> blocks, Qwen3 thinks first
    ("qwen3 thought + call",
     '<think>\nThe user asks for the weather in Paris, so I call get_weather.\n</think>\n\n'
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', PARIS),
    ("qwen3 template-opened thought", 'I need the weather tool.\n</think>\n\n'
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', PARIS),
    ("qwen parallel calls", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>', BOTH),
    # Llama 3.1 / 3.2 / 3.3 JSON tool calling (`parameters`, optional <|python_tag|>, `;` between calls)
    ("llama3 json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', PARIS),
    ("llama3 python_tag", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', PARIS),
    ("llama3 two calls", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '{"name": "get_weather", "parameters": {"city": "Rome"}}', BOTH),
    # Mistral: v3 tokenizers (7B-Instruct-v0.3) emit a JSON list; v11+ (Small 3.2, Magistral) name[ARGS]json
    ("mistral v3", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', PARIS),
    ("mistral v3 two calls", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "get_weather", "arguments": {"city": "Rome"}}]', BOTH),
    ("mistral v11", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', PARIS),
    ("mistral v11 two calls", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
     BOTH),
    ("mistral v13 call id", '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}', PARIS),
]


def _canonical(action: dict) -> dict:
    return parse_candidate(action)[0]


@pytest.mark.parametrize("label,completion,expected", FORMATS, ids=[f[0] for f in FORMATS])
def test_family_formats_parse_and_score(label, completion, expected):
    action, err = parse_candidate(completion)
    assert err is None, err
    assert action == _canonical(expected)
    score = build_verifier({"name": "tool_call"}).score(expected, completion)
    assert (score.reward, score.reason) == (1.0, Reason.OK)


def test_marker_inside_arguments_is_data():
    text = '{"name": "note", "arguments": {"text": "[TOOL_CALLS] and <|python_tag|>"}}'
    assert parse_candidate(text)[0] == _canonical({"type": "function_call", "name": "note",
                                                   "arguments": {"text": "[TOOL_CALLS] and <|python_tag|>"}})



def test_close_tag_inside_a_hermes_argument_is_data():
    """An argument whose value holds `</tool_call>` (or an escaped quote before it) does not end the block."""
    for value in ["</tool_call>", 'say \\"</tool_call>\\" twice </tool_call>']:
        args = {"text": value}
        text = f"<tool_call>\n{json.dumps({'name': 'note', 'arguments': args})}\n</tool_call>"
        assert parse_candidate(text)[0] == _canonical({"type": "function_call", "name": "note", "arguments": args})
    two = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert [c["name"] for c in parse_candidate(two)[0]["calls"]] == ["a", "b"]


TRUNCATIONS = [
    ("thought cut off", "<think>\nThe user wants the weather. First I should check whether"),
    ("call cut off", '<tool_call>\n{"name": "get_weather", "arguments": {"ci'),
    ("thought closed, call cut off", '<think>\nok\n</think>\n\n<tool_call>\n{"name": "get_weather", "argu'),
]


@pytest.mark.parametrize("label,completion", TRUNCATIONS, ids=[t[0] for t in TRUNCATIONS])
def test_truncated_outputs_are_truncated_not_wrong(label, completion):
    score = build_verifier({"name": "tool_call"}).score(PARIS, completion)
    assert (score.reward, score.reason) == (0.0, Reason.TRUNCATED)


def test_wrong_answers_stay_wrong():
    verifier = build_verifier({"name": "tool_call"})
    assert verifier.score(PARIS, '<think>hm</think>{"name": "get_time", "parameters": {}}').reason == Reason.UNEXPECTED_TOOL
    assert verifier.score(PARIS, "<tool_call>{name}</tool_call>").reason == Reason.PARSE_ERROR
