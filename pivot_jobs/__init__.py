"""Jobs over the asset graph: the whole pipeline, and one job per phase for partial reruns."""

from __future__ import annotations

import dagster as dg

PIPELINE_JOB = "pivot_pipeline"

# Each phase is a group of assets (group_name on every asset definition).
PHASE_GROUPS = {
    "ingest_job": "ingest",
    "profile_job": "profiling",
    "curate_job": "curation",
    "train_job": "training",
}


def build_jobs() -> list[dg.UnresolvedAssetJobDefinition]:
    jobs = [
        dg.define_asset_job(
            PIPELINE_JOB,
            selection=dg.AssetSelection.all(),
            description="Everything: trajectories -> turns -> profiles -> pivot sets -> training and eval.",
        )
    ]
    for name, group in PHASE_GROUPS.items():
        jobs.append(dg.define_asset_job(name, selection=dg.AssetSelection.groups(group)))
    return jobs
