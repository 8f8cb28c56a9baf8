"""Run keys and completion markers: what retrains a model and what never does."""

from __future__ import annotations

import pyarrow as pa
import yaml

from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.training import runs


def _cfg(tmp_path, **sections):
    """A config from a file of its own (never the checkout's pivot.yaml), with the given sections."""
    path = tmp_path / "pivot.yaml"
    path.write_text(yaml.safe_dump({"warehouse": "./wh", **sections}))
    return load_config(path)


def _warehouse(tmp_path, rows=("a", "b")) -> Warehouse:
    wh = Warehouse(tmp_path / "wh")
    wh.write_table("trajectories", pa.table({"trajectory_id": list(rows)}))
    return wh


def test_marker_round_trip_and_is_done(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    assert runs.read_marker(model) is None and not runs.is_done(model, "k1")
    runs.write_marker(model, "k1")
    assert runs.read_marker(model) == "k1" and runs.is_done(model, "k1") and not runs.is_done(model, "k2")


def test_sft_key_follows_the_sft_section_the_split_and_the_data(tmp_path, monkeypatch):
    monkeypatch.setattr("pivot_assets.policies.models.policy_fingerprint", lambda model: f"fp:{model}")
    wh = _warehouse(tmp_path)
    key = runs.sft_key(wh, _cfg(tmp_path))
    assert key == runs.sft_key(wh, _cfg(tmp_path))
    assert key != runs.sft_key(wh, _cfg(tmp_path, sft={"steps": 3}))
    assert key != runs.sft_key(wh, _cfg(tmp_path, training={"eval_fraction": 0.3}))
    assert key == runs.sft_key(wh, _cfg(tmp_path, training={"eval_k": 16}))  # evaluation-only: no retrain
    assert key != runs.sft_key(_warehouse(tmp_path, rows=("a", "c")), _cfg(tmp_path))


def test_grpo_key_ignores_evaluation_keys_and_follows_training_verifier_and_pivots(tmp_path, monkeypatch):
    monkeypatch.setattr("pivot_assets.policies.models.policy_fingerprint", lambda model: f"fp:{model}")
    wh = _warehouse(tmp_path)
    wh.write_table("pivots_adv", pa.table({"turn_id": ["t1"]}))
    key = runs.grpo_key(wh, _cfg(tmp_path), "v1")
    assert key == runs.grpo_key(wh, _cfg(tmp_path, training={"eval_k": 16}), "v1")
    assert key != runs.grpo_key(wh, _cfg(tmp_path, training={"steps": 7}), "v1")
    assert key != runs.grpo_key(wh, _cfg(tmp_path), "v2")
    assert key != runs.grpo_key(wh, _cfg(tmp_path, training={"init": "reference"}), "v1")
    wh.write_table("pivots_adv", pa.table({"turn_id": ["t1", "t2"]}))
    assert key != runs.grpo_key(wh, _cfg(tmp_path), "v1")


def test_base_and_init_models(tmp_path):
    wh = _warehouse(tmp_path)
    assert runs.base_model(_cfg(tmp_path, policy={"model": "sft"})) == "embedded"
    assert runs.base_model(_cfg(tmp_path, policy={"model": "/models/x"})) == "/models/x"
    assert runs.init_model(wh, _cfg(tmp_path)) == str(wh.model_dir("sft_policy"))
    assert runs.init_model(wh, _cfg(tmp_path, training={"init": "reference"}, policy={"model": "m"})) == "m"
