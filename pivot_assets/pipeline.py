"""Builds the Dagster definitions from a pivot.yaml (code versions derive from the config, so a changed
verifier or sampling section makes exactly the dependent assets stale)."""

from __future__ import annotations

import os
import dagster as dg

from pivot_assets.config import load_config, resolve_config_path
from pivot_assets.resources import PivotSettings


def stage_builders():
    """(module, builder) pairs, in graph order; later stages are added as they exist."""
    from pivot_assets import ingest, turns

    builders = [ingest.build_ingest_assets, turns.build_turn_assets]
    for module_name, fn in (
        ("pivot_assets.training", "build_sft_assets"),
        ("pivot_assets.profiling", "build_profiling_assets"),
        ("pivot_assets.pivots", "build_pivot_assets"),
        ("pivot_assets.training", "build_training_assets"),
    ):
        try:
            module = __import__(module_name, fromlist=[fn])
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        builders.append(getattr(module, fn))
    return builders


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
    return dg.Definitions(
        assets=assets, asset_checks=checks, jobs=build_jobs(), resources={"settings": settings}
    )

