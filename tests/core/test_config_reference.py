"""`pivot config --schema / --reference`: the JSON Schema editors complete pivot.yaml from, and the Markdown
reference docs/configuration.md is generated from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pivot_jobs.cli import main
from pivot_assets.core.config_reference import REGENERATE, schema_fields

ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv: str) -> str:
    assert main(["config", *argv]) == 0
    return capsys.readouterr().out


def test_schema_is_valid_json_with_every_section(capsys):
    schema = json.loads(run_cli(capsys, "--schema"))
    assert {"policy", "pivots", "training", "refresh"} <= set(schema["properties"])
    assert "base_dir" not in schema["properties"]  # set by the loader, never written in pivot.yaml
    assert schema["properties"]["policy"]["default"]["k"] == 8  # factory defaults are filled in


def test_most_fields_have_a_description(capsys):
    fields = schema_fields(json.loads(run_cli(capsys, "--schema")))
    described = [prop for _, prop in fields if prop.get("description", "").strip()]
    assert len(fields) > 50 and len(described) / len(fields) >= 0.9


def test_the_schema_accepts_the_repo_config_and_rejects_an_unknown_key(capsys):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(run_cli(capsys, "--schema"))
    config = yaml.safe_load((ROOT / "pivot.yaml").read_text()) or {}
    jsonschema.validate(config, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**config, "policy": {"kk": 8}}, schema)


def test_docs_configuration_is_not_stale(capsys):
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert run_cli(capsys, "--reference") == page, f"docs/configuration.md is stale: run `{REGENERATE}`"


def test_reference_has_a_table_row_per_field(capsys):
    page = run_cli(capsys, "--reference")
    assert "## `policy`" in page and "## `profiling.adaptive`" in page and "## `inputs[]`" in page
    assert "| `lambda_diff` | float (&gt;= 0.0, &lt;= 1.0) | `0.6` |" in page
    assert "| `exact_verifier` | section `verifier` | `{\"default\": {\"name\": \"exact\"}}` |" in page
