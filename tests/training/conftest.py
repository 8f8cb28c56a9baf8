"""Fixtures of the training tests: the decisive runner (bench/decisive.py, a script, not a package module)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def decisive():
    spec = importlib.util.spec_from_file_location("decisive_runner", ROOT / "bench" / "decisive.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
