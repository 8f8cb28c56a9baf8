"""BFCL's function docs and possible answers -> JSON Schema tools and actions with `acceptable` (ingest/bfcl.py)."""

from __future__ import annotations

import jsonschema
import pytest

from pivot_assets.ingest.bfcl import BFCLError, bfcl_tools, expected_action, json_schema


def test_types_map_to_json_schema_at_every_level():
    doc = {"type": "dict", "properties": {
        "rate": {"type": "float"}, "point": {"type": "tuple", "items": {"type": "integer"}},
        "meta": {"type": "dict", "properties": {"x": {"type": "any"}}}, "type": {"type": "string"}},
        "required": ["rate"]}
    schema = json_schema(doc)
    assert schema == {"type": "object", "properties": {
        "rate": {"type": "number"}, "point": {"type": "array", "items": {"type": "integer"}},
        "meta": {"type": "object", "properties": {"x": {}}}, "type": {"type": "string"}}, "required": ["rate"]}
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate({"rate": 1, "point": [1, 2], "meta": {"x": [None]}}, schema)


def test_first_accepted_value_is_the_demonstration_and_every_value_is_kept():
    action = expected_action([{"math.hypot": {"x": [4], "y": [5], "z": ["", 0]}}])
    assert action == {"type": "function_call", "name": "math.hypot", "arguments": {"x": 4, "y": 5},
                      "acceptable": {"x": [4], "y": [5], "z": ["", 0]}}
    assert expected_action([{"f": {"unit": ["cm", ""]}}])["arguments"] == {"unit": "cm"}


def test_parallel_calls_are_a_batch_each_with_its_own_acceptable():
    action = expected_action([{"a": {"n": [1]}}, {"b": {"s": ["x", "X"]}}])
    assert action["type"] == "function_call_batch"
    assert [c["acceptable"] for c in action["calls"]] == [{"n": [1]}, {"s": ["x", "X"]}]


def test_dict_argument_takes_the_first_accepted_value_of_each_key():
    action = expected_action([{"f": {"loc": [{"city": ["Paris", "paris"], "zip": ["", "75001"]}]}}])
    assert action["arguments"] == {"loc": {"city": "Paris"}}


def test_list_of_dicts_takes_the_first_accepted_value_of_each_key_of_each_item():
    truth = [{"database.query": {"table": ["user"], "conditions": [[
        {"field": ["age"], "operation": [">"], "value": ["25"]}, {"field": ["job"], "operation": ["="], "value": ["", "x"]}]]}}]
    assert expected_action(truth)["arguments"] == {
        "table": "user", "conditions": [{"field": "age", "operation": ">", "value": "25"}, {"field": "job", "operation": "="}]}
    assert expected_action([{"f": {"xs": [[3, 5]]}}])["arguments"] == {"xs": [3, 5]}


@pytest.mark.parametrize("truth", [[], [{"f": {"x": []}}], [{"f": 3}], [{"f": {}, "g": {}}]])
def test_malformed_answers_raise_one_line_errors(truth):
    with pytest.raises(BFCLError, match="bfcl_answer"):
        expected_action(truth)


def test_tools_are_openai_function_schemas():
    tools = bfcl_tools([{"name": "f", "description": "d", "parameters": {"type": "dict", "properties": {}}}])
    assert tools == [{"type": "function", "function": {"name": "f", "description": "d",
                                                        "parameters": {"type": "object", "properties": {}}}}]
