"""Builds the Dagster definitions from one parsed pivot.yaml.

The config is parsed once, here; every stage's `build_assets(cfg)` takes that typed object and its assets
close over it, so code versions (computed from the config at load) and asset bodies (run with it) can never
disagree. Editing pivot.yaml takes effect on the usual code-location reload (or the next `pivot` command).
"""

from __future__ import annotations

import os

import dagster as dg

from pivot_assets.core.config import PivotConfig, load_config


def stage_builders():
    """Each stage package's `assets.build_assets`, in graph order (the group of an asset is its stage's folder)."""
    from pivot_assets.curation import assets as curation
    from pivot_assets.ingest import assets as ingest
    from pivot_assets.profiling import assets as profiling
    from pivot_assets.training import assets as training

    return [ingest.build_assets, profiling.build_assets, curation.build_assets, training.build_assets]


def build_definitions(config: str | os.PathLike | PivotConfig | None = None) -> dg.Definitions:
    from pivot_jobs import build_jobs

    cfg = config if isinstance(config, PivotConfig) else load_config(config)
    assets, checks = [], []
    for build in stage_builders():
        for d in build(cfg):
            (checks if isinstance(d, dg.AssetChecksDefinition) else assets).append(d)
    # One process per run: the stages share one DuckDB file (a single writer) and the CPU box's memory;
    # a multiprocess executor would race on pivot.duckdb and load several models at once.
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=build_jobs(), executor=dg.in_process_executor)
