"""Engines are asked what they can do, never named: outside policies/ no code compares a backend's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pivot_assets.policies.factory import BACKENDS, ENGINES, capabilities

PACKAGE = Path(__file__).resolve().parents[2] / "pivot_assets"
NAME_TEST = re.compile(r"""backend\s*(==|!=|\bin\b|\bnot in\b)\s*[\(\["']""")


def test_no_backend_name_comparison_outside_policies():
    found = [f"{p.relative_to(PACKAGE)}:{i}: {line.strip()}"
             for p in PACKAGE.rglob("*.py") if "policies" not in p.relative_to(PACKAGE).parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if NAME_TEST.search(line)]
    assert not found, found


def test_every_engine_declares_its_capabilities():
    assert set(BACKENDS) == set(ENGINES) == {"transformers", "vllm", "openai"}
    assert capabilities("transformers").scores_continuation and capabilities("transformers").turn_rows_together
    assert capabilities("vllm").prefix_reuse and not capabilities("vllm").torch_in_process
    assert not capabilities("openai").local_model
    with pytest.raises(ValueError, match="policy.backend 'sglang': expected one of transformers, vllm, openai"):
        capabilities("sglang")
