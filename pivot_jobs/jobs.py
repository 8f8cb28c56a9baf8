"""Jobs over the asset graph: the whole pipeline, one job per phase for partial reruns, and the ablation."""

from __future__ import annotations

import dagster as dg

PIPELINE_JOB = "pivot_pipeline"
# workspace.yaml's location_name: `pivot run` labels its runs with it so the UI lists them under their job
CODE_LOCATION = "pivot_curation"
ABLATION_JOB = "ablation_job"
# The ablation asset carries this tag (evaluation/assets.py ABLATION_TAGS); it exists only in a config with an
# `ablation:` section, so the selections below are empty (and the ablation never runs) without one.
ABLATION_TAG = ("pivot/stage", "ablation")

# Each phase is a group of assets (group_name on every asset definition).
PHASE_GROUPS = {
    "ingest_job": "ingest",
    "profile_job": "profiling",
    "curate_job": "curation",
    "train_job": "training",
    "eval_job": "evaluation",
}


def build_jobs() -> list[dg.UnresolvedAssetJobDefinition]:
    ablation = dg.AssetSelection.tag(*ABLATION_TAG)
    jobs = [
        dg.define_asset_job(
            PIPELINE_JOB,
            selection=dg.AssetSelection.all() - ablation,
            description="Everything: trajectories -> turns -> profiles -> pivot sets -> training and eval.",
        )
    ]
    for name, group in PHASE_GROUPS.items():
        jobs.append(dg.define_asset_job(name, selection=dg.AssetSelection.groups(group) - ablation))
    jobs.append(dg.define_asset_job(
        ABLATION_JOB, selection=ablation.upstream().required_multi_asset_neighbors(),
        description="The ablation (GRPO on D_adv / D_cand / D_mixed, exact-match reward, same-data SFT) and "
                    "everything it needs; completion markers skip what is already trained."))
    return jobs
