"""core/identity.py: markers put a field in its identities, and the identities of today's configs keep their values.

PINS were computed on the commit before the identity module (9aaad9e): code versions of the assets (not
rollout_rewards, which follows the verifiers' code), sampling fingerprints and run keys with the warehouse's data
versions, model fingerprints and split stubbed. A change here makes existing warehouses recompute: on purpose only.
Changed on purpose since: local_key and eval_key (evaluation draws seeded per sample, as profiling's); the SFT keys
(sft_key, own:sft_policy, the same-data SFT arm, ablation_results) when trl.SFTTrainer replaced the plain loop.
"""

from pathlib import Path
from typing import Annotated

import pytest
from pydantic import create_model

import pivot_assets.training.runs as runs
import pivot_assets.training.split as training_split
from pivot_assets.core import identity
from pivot_assets.core.config import PivotConfig, PolicySection, TrainingSection, load_config
from pivot_assets.core.identity import EVALUATION, ROLLOUTS, SAMPLING, TRAINING, In
from pivot_assets.pipeline import resolve_shared, stage_builders

REPO = Path(__file__).resolve().parents[2]
VARIANTS = {
    "default": ("pivot.yaml", None),
    "ablation_cpu": ("configs/ablation_cpu.yaml", None),
    "adaptive": ("pivot.yaml", {"profiling": {"adaptive": {"enabled": True}},
                                "training": {"reward_verifier": {"default": {"name": "exact"}}, "warmup_fraction": 0.2},
                                "pivots": {"lambda_diff": 0.5}}),
}
PINS = {
    "ablation_cpu": {
        "arm_key:grpo_adv": "7e12755793d63518",
        "arm_key:sft_same_data": "607e6f5f8f943733",
        "eval_key": "f14a95f6d078e315",
        "grpo_key": "9e1bc5486f82ec3e",
        "local_key": "241eed2690dc2c6f",
        "ood_key": "4e439fee64597dbc",
        "own:ablation_results": "3c6b260eb2f98583",
        "own:grpo_run": "767b5b12a5ff08ed",
        "own:pivot_dataset": "1-adv",
        "own:pivot_eval": "b4cecce7f88b81ee",
        "own:pivot_selection_log": "63d9166f4e0e4719",
        "own:pivots_adv": "63d9166f4e0e4719",
        "own:pivots_cand": "63d9166f4e0e4719",
        "own:pivots_mixed": "63d9166f4e0e4719",
        "own:rollouts": "3802b93db55ce22b|split:[0.3, 0.3, 0]",
        "own:sft_policy": "19459a1168467ed8",
        "own:turn_profiles": "4e833c82c617ab45",
        "sampling_fp:per_sample": "f5a3a659ed842705",
        "sampling_fp:per_turn": "f8e979cc7826fca1",
        "sft_key": "2fa0bee4c929cba1"
    },
    "adaptive": {
        "arm_key:grpo_adv": "fd71c921456f3189",
        "arm_key:sft_same_data": "45ef8b3b20669f1f",
        "eval_key": "d6ba9680f2bdec65",
        "grpo_key": "38beee2bb3fef969",
        "local_key": "c74b258f82ed7179",
        "ood_key": "4e439fee64597dbc",
        "own:grpo_run": "7929820a523fdae0",
        "own:pivot_dataset": "1-adv",
        "own:pivot_eval": "b8436edd3ea5df56",
        "own:pivot_selection_log": "dd7d895120b8f325",
        "own:pivots_adv": "dd7d895120b8f325",
        "own:pivots_cand": "dd7d895120b8f325",
        "own:pivots_mixed": "dd7d895120b8f325",
        "own:rollouts": "6172a03b5c6bc3b6|split:[0.1, 0.2, 0]",
        "own:sft_policy": "e18f1fb3e5ddceac",
        "own:turn_profiles": "64ef6c92966584ee",
        "sampling_fp:per_sample": "a46b860615f79da6",
        "sampling_fp:per_turn": "1a58a3703454c746",
        "sft_key": "9a0726cf1b702d01"
    },
    "default": {
        "arm_key:grpo_adv": "177c919ebda60857",
        "arm_key:sft_same_data": "45ef8b3b20669f1f",
        "eval_key": "76fdbf2c7d4bf8f4",
        "grpo_key": "96ace1d69f88a846",
        "local_key": "7350d2935d3a315e",
        "ood_key": "4e439fee64597dbc",
        "own:grpo_run": "ff6568a402fcdf48",
        "own:pivot_dataset": "1-adv",
        "own:pivot_eval": "ea2b97b77a3fdb4c",
        "own:pivot_selection_log": "63d9166f4e0e4719",
        "own:pivots_adv": "63d9166f4e0e4719",
        "own:pivots_cand": "63d9166f4e0e4719",
        "own:pivots_mixed": "63d9166f4e0e4719",
        "own:rollouts": "18c97d83420f1ad6",
        "own:sft_policy": "0e65df4f864c85e6",
        "own:turn_profiles": "8234690aefce42ac",
        "sampling_fp:per_sample": "a46b860615f79da6",
        "sampling_fp:per_turn": "1a58a3703454c746",
        "sft_key": "78eda1afd6453f36"
    }
}


class FakeWarehouse:
    root = Path("/nonexistent-wh")

    def data_version(self, name):
        return f"dv:{name}"

    def model_dir(self, name):
        return self.root / "models" / name


class FakeVerifiers:
    fingerprint = "vfp"


@pytest.fixture
def stubbed_keys(monkeypatch):
    """Run keys without a warehouse: data versions, model fingerprints and the split are stand-ins."""
    monkeypatch.setattr(runs, "model_fingerprint",
                        lambda model, cfg: f"model:{Path(model).name}:{cfg.policy.chat_template}:{cfg.policy.thinking}")
    monkeypatch.setattr(runs, "has_cuda", lambda: False)
    monkeypatch.setattr(runs, "trajectories_version", lambda wh: wh.data_version("trajectories"))
    monkeypatch.setattr(training_split, "split_fingerprint", lambda wh, split: "split")


def identity_values(cfg) -> dict:
    from pivot_assets.policies.base import SamplingConfig
    from pivot_assets.profiling.profiler import sampling_fingerprint
    from pivot_assets.training.evaluation import eval_key, local_key, ood_key

    out = {}
    wh, verifiers = resolve_shared(cfg)
    for build in stage_builders():
        for d in build(cfg, wh, verifiers):
            for spec in getattr(d, "specs", []):
                out[f"own:{spec.key.to_user_string()}"] = spec.code_version
    sampling = SamplingConfig.from_policy(cfg.policy)
    out["sampling_fp:per_turn"] = sampling_fingerprint(sampling, "per_turn")
    out["sampling_fp:per_sample"] = sampling_fingerprint(sampling, "per_sample")
    fake = FakeWarehouse()
    out["sft_key"] = runs.sft_key(fake, cfg)
    out["grpo_key"] = runs.grpo_key(fake, cfg, "vfp")
    for arm in ("grpo_adv", "sft_same_data"):
        out[f"arm_key:{arm}"] = runs.arm_key(fake, cfg, arm, 1, "vfp", ["t1", "t2"])
    out["local_key"] = local_key(cfg, ["t1", "t2"], FakeVerifiers(), 1)
    out["ood_key"] = ood_key(cfg, [{"prompt": "p", "answer": "a", "kind": "k"}])
    out["eval_key"] = eval_key(cfg, {"adv": ["t1"], "profiled": ["t1", "t2"]}, FakeVerifiers(), [{"prompt": "p"}], (0, 1))
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_identities_of_existing_configs_are_unchanged(variant, stubbed_keys, tmp_path):
    path, overrides = VARIANTS[variant]
    cfg = load_config(REPO / path, overrides={**(overrides or {}), "warehouse": str(tmp_path / "wh")})
    got = identity_values(cfg)
    assert {k: got[k] for k in PINS[variant]} == PINS[variant]


def _with(section_cls, **fields):
    """A subclass of a config section with extra fields: what adding a key to config.py does."""
    return create_model(f"Extended{section_cls.__name__}", __base__=section_cls, **fields)


def test_a_new_training_field_reaches_the_identities_its_marker_names():
    base = PivotConfig()
    trained = _with(TrainingSection, warm_restarts=(Annotated[int, In(TRAINING)], 0))
    evaluated = _with(TrainingSection, eval_temperature=(Annotated[float, In(EVALUATION)], 0.0))
    neither = _with(TrainingSection, log_every=(int, 1))

    def identities(training):
        cfg = base.model_copy(update={"training": training})
        return runs.training_identity(cfg), identity.eval_identity(cfg.training)

    train0, eval0 = identities(base.training)
    train1, eval1 = identities(trained(warm_restarts=2))
    assert train1 == {**train0, "warm_restarts": 2} and eval1 == eval0  # retrains; pivot_eval unchanged
    train2, eval2 = identities(evaluated(eval_temperature=0.5))
    assert train2 == train0 and eval2[0] == {**eval0[0], "eval_temperature": 0.5}  # re-evaluates, never retrains
    assert identities(neither(log_every=5)) == (train0, eval0)  # no marker: in no identity


def test_a_new_policy_field_reaches_rollouts_and_sampling_by_its_marker():
    from pivot_assets.profiling.profiler import policy_version

    rollouts_only = _with(PolicySection, repetition_penalty=(Annotated[float, In(ROLLOUTS)], 1.0))
    both = _with(PolicySection, min_p=(Annotated[float, In(ROLLOUTS, SAMPLING)], 0.0))
    base = PolicySection()
    assert identity.fields_in(rollouts_only, ROLLOUTS)[-1] == "repetition_penalty"
    assert "repetition_penalty" not in identity.fields_in(rollouts_only, SAMPLING)
    assert policy_version(rollouts_only(repetition_penalty=1.2)) != policy_version(base)
    assert policy_version(rollouts_only()) != policy_version(base)  # the key itself is new: a new version
    assert identity.values(both(min_p=0.1), SAMPLING) == {**identity.values(base, SAMPLING), "min_p": 0.1}
    assert identity.values(both(min_p=0.1), ROLLOUTS)["min_p"] == 0.1
    assert "engine_args" not in identity.fields_in(PolicySection, ROLLOUTS)  # a speed knob: in no identity


def test_one_hash_for_k():
    """policy.k enters the rollouts version and the rows' sampling_fp through the one fingerprint helper."""
    from pivot_assets.policies.base import SamplingConfig

    s = SamplingConfig(k=3)
    assert s.fingerprint == identity.fingerprint({"k": 3, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 256,
                                                  "seed": 0})
