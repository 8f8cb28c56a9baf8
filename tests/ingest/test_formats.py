"""Ingestion: each format, auto-detection, readers, garbage quarantine, dedup, and exact counts on real data."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pivot_assets.core.catalog import TRAJECTORY_SCHEMA
from pivot_assets.ingest import formats
from pivot_assets.ingest.formats import detect_format
from tests.ingest.reference import ingest_to_tables, iter_ingest

TOOLS_CHAT = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
OPENAI_RECORD = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "need the tool",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ],
    "tools": TOOLS_CHAT,
    "success": True,
    "domain": "weather",
}


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def ingest_one(tmp_path: Path, record: dict, fmt: str = "auto", domain: str | None = None) -> tuple[str, dict]:
    path = write_jsonl(tmp_path / "one.jsonl", [record])
    (result,) = list(iter_ingest([{"path": str(path), "format": fmt, "domain": domain}]))
    return result


def roles(row: dict) -> list[str]:
    return [m["role"] for m in row["messages"]]


# ---------------------------------------------------------------------------------------------- formats


def test_openai_record(tmp_path):
    kind, row = ingest_one(tmp_path, OPENAI_RECORD)
    assert kind == "trajectory"
    assert row["source_format"] == "openai" and row["domain"] == "weather" and row["outcome_reward"] == 1.0
    assert roles(row) == ["system", "user", "assistant", "tool", "assistant"]
    call_msg = row["messages"][2]
    assert call_msg["reasoning"] == "need the tool" and call_msg["content"] == "Checking."
    assert call_msg["tool_calls"] == [{"id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'}]
    assert row["messages"][3]["tool_call_id"] == "c1"
    assert json.loads(row["tools"]) == TOOLS_CHAT
    # every canonical message carries all five keys
    assert all(set(m) == {"role", "content", "reasoning", "tool_calls", "tool_call_id"} for m in row["messages"])


def test_openai_object_arguments_and_missing_ids(tmp_path):
    record = {"traj": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": 2}}},
                                             {"function": {"name": "g", "arguments": ""}}]},
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
        {"role": "assistant", "content": "done"},
    ], "score": 0.5}
    kind, row = ingest_one(tmp_path, record, domain="forced")
    assert kind == "trajectory" and row["domain"] == "forced" and row["outcome_reward"] == 0.5
    calls = row["messages"][1]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_1_0", "call_1_1"]
    assert [c["arguments"] for c in calls] == ['{"a":2,"b":1}', "{}"]
    assert [m["tool_call_id"] for m in row["messages"][2:4]] == ["call_1_0", "call_1_1"]


def test_input_domain_wins_and_default(tmp_path):
    assert ingest_one(tmp_path, OPENAI_RECORD, domain="airline")[1]["domain"] == "airline"
    record = {k: v for k, v in OPENAI_RECORD.items() if k != "domain"}
    assert ingest_one(tmp_path, record)[1]["domain"] == "default"


RESPONSES_RECORD = {
    "responses_create_params": {
        "instructions": "You are helpful.",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Rome?"}]}],
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather of a city.",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True}],
    },
    "response": {"output": [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "fc1", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
        {"type": "function_call", "call_id": "fc2", "name": "get_weather", "arguments": "{\"city\":\"Milan\"}"},
        {"type": "function_call_output", "call_id": "fc1", "output": "rain"},
        {"type": "function_call_output", "call_id": "fc2", "output": "sun"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "answer now"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Rain in Rome."}]},
    ]},
    "reward": 1,
}


def test_responses_merge_rule(tmp_path):
    kind, row = ingest_one(tmp_path, RESPONSES_RECORD)
    assert kind == "trajectory" and row["source_format"] == "responses" and row["outcome_reward"] == 1.0
    assert roles(row) == ["system", "user", "assistant", "tool", "tool", "assistant"]
    first = row["messages"][2]  # reasoning + text + two calls with no output between them: ONE model call
    assert first["reasoning"] == "think" and first["content"] == "Let me look."
    assert [c["id"] for c in first["tool_calls"]] == ["fc1", "fc2"]
    assert row["messages"][5]["reasoning"] == "answer now" and row["messages"][5]["content"] == "Rain in Rome."
    assert json.loads(row["tools"])[0] == {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def test_responses_pivot_row_appends_expected_action(tmp_path):
    record = {"responses_create_params": {"input": "Weather in Oslo?"},
              "expected_action": {"type": "function_call", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
              "response": {"output": [{"type": "message", "role": "assistant", "content": "wrong sample"}]},
              "reward": 0.0}
    kind, row = ingest_one(tmp_path, record)
    assert roles(row) == ["user", "assistant"]
    assert row["messages"][1]["tool_calls"] == [{"id": "call_1_0", "name": "get_weather", "arguments": '{"city":"Oslo"}'}]
    assert row["outcome_reward"] is None  # the reward scored the policy sample, not the expert trajectory


def test_tau2_results_file(tmp_path):
    results = {
        "info": {"environment_info": {"domain_name": "airline", "policy": "# Policy", "tool_defs": None}},
        "tasks": [],
        "simulations": [
            {"messages": [
                {"role": "assistant", "content": "Hi! How can I help you today?", "tool_calls": None},
                {"role": "user", "content": "Cancel ABC123"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "t1", "name": "get_reservation_details", "arguments": {"reservation_id": "ABC123"}}]},
                {"role": "tool", "id": "t1", "content": "{}"},
                {"role": "assistant", "content": "Done."},
            ], "reward_info": {"reward": 0.0}},
            {"messages": [{"role": "narrator", "content": "?"}], "reward_info": {"reward": 1.0}},
        ],
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(results))
    out = list(iter_ingest([{"path": str(path)}]))
    assert [k for k, _ in out] == ["trajectory", "quarantine"]
    row = out[0][1]
    assert row["source_format"] == "tau2" and row["domain"] == "airline" and row["outcome_reward"] == 0.0
    assert roles(row) == ["system", "assistant", "user", "assistant", "tool", "assistant"]
    assert row["messages"][0]["content"] == "# Policy" and row["tools"] == "[]"
    assert row["messages"][3]["tool_calls"][0]["arguments"] == '{"reservation_id":"ABC123"}'
    assert row["messages"][4]["tool_call_id"] == "t1"
    assert out[1][1]["record"] == 1 and out[1][1]["reason"].startswith("unknown_role:")


def test_sharegpt(tmp_path):
    record = {"system": "sys", "tools": json.dumps(TOOLS_CHAT), "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
        {"from": "observation", "value": "sunny"},
        {"from": "gpt", "value": "Sunny."},
    ]}
    kind, row = ingest_one(tmp_path, record)
    assert kind == "trajectory" and row["source_format"] == "sharegpt"
    assert roles(row) == ["system", "user", "assistant", "tool", "assistant"]
    assert row["messages"][2]["tool_calls"] == [{"id": "call_2_0", "name": "get_weather", "arguments": '{"city":"Paris"}'}]
    assert row["messages"][3]["tool_call_id"] == "call_2_0"


def test_detect_format():
    assert detect_format(OPENAI_RECORD) == "openai"
    assert detect_format(RESPONSES_RECORD) == "responses"
    assert detect_format({"messages": [], "reward_info": {}}) == "tau2"
    assert detect_format({"conversations": [{"from": "human", "value": "x"}]}) == "sharegpt"
    assert detect_format({"conversations": [{"role": "user", "content": "x"}]}) == "openai"
    assert detect_format({"prompt": "x"}) is None


def test_forced_format_mismatch(tmp_path):
    kind, row = ingest_one(tmp_path, OPENAI_RECORD, fmt="responses")
    assert kind == "quarantine" and row["reason"].startswith("format_mismatch:")


def test_same_trajectory_in_two_formats_is_one(tmp_path):
    sharegpt = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    openai = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    write_jsonl(tmp_path / "a.jsonl", [sharegpt])
    write_jsonl(tmp_path / "b.jsonl", [openai])
    kinds = [k for k, _ in iter_ingest([{"path": str(tmp_path / "*.jsonl")}])]
    assert kinds == ["trajectory", "duplicate"]


# ---------------------------------------------------------------------------------------------- readers


def test_json_list_parquet_and_hf_dataset(tmp_path):
    other = json.loads(json.dumps(OPENAI_RECORD))
    other["messages"][1]["content"] = "Weather in Lyon?"
    (tmp_path / "list.json").write_text(json.dumps([OPENAI_RECORD, other]))
    # Parquet with the message list stored as JSON text (a common layout)
    pq.write_table(pa.table({"messages": [json.dumps(OPENAI_RECORD["messages"])], "reward": [0.25]}),
                   tmp_path / "rows.parquet")
    import datasets

    hf_dir = tmp_path / "hf"
    datasets.Dataset.from_list([{"messages": json.dumps(other["messages"]), "tools": json.dumps(TOOLS_CHAT)}]).save_to_disk(str(hf_dir))
    trajectories, quarantine, counts = ingest_to_tables([{"path": str(tmp_path)}])
    assert counts == {"trajectory": 3, "quarantine": 0, "duplicate": 1, "read": 4}
    assert trajectories.schema.equals(TRAJECTORY_SCHEMA)
    # walk order is sorted: hf/ comes first, so list.json's second record is the duplicate of the HF row
    assert [Path(s).name for s in trajectories.column("source").to_pylist()] == ["hf", "list.json", "rows.parquet"]


def test_trajectories_parquet_reingests_to_the_same_rows(tmp_path):
    first, _, _ = ingest_to_tables([{"path": str(write_jsonl(tmp_path / "a.jsonl", [OPENAI_RECORD, RESPONSES_RECORD]))}])
    pq.write_table(first, tmp_path / "trajectories.parquet")
    again, quarantine, _ = ingest_to_tables([{"path": str(tmp_path / "trajectories.parquet")}])
    assert quarantine.num_rows == 0
    keep = ["trajectory_id", "domain", "messages", "tools", "outcome_reward"]
    assert again.select(keep).to_pylist() == first.select(keep).to_pylist()


def test_missing_input_path_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="input path not found"):
        list(iter_ingest([{"path": str(tmp_path / "nope.jsonl")}]))


# ---------------------------------------------------------------------------------------------- garbage


def test_garbage_file(tmp_path, monkeypatch):
    monkeypatch.setattr(formats.readers, "MAX_RECORD_BYTES", 4096)  # the readers apply the cap
    good_b = json.loads(json.dumps(OPENAI_RECORD))
    good_b["messages"][1]["content"] = "Weather in Nice?"

    def chat(*messages):
        return json.dumps({"messages": list(messages)}).encode()

    user = {"role": "user", "content": "hi"}
    lines = [
        json.dumps(OPENAI_RECORD).encode(),                                                 # 0 valid
        b'{"messages": [{"role": "user", "content": "hi"}',                                 # 1 truncated
        chat(user, {"role": "assistant", "content": 42}),                                   # 2 wrong type
        chat(user, {"role": "narrator", "content": "x"}),                                   # 3 unknown role
        chat(user, {"role": "tool", "tool_call_id": "nope", "content": "r"},
             {"role": "assistant", "content": "ok"}),                                       # 4 orphan tool result
        chat(user, {"role": "assistant", "tool_calls": [
            {"id": "a", "function": {"name": "f", "arguments": "{not json"}}]}),            # 5 bad arguments
        b'{"messages": [{"role": "user", "content": "caf\xe9"}]}',                          # 6 non-UTF-8
        chat(user, {"role": "assistant", "content": "x" * 5000}),                           # 7 oversized
        b"",                                                                                # blank: not a record
        json.dumps(good_b).encode(),                                                        # 9 valid
        json.dumps(OPENAI_RECORD).encode(),                                                 # 10 duplicate of 0
        chat(user, {"role": "assistant", "content": "  "}),                                 # 11 empty assistant
        chat(user),                                                                         # 12 no assistant turn
        b"[1, 2]",                                                                          # 13 not an object
    ]
    path = tmp_path / "garbage.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = list(iter_ingest([{"path": str(path)}]))
    by_record = {row["record"]: (kind, row) for kind, row in out}
    assert len(out) == len(by_record) == 13  # one outcome per record; the blank line is no record
    assert [r for r, (k, _) in by_record.items() if k == "trajectory"] == [0, 9]
    assert [r for r, (k, _) in by_record.items() if k == "duplicate"] == [10]
    expected = {1: "truncated_json", 2: "wrong_type", 3: "unknown_role", 4: "orphan_tool_result",
                5: "bad_arguments", 6: "non_utf8", 7: "oversized", 11: "empty_assistant_message",
                12: "no_assistant_turn", 13: "wrong_type"}
    quarantined = {r: row for r, (k, row) in by_record.items() if k == "quarantine"}
    assert {r: row["reason"].split(":")[0] for r, row in quarantined.items()} == expected
    for r, row in quarantined.items():
        assert "\n" not in row["reason"] and row["source"] == str(path)
        assert row["raw"] and len(row["raw"]) <= formats.RAW_CAP
    assert "(file line 2)" in quarantined[1]["reason"]
    assert quarantined[1]["raw"].startswith('{"messages"')
    counts = ingest_to_tables([{"path": str(path)}])[2]
    assert counts["read"] == counts["trajectory"] + counts["quarantine"] + counts["duplicate"] == 13


def test_unparseable_json_file_is_one_quarantined_record(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"messages": [')
    assert [(k, r["record"], r["reason"].split(":")[0]) for k, r in iter_ingest([{"path": str(path)}])] == [
        ("quarantine", 0, "truncated_json")]


def test_lone_surrogate_is_quarantined(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "ok"}]}\n')
    ((kind, row),) = list(iter_ingest([{"path": str(path)}]))
    assert kind == "quarantine" and row["reason"].startswith("non_utf8:")


# ---------------------------------------------------------------------------------------------- real data
# The expected counts come from the raw files with simple logic written here, not from the adapters.

ASSISTANT_SIDE = ("reasoning", "function_call")


def count_model_calls(items) -> int:
    """Maximal runs of assistant-side Responses items (reasoning, assistant message, function_call)."""
    if not isinstance(items, list):
        return 0
    runs, inside = 0, False
    for item in items:
        is_assistant = item.get("type") in ASSISTANT_SIDE or item.get("role") == "assistant"
        runs += is_assistant and not inside
        inside = is_assistant
    return runs


def expected_nemo_gym(root: Path) -> tuple[int, int, int]:
    """(trajectories, turns, records without any assistant turn) by direct counting over the raw JSONL."""
    seen, turns, no_turn = set(), 0, 0
    for path in sorted(root.rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            rcp = record["responses_create_params"]
            if "expected_action" in record:  # pivot row: input + the expected action
                key = json.dumps([rcp.get("instructions"), rcp["input"], rcp.get("tools"), record["expected_action"]], sort_keys=True)
                n = count_model_calls(rcp["input"]) + 1
            elif "response" in record:
                output = record["response"]["output"]
                key = json.dumps([rcp.get("instructions"), rcp["input"], rcp.get("tools"), output], sort_keys=True)
                n = count_model_calls(rcp["input"]) + count_model_calls(output)
            else:
                no_turn += 1
                continue
            if key not in seen:
                seen.add(key)
                turns += n
    return len(seen), turns, no_turn


def turn_count(rows: list[dict]) -> int:
    return sum(m["role"] == "assistant" for row in rows for m in row["messages"])


def test_nemo_gym_counts(shared_data_dir):
    root = shared_data_dir / "nemo-gym"
    n_traj, n_turns, n_no_turn = expected_nemo_gym(root)
    n_lines = sum(1 for p in root.rglob("*.jsonl") for line in p.read_text().splitlines() if line.strip())
    trajectories, quarantine, counts = ingest_to_tables([{"path": str(root)}])
    assert counts["trajectory"] == n_traj and turn_count(trajectories.to_pylist()) == n_turns
    assert counts["quarantine"] == n_no_turn
    assert set(r.split(":")[0] for r in quarantine.column("reason").to_pylist()) <= {"no_assistant_turn"}
    assert counts["read"] == n_lines
    assert (n_traj, n_turns) == (50, 188)  # pinned so a change in the counting logic is noticed too


def test_tau2_counts(shared_data_dir):
    path = shared_data_dir / "tau2-bench" / "airline_run1.json"
    sims = json.loads(path.read_text())["simulations"]
    n_turns = sum(m["role"] == "assistant" for s in sims for m in s["messages"])
    n_unique = len({json.dumps(s["messages"], sort_keys=True) for s in sims})
    trajectories, _, counts = ingest_to_tables([{"path": str(shared_data_dir / "tau2-bench")}])
    assert counts == {"trajectory": n_unique, "quarantine": 0, "duplicate": len(sims) - n_unique, "read": len(sims)}
    rows = trajectories.to_pylist()
    assert turn_count(rows) == n_turns
    assert {r["domain"] for r in rows} == {"airline"} and all(r["outcome_reward"] is not None for r in rows)
    assert [r["record"] for r in rows] == list(range(len(sims)))
