"""docs/your-data.md: every example record on the page is ingested as the format its heading names, and the
config on the page loads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
import yaml

from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.ingest.formats import registry
from pivot_assets.ingest.inputs import write_ingest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "your-data.md"
FORMATS = {"OpenAI chat": "openai", "OpenAI Responses / NeMo-Gym rollout": "responses", "ShareGPT": "sharegpt"}


def examples() -> list[tuple[str, dict]]:
    text = PAGE.read_text(encoding="utf-8")
    found = re.findall(r"^### ([^\n]+)\n\n```json\n(.*?)\n```", text, flags=re.M | re.S)
    return [(heading, json.loads(body)) for heading, body in found]


def test_the_page_shows_a_record_per_format_it_names():
    assert sorted(h for h, _ in examples()) == sorted(FORMATS)


@pytest.mark.parametrize("heading, record", examples(), ids=[h for h, _ in examples()])
def test_each_example_record_is_ingested(tmp_path, heading, record):
    assert registry.detect(record) == FORMATS[heading]
    data = tmp_path / "my_runs.jsonl"
    data.write_text(json.dumps(record) + "\n")
    wh = Warehouse(tmp_path / "wh")
    counts = write_ingest(wh, [{"path": str(data)}])
    assert counts["ingested"] == 1 and counts["quarantined"] == 0, counts
    (messages,) = duckdb.sql(f"select messages from read_parquet('{wh.table_path('trajectories')}')").fetchone()
    assert messages[-1]["role"] == "assistant"


def section_json(heading: str) -> list[str]:
    """The JSON blocks of one `### heading` section of the page, in order."""
    section = PAGE.read_text(encoding="utf-8").split(f"\n### {heading}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return re.findall(r"^```json\n(.*?)\n```", section, flags=re.M | re.S)


def test_the_tau2_results_file_is_ingested_with_its_environment(tmp_path):
    (results,) = section_json("tau2-bench results")
    (tmp_path / "run.json").write_text(results)
    wh = Warehouse(tmp_path / "wh")
    counts = write_ingest(wh, [{"path": str(tmp_path / "run.json")}])
    assert counts["ingested"] == 1 and counts["by_format"] == {"tau2": 1}, counts
    (domain, environment, messages), = duckdb.sql(
        f"select domain, environment, messages from read_parquet('{wh.table_path('trajectories')}')").fetchall()
    assert domain == "airline" and json.loads(environment)["task_id"] == "0"
    assert messages[0]["role"] == "system" and messages[-1]["role"] == "assistant"


def test_the_bfcl_item_is_ingested_with_its_answer(tmp_path):
    item, answer = section_json("BFCL")
    (tmp_path / "possible_answer").mkdir()
    (tmp_path / "BFCL_v4_simple_python.json").write_text(json.dumps(json.loads(item)) + "\n")
    (tmp_path / "possible_answer" / "BFCL_v4_simple_python.json").write_text(answer + "\n")
    wh = Warehouse(tmp_path / "wh")
    counts = write_ingest(wh, [{"path": str(tmp_path / "BFCL_v4_simple_python.json")}])
    assert counts["ingested"] == 1 and counts["by_format"] == {"bfcl": 1}, counts
    (domain, messages), = duckdb.sql(
        f"select domain, messages from read_parquet('{wh.table_path('trajectories')}')").fetchall()
    (call,) = messages[-1]["tool_calls"]
    assert domain == "bfcl_simple_python" and json.loads(call["arguments"]) == {"base": 10, "height": 5, "unit": "units"}


def test_the_pages_config_loads(tmp_path):
    block = re.search(r"```yaml\n(# my.yaml.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S).group(1)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "my_runs.jsonl").write_text(json.dumps(examples()[0][1]) + "\n")
    (tmp_path / "my.yaml").write_text(block)
    cfg = load_config(tmp_path / "my.yaml")
    assert yaml.safe_load(block)["policy"]["k"] == cfg.policy.k == 8
