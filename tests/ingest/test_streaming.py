"""Streaming ingest: the DuckDB chat adapter and the unit pipeline give exactly what the Python reference gives
(rows, ids, quarantine reasons, record numbers), on real data and on every odd case the SQL must hand back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest

from pivot_assets.core.catalog import QUARANTINE_SCHEMA, TRAJECTORY_SCHEMA
from pivot_assets.ingest import chat_sql, formats, streaming
from tests.ingest.reference import ingest_to_tables
from tests.tau2_chat import tau2_as_openai_chat

from .test_formats import OPENAI_RECORD, RESPONSES_RECORD


class Collect:
    """A ParquetWriter stand-in that keeps what is written."""

    def __init__(self, schema: pa.Schema):
        self.schema, self.tables = schema, []

    def write_table(self, table: pa.Table) -> None:
        assert table.schema.equals(self.schema), table.schema
        self.tables.append(table)

    def rows(self) -> list[dict]:
        return pa.concat_tables(self.tables).to_pylist() if self.tables else []


def streamed(inputs: list[dict], **kwargs) -> tuple[list[dict], list[dict], dict]:
    trajectories, quarantine = Collect(TRAJECTORY_SCHEMA), Collect(QUARANTINE_SCHEMA)
    counts = streaming.stream_ingest(inputs, trajectories, quarantine, **kwargs)
    return trajectories.rows(), quarantine.rows(), counts


def comparable(rows: list[dict]) -> list[dict]:
    """NaN rewards compare equal (a NaN reward is read as NaN by both adapters)."""
    return [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in rows]


def assert_same_as_reference(inputs: list[dict], **kwargs) -> dict:
    rows, quarantine, counts = streamed(inputs, **kwargs)
    ref_rows, ref_quarantine, ref_counts = ingest_to_tables(inputs)
    assert comparable(rows) == comparable(ref_rows.to_pylist())
    assert quarantine == ref_quarantine.to_pylist()
    assert (counts["read"], counts["ingested"], counts["quarantined"], counts["duplicates"]) == (
        ref_counts["read"], ref_counts["trajectory"], ref_counts["quarantine"], ref_counts["duplicate"])
    assert counts["read"] == counts["ingested"] + counts["quarantined"] + counts["duplicates"]
    return counts


def write_lines(path: Path, records: list) -> Path:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records))
    return path


def tau2_as_chat(shared_data_dir: Path) -> list[dict]:
    """The shared tau2 airline simulations as OpenAI chat records (string arguments, task ids, no tools)."""
    return tau2_as_openai_chat(json.loads((shared_data_dir / "tau2-bench" / "airline_run1.json").read_text()))


# ---------------------------------------------------------------------------------------------- real data


def test_real_shared_data_streams_like_the_reference(shared_data_dir):
    for name in ("nemo-gym", "tau2-bench", "bfcl"):
        assert_same_as_reference([{"path": str(shared_data_dir / name)}])


def test_tau2_as_chat_jsonl_goes_through_sql_and_matches(tmp_path, shared_data_dir):
    path = write_lines(tmp_path / "airline.jsonl", tau2_as_chat(shared_data_dir))
    counts = assert_same_as_reference([{"path": str(path)}])
    assert counts["by_adapter"].get("sql") == counts["ingested"] > 0  # the common case never falls back


def test_units_cut_mid_file_keep_line_numbers(tmp_path, shared_data_dir):
    records = tau2_as_chat(shared_data_dir)[:12]
    lines = [json.dumps(r).encode() for r in records]
    lines[3:3] = [b"", b"   ", b'{"messages": [{"role": "user"', b"\xff\xfe not utf-8"]  # blank, blank, truncated, bad bytes
    path = tmp_path / "cut.jsonl"
    path.write_bytes(b"\r\n".join(lines))  # CRLF, and no newline after the last line
    units = list(streaming.plan_units([{"path": str(path)}], unit_bytes=30_000))
    assert len(units) > 3 and sum(u.length for u in units) == path.stat().st_size
    assert_same_as_reference([{"path": str(path)}], unit_bytes=30_000)


def test_worker_processes_give_the_same_rows(tmp_path, shared_data_dir):
    path = write_lines(tmp_path / "airline.jsonl", tau2_as_chat(shared_data_dir) * 2)  # second half: duplicates
    counts = assert_same_as_reference([{"path": str(path)}, {"path": str(shared_data_dir / "nemo-gym")}],
                                      workers=2, unit_bytes=200_000)
    assert counts["workers"] == 2 and counts["duplicates"] >= 50


# ---------------------------------------------------------------------------------------------- what SQL hands back


def _chat(*messages, **extra) -> dict:
    return {"messages": list(messages), **extra}


USER = {"role": "user", "content": "Book it."}
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "book", "arguments": '{"b": 2, "a": 1}'}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
REPLY = {"role": "assistant", "content": "Done."}

ODD_RECORDS = [
    OPENAI_RECORD, RESPONSES_RECORD,
    _chat(USER, CALL, RESULT, REPLY, reward=True, metadata={"domain": "shop"}, task_id=7),
    _chat(USER, CALL, RESULT, REPLY, reward=None, success=1.0),           # a null reward wins over a later key
    _chat(USER, CALL, RESULT, REPLY, score=0.25, session_id="s-1", conversation_id="conv-9"),
    _chat(USER, CALL, RESULT, REPLY, reward="high"),                      # wrong type
    _chat(USER, {**CALL, "tool_calls": [{"function": {"name": "book", "arguments": {"z": [1, {"y": 2.5}], "a": None}}}]},
          {"role": "tool", "content": "ok"}, REPLY),                      # object arguments, generated id, id-less result
    _chat(USER, {**CALL, "tool_calls": [{"id": "", "name": "book", "arguments": ""}]}, {**RESULT, "tool_call_id": "call_1_0"}, REPLY),
    _chat(USER, {**CALL, "tool_calls": [{"id": "c1", "function": {"name": "book", "arguments": "not json"}}]}, RESULT, REPLY),
    _chat(USER, {**CALL, "tool_calls": [{"id": "c1", "function": {"name": "book", "arguments": "[1]"}}]}, RESULT, REPLY),
    _chat(USER, {**CALL, "tool_calls": [{"id": "c1", "function": {"name": "book", "arguments": '{"a": 1, "a": 2}'}}]}, RESULT, REPLY),
    _chat(USER, {**CALL, "tool_calls": [{"id": "c1", "function": {"name": "book", "arguments": '{"n": 123456789012345678901234}'}}]}, RESULT, REPLY),
    _chat(USER, {**CALL, "tool_calls": [{"id": "c1", "function": {"name": "", "arguments": "{}"}}]}, RESULT, REPLY),
    _chat(USER, {**CALL, "tool_calls": "book"}, REPLY),                   # tool_calls not a list
    _chat(USER, {**CALL, "tool_calls": [5]}, REPLY),
    _chat(USER, {**CALL, "function_call": {"name": "book", "arguments": "{}"}}, REPLY),
    _chat(USER, {"role": "tool", "tool_call_id": "nope", "content": "x"}, REPLY),          # orphan
    _chat(USER, RESULT, CALL, REPLY),                                     # answers a call made later
    _chat(USER, {"role": "assistant", "content": "\u3000 \n"}),           # empty by str.isspace
    _chat(USER, {"role": "assistant", "content": "\x85"}),
    _chat(USER),                                                          # no assistant turn
    _chat({"role": "narrator", "content": "x"}, REPLY),
    _chat({"role": "developer", "content": "Be nice."}, {"role": "human", "content": "hi"},
          {"role": "assistant", "content": "hi", "reasoning_content": "greet"},
          {"role": "function", "tool_call_id": "zz", "content": "x"}),      # mapped roles, orphan via function role
    _chat({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, REPLY),
    _chat({"role": "user", "content": 42}, REPLY),
    _chat({"role": "user", "content": "x", "tool_calls": [{"id": "c"}]}, REPLY),
    _chat({"role": "user", "content": "x", "tool_calls": []}, {**REPLY, "thinking": "hm", "reasoning": None}),
    _chat({"role": "user", "content": "ctl \u0001\u001f\u007f é 😀 \\ \" / \u2028"}, {**REPLY, "content": "tab\tnew\nline"}),
    _chat({"role": "user", "content": "opening"}, REPLY, tools='[{"name": "book", "parameters": {"type": "object"}}]'),
    _chat({"role": "user", "content": "bad tools"}, REPLY, tools={"name": "book"}),
    _chat({"role": "assistant", "content": "I start."}, USER, REPLY),     # no user before the first assistant
    {"traj": [USER, REPLY], "messages": [USER, REPLY]},
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
    {"messages": [USER, REPLY], "note": "mentions \"reward_info\" in passing"},
    [1, 2], "just a string", {"messages": {"role": "user"}},
]
RAW_LINES = [
    b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],}',  # trailing comma
    b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "reward": nan}',
    b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "reward": NaN}',
    b'{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "yo"}]}',
    b'{"messages": [{"role": "user", "content": "\\u0000"}, {"role": "assistant", "content": "yo"}]}',
    b'{"messages": [{"role": "user", "cont\\u0065nt": [1]}, {"role": "assistant", "content": "yo"}]}',
    b'{"messages": [{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00"}, {"role": "assistant", "content": "yo"}]}',
    b'{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "task_id": 12345678901234567890123}',
    b'{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "task_id": true, "session_id": 5}',
]


@pytest.mark.parametrize("fmt", ["auto", "openai"])
def test_odd_records_match_the_reference(tmp_path, fmt):
    path = write_lines(tmp_path / "odd.jsonl", ODD_RECORDS + RAW_LINES + ODD_RECORDS)  # second copy: duplicates
    counts = assert_same_as_reference([{"path": str(path), "format": fmt}])
    assert counts["quarantined"] > 10 and counts["duplicates"] > 5


def test_each_odd_record_alone_matches_the_reference(tmp_path):
    """One record per file, so a difference names its record (the SQL adapter sees it with no neighbours)."""
    for i, record in enumerate(ODD_RECORDS + RAW_LINES):
        path = write_lines(tmp_path / f"r{i}.jsonl", [record])
        try:
            assert_same_as_reference([{"path": str(path)}])
        except AssertionError as err:
            raise AssertionError(f"record {i}: {record!r:.200}") from err


def test_sql_adapter_accepts_the_plain_cases_and_hands_back_the_rest(tmp_path):
    path = write_lines(tmp_path / "odd.jsonl", ODD_RECORDS + RAW_LINES)
    lines = streaming.split_lines(path.read_bytes(), 0)
    accepted = set(chat_sql.accepted_records(chat_sql.connect(), lines.select(["line_no", "line"]))
                   .column("line_no").to_pylist())
    # plain chat records: generated ids, duplicate argument keys (canonicalized in Python), empty user tool_calls,
    # control characters, tools as JSON text, an assistant first, unicode escapes, non-string ids
    assert {0, 2, 4, 7, 10, 26, 27, 28, 30, 31, 33, len(ODD_RECORDS) + 6, len(ODD_RECORDS) + 8} <= accepted
    # every case whose outcome SQL cannot prove equal: another format, an ambiguous or wrong reward, a result
    # without an id, bad or rounded arguments, odd shapes, empty or unknown messages, parser differences
    handed_back = {1, 3, 5, 6, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 29, 32, 34, 35, 36}
    handed_back |= {len(ODD_RECORDS) + i for i in (0, 1, 2, 3, 4, 5, 7)}
    assert not accepted & handed_back, sorted(accepted & handed_back)


def test_forced_other_format_skips_the_sql_adapter(tmp_path):
    path = write_lines(tmp_path / "chat.jsonl", [OPENAI_RECORD])
    counts = assert_same_as_reference([{"path": str(path), "format": "tau2"}])
    assert counts["by_adapter"].get("sql", 0) == 0


def test_input_domain_overrides_in_both_adapters(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [OPENAI_RECORD, _chat(USER, CALL, RESULT, REPLY, reward=1)])
    rows, _, counts = streamed([{"path": str(path), "domain": "forced"}])
    assert {r["domain"] for r in rows} == {"forced"} and counts["by_adapter"]["sql"] == 2
    assert_same_as_reference([{"path": str(path), "domain": "forced"}])


def test_parquet_and_hf_inputs_stream_in_units(tmp_path):
    first, _, _ = ingest_to_tables([{"path": str(write_lines(tmp_path / "a.jsonl", ODD_RECORDS))}])
    import pyarrow.parquet as pq

    pq.write_table(first, tmp_path / "own.parquet", row_group_size=3)
    units = list(streaming.plan_units([{"path": str(tmp_path / "own.parquet")}], unit_records=4))
    assert [u.kind for u in units] == ["parquet"] * len(units) and len(units) > 2
    assert_same_as_reference([{"path": str(tmp_path / "own.parquet")}])
    rows, _, _ = streamed([{"path": str(tmp_path / "own.parquet")}])
    assert [r["conversation_id"] for r in rows] == first.column("conversation_id").to_pylist()  # kept on re-ingest


def test_units_of_missing_input_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="input path not found"):
        streamed([{"path": str(tmp_path / "nope.jsonl")}])


def test_records_never_go_missing_in_a_unit(tmp_path):
    unit = streaming.Unit("jsonl", str(write_lines(tmp_path / "u.jsonl", ODD_RECORDS)), "auto", None,
                          0, (tmp_path / "u.jsonl").stat().st_size, 0)
    result = streaming.run_unit(unit)
    assert result.read == len(ODD_RECORDS) == result.trajectories.num_rows + result.quarantine.num_rows
    records = sorted(result.trajectories.column("record").to_pylist() + result.quarantine.column("record").to_pylist())
    assert records == list(range(len(ODD_RECORDS)))
    assert formats.MAX_RECORD_BYTES == chat_sql.MAX_RECORD_BYTES


def test_the_listed_whitespace_is_every_code_point_python_strips():
    """chat_sql's regex class of str.isspace() characters is a list: it must be exactly what a scan finds."""
    import sys

    from pivot_assets.ingest.chat_sql import ISSPACE_CODE_POINTS

    assert list(ISSPACE_CODE_POINTS) == [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
