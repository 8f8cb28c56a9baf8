"""`make docs-check` fails when a generated block of README.md or docs/ no longer matches what it is generated from
(pivot.yaml and the code through docs/_gen/facts.py, measured figures from bench/results/*.json), and every figure a
results summary holds stands in the results file it names."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
NUMBER = re.compile(r"\d[\d,.]*\d|\d")
SUMMARIES = sorted((REPO / "bench" / "results").glob("*.json"))


def docs_check(root: Path) -> subprocess.CompletedProcess:
    """The Makefile's docs-check recipe run in `root` (its setup taken as done: this venv is set up)."""
    return subprocess.run(["make", "-f", str(REPO / "Makefile"), "-C", str(root), "-o", "setup", f"VENV={VENV}",
                           "docs-check"], capture_output=True, text=True, timeout=120)


@pytest.fixture
def docs_copy(tmp_path: Path) -> Path:
    """What the generated blocks read and where they sit, copied: the checks below edit the copy, never the repo."""
    shutil.copy(REPO / "README.md", tmp_path)
    shutil.copy(REPO / "pivot.yaml", tmp_path)
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("bench", "ui", "__pycache__"))
    shutil.copytree(REPO / "bench" / "results", tmp_path / "bench" / "results")
    return tmp_path


def test_the_committed_blocks_are_fresh(docs_copy: Path):
    result = docs_check(docs_copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_changed_demo_k_makes_docs_check_fail(docs_copy: Path):
    config = docs_copy / "pivot.yaml"
    text = config.read_text()
    assert re.search(r"^  k: 6$", text, re.M), "the demo's policy.k line moved: adjust this test"
    config.write_text(re.sub(r"^  k: 6$", "  k: 7", text, flags=re.M))
    result = docs_check(docs_copy)
    assert result.returncode != 0 and "stale" in result.stdout + result.stderr


def test_a_changed_results_figure_makes_docs_check_fail(docs_copy: Path):
    summary = docs_copy / "bench" / "results" / "decisive_bfcl.json"
    data = json.loads(summary.read_text())
    data["figures"]["adv_minus_cand"] = "+0.099 [+0.003, +0.052]"
    summary.write_text(json.dumps(data))
    result = docs_check(docs_copy)
    assert result.returncode != 0 and "stale" in result.stdout + result.stderr


@pytest.mark.parametrize("summary", SUMMARIES, ids=lambda p: p.stem)
def test_every_summary_figure_stands_in_its_results_file(summary: Path):
    """Every number of a figure is in the text quoted for it, and that text is in the results file; a figure is quoted
    with its label or table cells (`evidence`) where the bare value could stand anywhere."""
    data = json.loads(summary.read_text())
    text = (REPO / data["results_file"]).read_text()
    evidence = data.get("evidence", {})
    absent = []
    for key, value in data["figures"].items():
        for one in value if isinstance(value, list) else [value]:
            quote = evidence.get(key, one)
            if not set(NUMBER.findall(one)) <= set(NUMBER.findall(quote)) or quote not in text:
                absent.append(f"{key}: {quote!r}")
    assert absent == []


def test_the_decisive_runs_step_count_is_every_unit_files():
    """Each GRPO unit file of the decisive run holds one row per step: the summary's step count is theirs."""
    units = sorted((REPO / "bench" / "data" / "decisive_bfcl").glob("train_*.parquet"))
    steps = json.loads((REPO / "bench" / "results" / "decisive_bfcl.json").read_text())["figures"]["grpo_steps"]
    assert units and {pl.read_parquet(u, columns=["step"]).height for u in units} == {int(steps)}


def test_the_catalogs_pivot_eval_columns_are_the_ones_the_stage_writes():
    from pivot_assets.core.catalog import TABLES
    from pivot_assets.evaluation.heldout import eval_table

    assert eval_table([]).schema.equals(TABLES["pivot_eval"].schema)
