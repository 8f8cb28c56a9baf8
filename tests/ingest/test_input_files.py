"""Input files as a new user hands them over: compressed (.gz, .zst), JSON Lines named .json, files that are not
data (counted and named, never silently skipped), and an input with no record at all (a one-line failure)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import zstandard

from pivot_assets.ingest import files, streaming
from pivot_jobs.cli import main as pivot
from tests.ingest.reference import ingest_to_tables

from .test_streaming import assert_same_as_reference, streamed


def chat(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Where is order {i}?"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c1", "type": "function", "function": {"name": "find", "arguments": {"id": i}}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": f"order {i}: shipped"},
                         {"role": "assistant", "content": f"Order {i} has shipped."}]}


def jsonl(records: list) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


def write(path: Path, data: bytes) -> Path:
    if path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def test_a_new_users_directory_through_pivot_run(tmp_path, monkeypatch, capsys):
    """a.jsonl.gz (3 chat records), b.json.zst (a JSON list of 2), c.txt: 5 records, c.txt named as skipped; a
    directory holding only c.txt fails the run in one line."""
    import dagster as dg

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    data, empty = tmp_path / "data", tmp_path / "empty"
    data.mkdir(), empty.mkdir()
    write(data / "a.jsonl.gz", jsonl([chat(i) for i in range(3)]))
    write(data / "b.json.zst", json.dumps([chat(i) for i in range(3, 5)]).encode())
    for folder in (data, empty):
        (folder / "c.txt").write_text("notes, not data")
    (tmp_path / "pivot.yaml").write_text(f"warehouse: ./wh\ninputs:\n  - path: {data}\n")
    assert pivot(["run", "--select", "trajectories,turns"]) == 0
    meta = {k: v.value for k, v in dg.DagsterInstance.get().get_latest_materialization_event(
        dg.AssetKey("trajectories")).asset_materialization.metadata.items()}
    assert (meta["read"], meta["ingested"], meta["quarantined"], meta["duplicates"]) == (5, 5, 0, 0)
    assert meta["skipped_files"] == 1 and meta["skipped"] == [
        {"path": str(data / "c.txt"), "reason": files.skip_reason(data / "c.txt")}]
    assert "skipped 1 file(s), not read as records" in capsys.readouterr().err

    (tmp_path / "empty.yaml").write_text(f"warehouse: ./wh_empty\ninputs:\n  - path: {empty}\n")
    assert pivot(["run", "--config", "empty.yaml", "--select", "trajectories"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and err[0].endswith(
        f"inputs.0 ({empty}): no records in it; 1 file(s) skipped (c.txt: {files.skip_reason(empty / 'c.txt')})")


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst"])
def test_compressed_and_dot_json_lines_stream_like_the_reference(tmp_path, suffix):
    """Units cut mid-file (compressed: decompressed blocks carried by the unit), a bad line quarantined alone with
    its line number, every chat line through the SQL adapter."""
    records = [chat(i) for i in range(40)]
    records[7] = b'{"messages": [broken'
    path = write(tmp_path / f"in{suffix}", jsonl(records))
    units = list(streaming.plan_units([{"path": str(path)}], unit_bytes=2_000))
    assert len(units) > 3 and {u.kind for u in units} == {"jsonl"}
    assert all((u.data is not None) == bool(files.compression(path)) for u in units)
    counts = assert_same_as_reference([{"path": str(path)}], unit_bytes=2_000)
    assert (counts["read"], counts["ingested"], counts["quarantined"]) == (40, 39, 1)
    assert counts["by_adapter"].get("sql") == 39
    _, quarantine, _ = streamed([{"path": str(path)}], unit_bytes=2_000)
    assert quarantine[0]["record"] == 7 and quarantine[0]["reason"].endswith("(file line 8)")


def test_a_json_document_that_breaks_says_where(tmp_path):
    text = json.dumps([chat(0), chat(1)], indent=1)
    broken = text.replace('"Where is order 1?"', '"Where is order 1?" oops', 1)
    path = write(tmp_path / "doc.json.gz", broken.encode())
    line = broken[: broken.index("oops")].count("\n") + 1
    counts = assert_same_as_reference([{"path": str(path)}])
    assert (counts["read"], counts["quarantined"]) == (1, 1)
    _, quarantine, _ = ingest_to_tables([{"path": str(path)}])
    assert quarantine.column("reason").to_pylist()[0].startswith(f"invalid_json: Expecting ',' delimiter at line {line} ")
    assert files.json_layout(path) == "document"


def test_what_a_directory_skips_and_why(tmp_path):
    for name in ("a.jsonl", "b.json.gz", "c.txt", "d.parquet.gz", "e", "possible_answer/a.jsonl",
                 "multi_turn_func_doc/x.json", "sub/f.jsonl.zst"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    found, skipped = files.scan(str(tmp_path))
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["a.jsonl", "b.json.gz", "sub/f.jsonl.zst"]
    reasons = {Path(p).relative_to(tmp_path).as_posix(): r for p, r in skipped}
    assert set(reasons) == {"c.txt", "d.parquet.gz", "e", "possible_answer/a.jsonl", "multi_turn_func_doc/x.json"}
    assert reasons["c.txt"].startswith("not a data file (.txt;") and reasons["e"].startswith("not a data file (no suffix")
    assert reasons["d.parquet.gz"].startswith("compressed Parquet")
    assert reasons["possible_answer/a.jsonl"].startswith("BFCL possible answers")
    # a file named alone is read whatever its name says
    assert files.scan(str(tmp_path / "c.txt")) == ([tmp_path / "c.txt"], [])


def test_an_input_of_empty_files_fails_even_beside_one_with_records(tmp_path):
    (tmp_path / "full").mkdir(), (tmp_path / "hollow").mkdir()
    write(tmp_path / "full" / "a.jsonl.gz", jsonl([chat(0)]))
    (tmp_path / "hollow" / "a.jsonl").write_text("\n\n")
    with pytest.raises(streaming.NoRecordsError, match=r"^inputs\.1 \(.*hollow\): no records in it \(no data file"):
        streamed([{"path": str(tmp_path / "full")}, {"path": str(tmp_path / "hollow")}])


def test_chat_records_with_acceptable_go_through_python_and_keep_it(tmp_path):
    accepted = {"id": [1, "1"]}
    record = chat(1)
    record["messages"][1]["tool_calls"][0]["acceptable"] = accepted
    path = write(tmp_path / "a.jsonl", jsonl([record, chat(2)]))
    counts = assert_same_as_reference([{"path": str(path)}])
    assert (counts["by_adapter"]["sql"], counts["by_adapter"]["python"]) == (1, 1)
    rows, _, _ = streamed([{"path": str(path)}])
    assert json.loads(rows[0]["messages"][1]["tool_calls"][0]["acceptable"]) == accepted
    assert rows[1]["messages"][1]["tool_calls"][0]["acceptable"] is None
