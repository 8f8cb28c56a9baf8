"""`inputs[].tools: FILE`: tool schemas for records that carry none, on both ingest paths, and the tau2 airline
sample profiled with the airline tools written from tau2-bench's domain definition."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pivot_assets.core.config import ConfigError, load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.ingest.inputs import resolved_inputs, write_ingest
from tests.ingest.reference import ingest_to_tables

REPO = Path(__file__).resolve().parents[2]
AIRLINE_TOOLS = REPO / "configs" / "tools" / "tau2_airline.json"
TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look an order up",
                                           "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}]


def _record(tools: list | None) -> dict:
    messages = [{"role": "user", "content": "where is #1?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "get_order", "arguments": '{"id": "1"}'}}]}]
    return {"messages": messages, **({"tools": tools} if tools is not None else {})}


def _project(tmp_path: Path, records: list[dict], tools_file: str | None) -> Path:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = {"path": "data.jsonl", "format": "openai", **({"tools": tools_file} if tools_file else {})}
    (tmp_path / "pivot.yaml").write_text(json.dumps({"warehouse": "./wh", "inputs": [spec]}))
    return tmp_path / "pivot.yaml"


def _ingest(config: Path) -> list[dict]:
    cfg = load_config(config)
    wh = Warehouse(cfg.warehouse_dir)
    write_ingest(wh, resolved_inputs(cfg), workers=1)
    return wh.read("trajectories").sort("record").to_dicts()


def test_tools_file_fills_records_without_tools(tmp_path):
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    other = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "other"}}]
    rows = _ingest(_project(tmp_path, [_record(None), _record(other)], "tools.json"))
    assert [json.loads(r["tools"])[0]["function"]["name"] for r in rows] == ["get_order", "other"]  # own tools kept
    # the filled record has the id it would have had with the schemas inline (both ingest paths agree)
    inline_dir = tmp_path / "inline"
    inline_dir.mkdir()
    inline = _ingest(_project(inline_dir, [_record(TOOLS)], None))[0]
    assert (rows[0]["trajectory_id"], rows[0]["tools"]) == (inline["trajectory_id"], inline["tools"])
    reference, _, _ = ingest_to_tables(resolved_inputs(load_config(tmp_path / "pivot.yaml")))
    assert reference.column("trajectory_id").to_pylist() == [r["trajectory_id"] for r in rows]


@pytest.mark.parametrize("workers", [1, 2])
def test_dedup_sees_the_filled_tools(tmp_path, workers):
    """Dedup compares trajectories as ingested, tools filled: the same messages under two inputs with different
    tools files are two trajectories; a tool-less record equal, once filled, to one with the schemas inline is a
    duplicate (never two rows with one id). The reference path (ingest_to_tables) agrees."""
    other = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "other"}}]
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "other.json").write_text(json.dumps(other))
    (tmp_path / "a.jsonl").write_text(json.dumps(_record(TOOLS)) + "\n" + json.dumps(_record(None)) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(_record(None)) + "\n")
    (tmp_path / "pivot.yaml").write_text(json.dumps({"warehouse": "./wh", "inputs": [
        {"path": "a.jsonl", "format": "openai", "tools": "tools.json"},
        {"path": "b.jsonl", "format": "openai", "tools": "other.json"}]}))
    cfg = load_config(tmp_path / "pivot.yaml")
    counts = write_ingest(Warehouse(cfg.warehouse_dir), resolved_inputs(cfg), workers=workers)
    assert (counts["read"], counts["ingested"], counts["duplicates"]) == (3, 2, 1)
    rows = Warehouse(cfg.warehouse_dir).read("trajectories").to_dicts()
    assert sorted(json.loads(r["tools"])[0]["function"]["name"] for r in rows) == ["get_order", "other"]
    assert len({r["trajectory_id"] for r in rows}) == 2
    reference, _, ref_counts = ingest_to_tables(resolved_inputs(cfg))
    assert sorted(reference.column("trajectory_id").to_pylist()) == sorted(r["trajectory_id"] for r in rows)
    assert ref_counts["duplicate"] == 1


@pytest.mark.parametrize("content,error", [
    (None, "cannot read it as JSON"),
    ("{oops", "cannot read it as JSON"),
    ('[{"no": "name"}]', "tool 0 is not a function schema"),
    ("[]", "no tool schemas"),
])
def test_bad_tools_file_is_one_config_line(tmp_path, content, error):
    if content is not None:
        (tmp_path / "tools.json").write_text(content)
    config = _project(tmp_path, [_record(None)], "tools.json")
    with pytest.raises(ConfigError, match=f"inputs.0.tools: tools file .*tools.json: {error}"):
        resolved_inputs(load_config(config))


def test_airline_tools_cover_every_tool_the_sample_calls(shared_data_dir):
    sample = shared_data_dir / "tau2-bench" / "airline_run1.json"
    if not sample.is_file():
        pytest.skip(f"tau2 sample absent: {sample}")
    names = {t["function"]["name"] for t in json.loads(AIRLINE_TOOLS.read_text())["tools"]}
    called = {c["name"] for s in json.loads(sample.read_text())["simulations"] for m in s["messages"]
              for c in m.get("tool_calls") or []}
    assert called <= names and len(names) == 14


@pytest.mark.scenario
def test_tau2_sample_profiled_with_airline_tools(shared_data_dir, tmp_path, monkeypatch, tiny_model_dir):
    from pivot_assets.policies.models import load_tokenizer, render_prompt
    from pivot_jobs.cli import main as pivot

    sample = shared_data_dir / "tau2-bench" / "airline_run1.json"
    if not sample.is_file():
        pytest.skip(f"tau2 sample absent: {sample}")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pivot.yaml").write_text(json.dumps({
        "warehouse": "./wh",
        "inputs": [{"path": str(sample), "format": "tau2", "domain": "airline", "tools": str(AIRLINE_TOOLS)}],
        "policy": {"model": str(tiny_model_dir), "k": 2, "max_new_tokens": 8, "limit_turns": 1, "batch_size": 4,
                   "dtype": "float32"}}))
    assert pivot(["run", "--select", "trajectories,turns,rollouts,rollout_rewards,turn_profiles"]) == 0
    wh = tmp_path / "wh"
    tools = duckdb.sql(f"select distinct tools from read_parquet('{wh}/trajectories.parquet')").fetchall()
    assert len(tools) == 1 and len(json.loads(tools[0][0])) == 14  # every simulation got the airline tools
    # the profiled prompt carried them: its length is that of the state rendered with the tools (the tiny test
    # policy has the embedded tokenizer and template)
    turn_id, n_prompt = duckdb.sql(f"select turn_id, n_prompt_tokens from read_parquet('{wh}/rollouts/**/*.parquet') "
                                   "order by turn_id limit 1").fetchone()
    trajectory, index = duckdb.sql(
        f"select t.messages, u.message_index from read_parquet('{wh}/turns.parquet') u "
        f"join read_parquet('{wh}/trajectories.parquet') t using (trajectory_id) where u.turn_id = '{turn_id}'").fetchone()
    tokenizer = load_tokenizer("embedded")
    with_tools = render_prompt(tokenizer, trajectory[:index], json.loads(tools[0][0]))
    assert n_prompt == len(tokenizer(with_tools, add_special_tokens=False)["input_ids"])
    assert "book_reservation" in with_tools
    assert duckdb.sql(f"select count(*) from read_parquet('{wh}/turn_profiles.parquet')").fetchone()[0] == 1
