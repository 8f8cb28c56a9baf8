"""Builds the Dagster definitions from one parsed pivot.yaml.

The config is parsed once, here, and the objects every stage shares are resolved once from it
(pivot_assets/shared.py: the warehouse and the verifier sets; a bad verifier is a ConfigError here, at load).
Every stage's `build_assets(cfg, wh, verifiers)` takes them and its assets close over them, so code versions
(computed at load) and asset bodies (run with the same objects) can never disagree. Editing pivot.yaml takes
effect on the usual code-location reload (or the next `pivot` command).
"""

from __future__ import annotations

import os

import dagster as dg

from pivot_assets.core.config import PivotConfig, load_config
from pivot_assets.core.ids import canonical_json, short_hash
from pivot_assets.shared import Shared, resolve_shared


def stage_builders():
    """Each stage package's `assets.build_assets`, in graph order (the group of an asset is its stage's folder)."""
    from pivot_assets.curation import assets as curation
    from pivot_assets.evaluation import assets as evaluation
    from pivot_assets.ingest import assets as ingest
    from pivot_assets.profiling import assets as profiling
    from pivot_assets.refresh import assets as refresh
    from pivot_assets.training import assets as training

    return [ingest.build_assets, profiling.build_assets, curation.build_assets, training.build_assets,
            evaluation.build_assets, refresh.build_assets]


def build_definitions(config: str | os.PathLike | PivotConfig | None = None, shared: Shared | None = None
                      ) -> dg.Definitions:
    """`shared`: the run's shared objects when the caller resolved them already (a `pivot` command: one warehouse
    and one set of verifiers per command)."""
    from pivot_jobs.jobs import build_jobs

    cfg = config if isinstance(config, PivotConfig) else load_config(config)
    shared = shared or resolve_shared(cfg)
    wh, verifiers = shared.warehouse, shared.verifiers
    assets, checks = [], []
    for build in stage_builders():
        for d in build(cfg, wh, verifiers):
            (checks if isinstance(d, dg.AssetChecksDefinition) else assets).append(d)
    # One process per run: the stages share one DuckDB file (a single writer) and the CPU box's memory;
    # a multiprocess executor would race on pivot.duckdb and load several models at once.
    return dg.Definitions(assets=chain_code_versions(assets), asset_checks=checks, jobs=build_jobs(),
                          executor=dg.in_process_executor)


def definitions() -> dg.Definitions:
    """The definitions of $PIVOT_CONFIG (else ./pivot.yaml): what a workspace's `python_module` entry loads (Dagster
    calls an attribute that is a function with no parameters; `pivot ui` writes such a workspace)."""
    return build_definitions()


def chain_code_versions(assets: list) -> list:
    """Each asset's code version also covers its parents' chained versions.

    Dagster marks as unsynced only the asset whose own code version changed (after a verifier change, just
    rollout_rewards), while everything below it will change too. Chained versions make the UI show the whole
    chain as "new code version" right after a reload, so one "Materialize unsynced" reruns exactly that
    chain in one run, each asset once, in graph order: the rule `pivot stale` applies.
    """
    specs = {spec.key: spec for a in assets for spec in a.specs}
    chained: dict[dg.AssetKey, str] = {}

    def version(key: dg.AssetKey) -> str:
        if key not in chained:
            spec = specs[key]
            parents = sorted((d.asset_key for d in spec.deps if d.asset_key in specs), key=lambda k: k.to_user_string())
            chained[key] = short_hash(canonical_json([spec.code_version, [version(p) for p in parents]]))
        return chained[key]

    return list(dg.map_asset_specs(lambda spec: spec.replace_attributes(code_version=version(spec.key)), assets))
