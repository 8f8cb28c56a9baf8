"""What runs the pipeline, above the stages in pivot_assets (which never import it).

- `definitions`: the Dagster definitions built from one pivot.yaml (every stage's assets, the shared objects
  resolved once) and `jobs`: the jobs over that asset graph.
- `cli`: the `pivot` command; `runner`: in-process runs on the config's Dagster instance; `shard_runs`: profiling
  in shards (local processes or Ray jobs); `supervisor`: the child process that a signal stops cleanly;
  `preflight`: what a config names (models, inputs, verifiers, engines) checked before any asset runs.
"""

from pivot_jobs.jobs import (
    ABLATION_JOB,
    ABLATION_TAG,
    CODE_LOCATION,
    PHASE_GROUPS,
    PIPELINE_JOB,
    build_jobs,
)

__all__ = ["ABLATION_JOB", "ABLATION_TAG", "CODE_LOCATION", "PHASE_GROUPS", "PIPELINE_JOB", "build_jobs"]
