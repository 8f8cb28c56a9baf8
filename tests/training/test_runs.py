"""Run keys and completion markers: what retrains a model and what never does."""

from __future__ import annotations

import pyarrow as pa
import yaml

from pivot_assets.core import hardware
from pivot_assets.core.config import load_config
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.evaluation.heldout import eval_seed
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
    monkeypatch.setattr("pivot_assets.policies.models.policy_fingerprint", lambda model, fmt=None: f"fp:{model}")
    wh = _warehouse(tmp_path)
    key = runs.sft_key(wh, _cfg(tmp_path))
    assert key == runs.sft_key(wh, _cfg(tmp_path))
    assert key != runs.sft_key(wh, _cfg(tmp_path, sft={"steps": 3}))
    assert key != runs.sft_key(wh, _cfg(tmp_path, training={"eval_fraction": 0.3}))
    assert key != runs.sft_key(wh, _cfg(tmp_path, training={"warmup_fraction": 0.3}))  # trains on another split
    assert key == runs.sft_key(wh, _cfg(tmp_path, evaluation={"k": 16}))  # evaluation-only: no retrain
    assert key != runs.sft_key(_warehouse(tmp_path, rows=("a", "c")), _cfg(tmp_path))


def test_grpo_key_ignores_evaluation_keys_and_follows_training_verifier_and_pivots(tmp_path, monkeypatch):
    monkeypatch.setattr("pivot_assets.policies.models.policy_fingerprint", lambda model, fmt=None: f"fp:{model}")
    wh = _warehouse(tmp_path)
    wh.write_table("pivots_adv", pa.table({"turn_id": ["t1"]}))
    key = runs.grpo_key(wh, _cfg(tmp_path), "v1")
    assert key == runs.grpo_key(wh, _cfg(tmp_path, evaluation={"k": 16}), "v1")
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


def test_eval_seed_is_apart_from_profiling_and_the_same_for_every_policy(tmp_path):
    cfg = _cfg(tmp_path)
    seed = eval_seed(cfg)
    assert seed != cfg.policy.seed and seed == eval_seed(_cfg(tmp_path, policy={"model": "sft"}))
    assert seed != eval_seed(_cfg(tmp_path, evaluation={"seed": 1}))
    # evaluation-only keys never retrain: the training identity ignores them
    ident = runs.training_identity(cfg)
    for extra in ({"seed": 3}, {"bootstrap": 200}, {"ood_max_items": 10}, {"max_turns": 5}):
        assert runs.training_identity(_cfg(tmp_path, evaluation=extra)) == ident
    assert runs.training_identity(_cfg(tmp_path, training={"reward_verifier": {"default": {"name": "exact"}}})) != ident


def test_arm_models_are_keyed_by_arm_seed_and_pool_and_evaluation_keys_never_retrain(tmp_path, monkeypatch):
    monkeypatch.setattr("pivot_assets.policies.models.policy_fingerprint", lambda model, fmt=None: f"fp:{model}")
    wh = _warehouse(tmp_path)
    for table in ("pivots_adv", "pivots_cand", "pivots_mixed"):
        wh.write_table(table, pa.table({"turn_id": [table]}))
    cfg = _cfg(tmp_path, ablation={"seeds": [0, 1]})
    dirs = {runs.arm_dir(a, s) for a in cfg.ablation.arms for s in cfg.ablation.seeds}
    assert len(dirs) == 10 and all(wh.model_dir(d) for d in dirs)
    keys = {runs.arm_key(wh, cfg, a, s, "v", ["u1"]) for a in cfg.ablation.arms for s in cfg.ablation.seeds}
    assert len(keys) == 10
    key = runs.arm_key(wh, cfg, "grpo_adv", 0, "v", ["u1"])
    for evaluation_only in ({"evaluation": {"k": 9}}, {"evaluation": {"bootstrap": 200}},
                            {"ablation": {"seeds": [0, 1], "primary": "adv"}}):
        sections = {"ablation": {"seeds": [0, 1]}, **evaluation_only}
        assert key == runs.arm_key(wh, _cfg(tmp_path, **sections), "grpo_adv", 0, "v", ["u1"]), evaluation_only
    assert key != runs.arm_key(wh, _cfg(tmp_path, ablation={"epochs": 2}), "grpo_adv", 0, "v", ["u1"])
    for unused in ({"training": {"steps": 3}}, {"training": {"set": "mixed"}}, {"sft": {"steps": 5}}):  # grpo_run's
        sections = {"ablation": {"seeds": [0, 1]}, **unused}
        assert key == runs.arm_key(wh, _cfg(tmp_path, **sections), "grpo_adv", 0, "v", ["u1"]), unused
    sft = runs.arm_key(wh, cfg, "sft_same_data", 0, None, ["u1"])
    assert sft == runs.arm_key(wh, _cfg(tmp_path, ablation={"seeds": [0, 1]}, sft={"steps": 5}), "sft_same_data", 0,
                               None, ["u1"])
    assert sft != runs.arm_key(wh, _cfg(tmp_path, ablation={"seeds": [0, 1]}, sft={"batch_size": 5}),
                               "sft_same_data", 0, None, ["u1"])
    assert key != runs.arm_key(wh, cfg, "grpo_adv", 0, "v", ["u1", "u2"])  # another pool (a D_cand draw)
    assert key != runs.arm_key(wh, _cfg(tmp_path, ablation={"seeds": [0, 1]}, training={"warmup_fraction": 0.2}),
                               "grpo_adv", 0, "v", ["u1"])
    assert runs.reference_model(wh, _cfg(tmp_path, policy={"model": "sft"})) == str(wh.model_dir("sft_policy"))
    assert runs.reference_model(wh, _cfg(tmp_path, policy={"model": "embedded"})) == "embedded"


def test_steps_come_from_the_pool_size_and_epochs(tmp_path):
    assert runs.steps_for_pool(25, 1, 1.0) == 25
    assert runs.steps_for_pool(25, 4, 1.0) == 7  # the last batch of a pass is short (SFT) or padded (GRPO)
    assert runs.steps_for_pool(25, 4, 2.0) == 14 and runs.steps_for_pool(1, 8, 1.0) == 1
    assert runs.steps_for_pool(10, 3, 1.5) == 6
    cfg = _cfg(tmp_path, training={"num_generations": 4}, sft={"batch_size": 3})
    assert runs.prompts_per_step(cfg, "grpo") == 1 and runs.prompts_per_step(cfg, "sft") == 3
    wide = _cfg(tmp_path, training={"num_generations": 4, "grpo": {"per_device_train_batch_size": 8,
                                                                   "gradient_accumulation_steps": 2}})
    assert runs.prompts_per_step(wide, "grpo") == 4
    import pytest

    with pytest.raises(ValueError, match="multiple of num_generations"):
        runs.prompts_per_step(_cfg(tmp_path, training={"num_generations": 4,
                                                       "grpo": {"per_device_train_batch_size": 6}}), "grpo")


def test_each_ablation_seed_has_its_own_evaluation_draw_and_seed_0_is_pivot_evals(tmp_path):
    cfg = _cfg(tmp_path)
    draws = {eval_seed(cfg, s) for s in range(4)}
    assert len(draws) == 4 and eval_seed(cfg, 0) == eval_seed(cfg)


def test_ablation_config_rejects_unknown_arms(tmp_path):
    import pytest

    from pivot_assets.core.config import ConfigError

    with pytest.raises(ConfigError, match="ablation.arms"):
        _cfg(tmp_path, ablation={"arms": ["grpo_everything"]})
    assert _cfg(tmp_path).ablation is None
    with pytest.raises(ConfigError, match="ablation.steps is gone"):
        _cfg(tmp_path, ablation={"steps": 8})
    with pytest.raises(ConfigError, match="ablation.primary"):
        _cfg(tmp_path, ablation={"primary": "everything"})
    with pytest.raises(ConfigError, match="no training pool"):
        _cfg(tmp_path, training={"eval_fraction": 0.5, "warmup_fraction": 0.5})


def test_a_gpu_run_key_records_the_dtype_resolved_on_the_gpu(tmp_path, monkeypatch):
    """The GRPO key names the device training runs on and the dtype resolved there: on a GPU with bf16 and a CPU
    without it, `dtype: auto` is bf16 in the key, not the CPU's fp32."""

    monkeypatch.setattr("pivot_assets.policies.models.policy_fingerprint", lambda model, fmt=None: f"fp:{model}")
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": (device.startswith("cuda"), "stub"))
    wh = _warehouse(tmp_path)
    wh.write_table("pivots_adv", pa.table({"turn_id": ["t1"]}))
    cfg = _cfg(tmp_path)
    monkeypatch.setattr(hardware, "has_cuda", lambda: False)
    cpu_key, cpu_identity = runs.grpo_key(wh, cfg, "v1"), runs.training_identity(cfg, hardware.training_device())
    monkeypatch.setattr(hardware, "has_cuda", lambda: True)
    gpu_key, gpu_identity = runs.grpo_key(wh, cfg, "v1"), runs.training_identity(cfg, hardware.training_device())
    assert (cpu_identity["dtype"], gpu_identity["dtype"]) == ("float32", "bfloat16")
    assert cpu_key != gpu_key
    # the same keys without the device: only the dtype and the device (cpu_smoke) tell them apart
    assert {k: v for k, v in cpu_identity.items() if k != "dtype"} == {k: v for k, v in gpu_identity.items() if k != "dtype"}
