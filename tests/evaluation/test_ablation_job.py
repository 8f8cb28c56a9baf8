"""The ablation asset and ablation_job: present only with an `ablation:` section, never in the pipeline job."""

from __future__ import annotations

import dagster as dg
import yaml

from pivot_assets.core.config import load_config
from pivot_jobs.definitions import build_definitions


def _defs(tmp_path, **sections):
    path = tmp_path / "pivot.yaml"
    path.write_text(yaml.safe_dump({"warehouse": "./wh", **sections}))
    return build_definitions(load_config(path))


def _job_keys(defs, name):
    return {k.to_user_string() for k in defs.resolve_job_def(name).asset_layer.selected_asset_keys}


def test_ablation_job_runs_the_ablation_and_what_it_needs_and_the_pipeline_never_does(tmp_path):
    defs = _defs(tmp_path, ablation={"arms": ["grpo_cand", "sft_same_data"], "seeds": [0, 1]})
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey("ablation_results")
    assert key in graph.get_all_asset_keys()
    deps = {k.to_user_string() for k in graph.get(key).parent_keys}
    assert {"pivots_cand", "pivots_adv", "pivots_mixed", "turn_profiles", "trajectories"} <= deps
    ablation = _job_keys(defs, "ablation_job")
    assert {"ablation_results", "pivots_cand", "trajectories", "turn_profiles"} <= ablation
    assert "grpo_run" not in ablation and "pivot_eval" not in ablation
    assert "ablation_results" not in _job_keys(defs, "pivot_pipeline")
    assert "ablation_results" not in _job_keys(defs, "train_job")
    assert _job_keys(defs, "eval_job") == {"pivot_eval"}  # the evaluation group, without the (long) ablation


def test_without_an_ablation_section_there_is_no_ablation_asset(tmp_path):
    defs = _defs(tmp_path)
    assert dg.AssetKey("ablation_results") not in defs.resolve_asset_graph().get_all_asset_keys()
    assert defs.resolve_job_def("ablation_job") is not None
