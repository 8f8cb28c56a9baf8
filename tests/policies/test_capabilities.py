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
    assert capabilities("vllm").reloads_weights and not capabilities("vllm").torch_in_process
    assert not capabilities("openai").local_model
    with pytest.raises(ValueError, match="policy.backend 'sglang': expected one of transformers, vllm, openai"):
        capabilities("sglang")


def test_the_engines_page_lists_every_capability():
    from dataclasses import fields

    from pivot_assets.core.engines import EngineCapabilities

    page = (PACKAGE.parent / "docs" / "engines.md").read_text(encoding="utf-8")
    flags = [f.name for f in fields(EngineCapabilities) if f.type in (bool, "bool")]
    assert [f for f in flags if f"| `{f}` |" not in page] == []


def test_auto_picks_the_fastest_engine_installed(monkeypatch):
    from pivot_assets.core import engines
    from pivot_assets.core.config import PolicySection

    vllm_here = engines.installed("vllm")
    section = PolicySection.model_validate({"backend": "auto"})
    assert section.backend == ("vllm" if vllm_here else "transformers")  # never "auto": the identity records it
    assert section.engine_choice.reason.startswith(f"auto: {section.backend} ")
    assert PolicySection.model_validate({"backend": "auto", "thinking_budget": 64}).backend == "transformers"
    assert PolicySection.model_validate({"backend": "auto", "base_url": "http://127.0.0.1:1/v1"}).backend == "openai"
    assert PolicySection().engine_choice.reason == "named by policy.backend"

    real_find_spec = engines.importlib.util.find_spec
    monkeypatch.setattr(engines.importlib.util, "find_spec", lambda name: None if name == "vllm" else real_find_spec(name))
    fallback = PolicySection.model_validate({"backend": "auto"})
    assert fallback.backend == "transformers" and "vllm is not installed" in fallback.engine_choice.reason


def test_the_engine_auto_picks_is_part_of_the_rollouts_identity(tmp_path):
    from pivot_assets.core.config import load_config
    from pivot_assets.core.identity import ROLLOUTS, values

    def rollouts_identity(backend):
        (tmp_path / "pivot.yaml").write_text(f"policy: {{backend: {backend}}}\n")
        return values(load_config(tmp_path / "pivot.yaml").policy, ROLLOUTS)

    (tmp_path / "pivot.yaml").write_text("policy: {backend: auto}\n")
    picked = load_config(tmp_path / "pivot.yaml").policy.backend
    assert rollouts_identity("auto") == rollouts_identity(picked)
    other = "transformers" if picked == "vllm" else "vllm"
    assert rollouts_identity("auto") != rollouts_identity(other)
