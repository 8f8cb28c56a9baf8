"""A small project the tests build on: the built-in sample ingested by `pivot run` in a folder of its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def ingested_sample(root: Path, config: str) -> Iterator[Path]:
    """Write `config` as root/pivot.yaml and ingest its sample (trajectories, turns) with root as the working dir and
    root/dagster_home as the Dagster home, which stay set inside the block; yields root."""
    from pivot_jobs.cli import main as pivot

    (root / "pivot.yaml").write_text(config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        mp.delenv("PIVOT_CONFIG", raising=False)
        mp.chdir(root)
        assert pivot(["run", "--select", "trajectories,turns"]) == 0
        yield root
