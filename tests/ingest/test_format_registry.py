"""A new input format is one module that registers a `Format`, plus one line that imports it: here a toy format,
written the way a contributor would, ingested by `pivot run` (forced and auto-detected) and by spawned workers."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pivot_assets.core.config import ConfigError, load_config
from pivot_assets.ingest import streaming
from pivot_assets.ingest.formats import Format, detect_format, register, registry
from tests.ingest.reference import ingest_to_tables

# The whole format: its module. `dialogue` rows [speaker, text], speakers q (user) and a (assistant).
TOY_MODULE = '''"""toy: {"dialogue": [[speaker, text], ...], "score": number}; speakers q (user) and a (assistant)."""

from pivot_assets.ingest.formats import Format, chat_messages, register

SPEAKERS = {"q": "user", "a": "assistant"}


def adapt_toy(record, origin):
    messages = [{"role": SPEAKERS.get(speaker, speaker), "content": text} for speaker, text in record["dialogue"]]
    return {"messages": chat_messages(messages), "reward": record.get("score")}


register(Format(name="toy", description="toy dialogues: `dialogue` [[speaker, text]]", keys=("dialogue",),
                adapt=adapt_toy))
'''


def toy_record(i: int, score: float = 1.0) -> dict:
    return {"dialogue": [["q", f"what is {i} + 1?"], ["a", f"{i + 1}"]], "score": score}


OPENAI_RECORD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.fixture
def toy_format(tmp_path, monkeypatch):
    """The toy format's module on sys.path, imported (the one line), and unregistered afterwards."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "toy_format.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(modules))
    importlib.import_module("toy_format")  # the one line: `from . import toy` in formats/__init__.py for a built-in
    yield registry.get("toy")
    registry.unregister("toy")
    sys.modules.pop("toy_format", None)


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_a_registered_format_is_detected_fitted_and_named_by_the_config(toy_format, tmp_path):
    assert registry.names()[-1] == "toy" and toy_format.module == "toy_format"
    assert detect_format(toy_record(1)) == "toy"
    assert detect_format({**toy_record(1), **OPENAI_RECORD}) == "toy"  # the generic openai is asked last
    assert detect_format(OPENAI_RECORD) == "openai"
    write_jsonl(tmp_path / "x.jsonl", [toy_record(1)])
    (tmp_path / "pivot.yaml").write_text("inputs:\n  - path: x.jsonl\n    format: toy\n")
    assert load_config(tmp_path / "pivot.yaml").inputs[0].format == "toy"


def test_an_unregistered_format_is_a_config_error(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", [toy_record(1)])
    (tmp_path / "pivot.yaml").write_text("inputs:\n  - path: x.jsonl\n    format: toy\n")
    with pytest.raises(ConfigError, match="inputs.0.format: .*unknown input format 'toy'"):
        load_config(tmp_path / "pivot.yaml")


def test_register_refuses_auto_and_another_modules_name():
    with pytest.raises(ValueError, match="reserved"):
        register(Format(name="auto", description="", keys=(), adapt=lambda record, origin: {}))
    with pytest.raises(ValueError, match="registered by pivot_assets.ingest.formats.openai"):
        register(Format(name="openai", description="", keys=(), adapt=lambda record, origin: {}))
    assert "auto" not in registry.names() and registry.get("openai").module.endswith(".openai")


def test_pivot_run_ingests_the_toy_format_forced_and_detected(toy_format, tmp_path, monkeypatch, capsys):
    from pivot_jobs.cli import main as pivot

    forced = write_jsonl(tmp_path / "forced.jsonl", [toy_record(1), toy_record(2, 0.0),
                                                     {"dialogue": [["q", "x"], ["narrator", "y"]]}])
    detected = write_jsonl(tmp_path / "detected.jsonl", [toy_record(3), OPENAI_RECORD, {"prompt": "x"}])
    (tmp_path / "pivot.yaml").write_text(json.dumps({"warehouse": "./wh", "inputs": [
        {"path": forced.name, "format": "toy"}, {"path": detected.name}]}))
    monkeypatch.chdir(tmp_path)
    assert pivot(["run", "--select", "trajectories,turns"]) == 0, capsys.readouterr().err

    wh = tmp_path / "wh"
    trajectories = pq.read_table(wh / "trajectories.parquet").to_pylist()
    assert [(Path(t["source"]).name, t["record"], t["source_format"], t["outcome_reward"]) for t in trajectories] == [
        ("forced.jsonl", 0, "toy", 1.0), ("forced.jsonl", 1, "toy", 0.0),
        ("detected.jsonl", 0, "toy", 1.0), ("detected.jsonl", 1, "openai", None)]
    assert [m["role"] for m in trajectories[0]["messages"]] == ["user", "assistant"]
    quarantine = pq.read_table(wh / "quarantine.parquet").to_pylist()
    assert [(Path(q["source"]).name, q["record"], q["reason"].split(":")[0]) for q in quarantine] == [
        ("forced.jsonl", 2, "unknown_role"), ("detected.jsonl", 2, "unknown_format")]
    assert pq.read_table(wh / "turns.parquet").num_rows == 4  # one turn per assistant message


class TableWriter:
    def __init__(self) -> None:
        self.tables: list[pa.Table] = []

    def write_table(self, table: pa.Table) -> None:
        self.tables.append(table)


def test_spawned_workers_know_the_toy_format(toy_format, tmp_path):
    path = write_jsonl(tmp_path / "toy.jsonl", [toy_record(i) for i in range(40)])
    inputs = [{"path": str(path)}]
    trajectories, quarantine = TableWriter(), TableWriter()
    counts = streaming.stream_ingest(inputs, trajectories, quarantine, workers=2, unit_bytes=512)
    assert counts["ingested"] == 40 and counts["by_format"] == {"toy": 40} and counts["by_adapter"] == {"python": 40}
    streamed = pa.concat_tables(trajectories.tables).select(["trajectory_id", "record"]).to_pylist()
    reference = ingest_to_tables(inputs)[0].select(["trajectory_id", "record"]).to_pylist()
    assert streamed == reference
