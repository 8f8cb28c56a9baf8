"""Builds the Dagster definitions from a pivot.yaml (code versions derive from the config, so a changed
verifier or sampling section makes exactly the dependent assets stale)."""

from __future__ import annotations

import os
import dagster as dg

from pivot_assets.config import load_config, resolve_config_path
from pivot_assets.resources import PivotSettings


def stage_builders():
    """Asset (and check) builders, in graph order."""
    from pivot_assets import ingest, pivots, profiling, training, turns

    return [
        ingest.build_ingest_assets,
        turns.build_turn_assets,
        training.build_sft_assets,
        profiling.build_profiling_assets,
        pivots.build_pivot_assets,
        training.build_training_assets,
    ]


def build_definitions(config_path: str | os.PathLike | None = None) -> dg.Definitions:
    from pivot_jobs import build_jobs

    path = resolve_config_path(config_path)
    cfg = load_config(path)
    if path is not None:
        # Resources read the config through $PIVOT_CONFIG, the same file the code versions came from.
        os.environ["PIVOT_CONFIG"] = str(path)
        settings = PivotSettings(config_path=dg.EnvVar("PIVOT_CONFIG"))
    else:
        settings = PivotSettings(config_path="")
    assets, checks = [], []
    for build in stage_builders():
        for d in build(cfg):
            (checks if isinstance(d, dg.AssetChecksDefinition) else assets).append(d)
    # One process per run: the stages share one DuckDB file (a single writer) and the CPU box's memory;
    # a multiprocess executor would race on pivot.duckdb and load several models at once.
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=build_jobs(),
        resources={"settings": settings},
        executor=dg.in_process_executor,
    )

