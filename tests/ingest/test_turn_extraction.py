"""Turn extraction: the DuckDB fast path equals the Python reference; macros equal state_for_turn; edge rules."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from pivot_assets.core.catalog import TURNS_SCHEMA
from pivot_assets.core.ids import canonical_json, turn_id
from pivot_assets.ingest.sample_data import write_sample
from pivot_assets.ingest.turn_extraction import (
    extract_turns,
    extract_turns_parquet,
    state_for_turn,
    turn_macros_sql,
)
from tests.ingest.reference import ingest_to_tables


def ingest(tmp_path: Path, records: list[dict]):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    trajectories, quarantine, _ = ingest_to_tables([{"path": str(path)}])
    assert quarantine.num_rows == 0, quarantine.column("reason").to_pylist()
    return trajectories


def fast_and_reference(tmp_path: Path, trajectories) -> tuple[list[dict], list[dict]]:
    pq.write_table(trajectories, tmp_path / "trajectories.parquet")
    n = extract_turns_parquet(tmp_path / "trajectories.parquet", tmp_path / "turns.parquet", threads=2)
    fast = pq.read_table(tmp_path / "turns.parquet")
    assert fast.schema.equals(TURNS_SCHEMA) and fast.num_rows == n
    assert not (tmp_path / "turns.parquet.tmp").exists()
    reference = [turn for row in trajectories.to_pylist() for turn in extract_turns(row)]
    return fast.to_pylist(), reference


def test_fast_path_equals_reference_on_real_data(tmp_path, shared_data_dir):
    trajectories, _, _ = ingest_to_tables([{"path": str(shared_data_dir / "nemo-gym")},
                                            {"path": str(shared_data_dir / "tau2-bench")}])
    fast, reference = fast_and_reference(tmp_path, trajectories)
    assert len(reference) == 188 + 593
    assert fast == reference


def test_fast_path_equals_reference_on_sample_and_odd_text(tmp_path):
    sample = [json.loads(line) for line in write_sample(tmp_path / "s.jsonl", n=20).read_text().splitlines()]
    odd = 'quote " backslash \\ \\u001F ctl \x01\x0b\x1f\x1f tab\t nl\n é 😀 \u2028 </tag>'
    sample.append({"messages": [
        {"role": "user", "content": odd},
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {"q": odd}}},
                                             {"id": "b", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "assistant", "content": odd},
    ]})
    fast, reference = fast_and_reference(tmp_path, ingest(tmp_path, sample))
    assert fast == reference
    assert {t["action_kind"] for t in reference} == {"tool_call", "message", "tool_call_batch"}


def test_turn_rows_and_edge_rules(tmp_path):
    record = {"messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "I will check.", "reasoning": "secret plan",
         "tool_calls": [{"id": "c", "function": {"name": "lookup", "arguments": "{\"k\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "v"},
        {"role": "assistant", "content": "First part."},       # consecutive assistant messages:
        {"role": "assistant", "content": "Second part."},      # two turns
    ]}
    trajectories = ingest(tmp_path, [record])
    row = trajectories.to_pylist()[0]
    turns = extract_turns(row)
    assert [(t["message_index"], t["turn_index"], t["action_kind"]) for t in turns] == [
        (2, 0, "tool_call"), (4, 1, "message"), (5, 2, "message")]
    # text + tool call -> a tool-call action; reasoning never in the action
    assert json.loads(turns[0]["expert_action"]) == {"type": "function_call", "name": "lookup", "arguments": '{"k":1}'}
    assert "secret" not in turns[0]["expert_action"] and turns[0]["tool_names"] == ["lookup"]
    assert turns[0]["expert_action"] == canonical_json(json.loads(turns[0]["expert_action"]))
    assert turns[0]["turn_id"] == turn_id(row["trajectory_id"], 2)
    # the later consecutive assistant message's state contains the earlier one; the trailing one is a turn
    state = state_for_turn(row["messages"], turns[2]["message_index"])
    assert state[-1]["content"] == "First part." and len(state) == 5
    assert state[2]["reasoning"] == "secret plan" and state[2]["content"] == "I will check."
    assert json.loads(turns[2]["expert_action"]) == {"type": "message", "content": "Second part."}
    fast, reference = fast_and_reference(tmp_path, trajectories)
    assert fast == reference == turns


def test_macros_equal_python_state(tmp_path, shared_data_dir):
    trajectories, _, _ = ingest_to_tables([{"path": str(shared_data_dir / "nemo-gym")}])
    fast, _ = fast_and_reference(tmp_path, trajectories)
    con = duckdb.connect()
    con.execute(f"CREATE VIEW trajectories AS SELECT * FROM read_parquet('{tmp_path / 'trajectories.parquet'}')")
    con.execute(f"CREATE VIEW turns AS SELECT * FROM read_parquet('{tmp_path / 'turns.parquet'}')")
    con.execute(turn_macros_sql())
    by_id = {row["trajectory_id"]: row for row in trajectories.to_pylist()}
    for turn in fast[::7]:
        row = by_id[turn["trajectory_id"]]
        expected = state_for_turn(row["messages"], turn["message_index"])
        assert con.execute("SELECT turn_state(?, ?)", [turn["trajectory_id"], turn["message_index"]]).fetchone()[0] == expected
        assert con.execute("SELECT turn_state_of(?)", [turn["turn_id"]]).fetchone()[0] == expected
        assert con.execute("SELECT turn_tools_of(?)", [turn["turn_id"]]).fetchone()[0] == row["tools"]
        rows = con.execute("SELECT position, role, content FROM turn_state_messages(?)", [turn["turn_id"]]).fetchall()
        assert rows == [(i, m["role"], m["content"]) for i, m in enumerate(expected)]
    # the SQL twin of turn_id (schema.py docstring) holds for every row
    mismatched = con.execute("SELECT count(*) FROM turns WHERE turn_id <> "
                             "substr(md5(trajectory_id || ':' || message_index), 1, 16)").fetchone()[0]
    assert mismatched == 0


def test_missing_input_raises_and_leaves_no_output(tmp_path):
    with pytest.raises(duckdb.Error):
        extract_turns_parquet(tmp_path / "nope.parquet", tmp_path / "turns.parquet")
    assert not (tmp_path / "turns.parquet").exists()
