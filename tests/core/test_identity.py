"""core/identity.py: markers put a field in its identities, and the identities of today's configs keep their values.

PINS were computed on the commit before the identity module (9aaad9e): code versions of the assets (not
rollout_rewards, which follows the verifiers' code), sampling fingerprints and run keys with the warehouse's data
versions, model fingerprints and split stubbed; REAL_PINS pin those pieces themselves, unstubbed, on a model dir and
a warehouse the test writes byte for byte. A change here makes existing warehouses recompute: on purpose only.
Changed on purpose since: local_key and eval_key (evaluation draws seeded per sample, as profiling's); the SFT keys
(sft_key, own:sft_policy, the same-data SFT arm, ablation_results) when trl.SFTTrainer replaced the plain loop;
the default config's pivot sets when its lambda_diff went from 0.6 to 0.7.
"""

from pathlib import Path
from typing import Annotated

import pytest
from pydantic import create_model

import pivot_assets.training.runs as runs
from pivot_assets.core import hardware, identity
from pivot_assets.core.config import (
    PivotConfig,
    PolicySection,
    EvaluationSection,
    TrainingSection,
    load_config,
)
from pivot_assets.core.identity import EVALUATION, ROLLOUTS, SAMPLING, TRAINING, In
from pivot_assets.core.split import ConversationSplit
from pivot_assets.shared import resolve_shared
from pivot_jobs.definitions import stage_builders

REPO = Path(__file__).resolve().parents[2]
VARIANTS = {
    "default": ("pivot.yaml", None),
    "ablation_cpu": ("configs/ablation_cpu.yaml", None),
    "adaptive": ("pivot.yaml", {"profiling": {"adaptive": {"enabled": True}},
                                "training": {"reward_verifier": {"default": {"name": "exact"}}, "warmup_fraction": 0.2},
                                "pivots": {"lambda_diff": 0.5},
                                # an override replaces a whole section: pinned when evaluation's keys were in it
                                "evaluation": {}}),
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
        "own:pivot_selection_log": "87603d4777708237",
        "own:pivots_adv": "87603d4777708237",
        "own:pivots_cand": "87603d4777708237",
        "own:pivots_mixed": "87603d4777708237",
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
    monkeypatch.setattr(hardware, "has_cuda", lambda: False)
    monkeypatch.setenv("PIVOT_NATIVE_BF16", "1")  # the pins were taken where `dtype: auto` resolves to bf16
    monkeypatch.setattr(runs, "trajectories_version", lambda wh: wh.data_version("trajectories"))
    monkeypatch.setattr(ConversationSplit, "fingerprint", lambda self, wh: "split")


def identity_values(cfg) -> dict:
    from pivot_assets.policies.base import SamplingConfig
    from pivot_assets.profiling.profiler import sampling_fingerprint
    from pivot_assets.evaluation.heldout import eval_key, local_key, ood_key

    out = {}
    shared = resolve_shared(cfg)
    wh, verifiers = shared.warehouse, shared.verifiers
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
    shared = _with(TrainingSection, prompt_suffix=(Annotated[str, In(TRAINING, EVALUATION)], ""))
    evaluated = _with(EvaluationSection, temperature=(Annotated[float, In(EVALUATION)], 0.0))
    neither = _with(TrainingSection, log_every=(int, 1))

    def identities(training=base.training, evaluation=base.evaluation):
        cfg = base.model_copy(update={"training": training, "evaluation": evaluation})
        return runs.training_identity(cfg), identity.eval_identity(cfg.training, cfg.evaluation)

    train0, eval0 = identities()
    train1, eval1 = identities(trained(warm_restarts=2))
    assert train1 == {**train0, "warm_restarts": 2} and eval1 == eval0  # retrains; pivot_eval unchanged
    train2, eval2 = identities(evaluation=evaluated(temperature=0.5))
    assert train2 == train0 and eval2[0] == {**eval0[0], "temperature": 0.5}  # re-evaluates, never retrains
    train3, eval3 = identities(shared(prompt_suffix="x"))
    assert train3 == {**train0, "prompt_suffix": "x"} and eval3 == [*eval0, "x"]  # both
    assert identities(neither(log_every=5)) == (train0, eval0)  # no marker: in no identity


def test_evaluation_keys_keep_their_training_names_in_the_identity_and_old_configs_get_a_pointer(tmp_path):
    """Evaluations cached before the `evaluation:` section existed stay cached; `training.eval_k` is a one-line
    error naming its new key."""
    from pivot_assets.core.config import ConfigError, load_config

    own = identity.eval_identity(PivotConfig().training, PivotConfig().evaluation)[0]
    assert own == {"eval_k": 4, "eval_seed": 0, "eval_max_turns": None, "bootstrap": 1000, "ood_probe": None,
                   "ood_max_items": None}
    path = tmp_path / "pivot.yaml"
    path.write_text("training: {steps: 3, eval_k: 2, bootstrap: 200}\n")
    with pytest.raises(ConfigError, match=r"training: bootstrap moved to evaluation.bootstrap; eval_k moved to "
                                          r"evaluation.k \(the `evaluation:` section\)$"):
        load_config(path)


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


# -- the pieces the stubs above stand in for, unstubbed, on fixed inputs ------------------------------------------
# The PINS above hold with model_fingerprint, has_cuda, trajectories_version and split_fingerprint stubbed: a change
# in any of those would change every real identity and still pass them. These pin each piece on inputs the test
# writes byte for byte (a model dir, a warehouse), and the keys composed from them. A change here makes existing
# warehouses retrain and re-evaluate: on purpose only.
FIXED_TEMPLATE = ("{%- for tool in tools or [] %}{{ tool | tojson }}\n{% endfor %}"
                  "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                  "{%- if add_generation_prompt %}<|assistant|>{% endif %}")
FIXED_MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
                      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                      "num_key_value_heads": 1, "vocab_size": 16, "_name_or_path": "/a/place/not/the/model"}
# trajectory id -> source conversation (None: its own), three conversations of two trajectories among them
FIXED_GROUPS = {f"traj{i:02d}": (f"conv{i // 2}" if i < 6 else None) for i in range(24)}
REAL_PINS = {
    "model_fingerprint": "local|w:7204b9f88b1220be|t:79a6f4f782a3b488",
    "model_fingerprint:embedded_template": "local|w:7204b9f88b1220be|t:81febc3f2f723331",
    "model_fingerprint:thinking_strip": "local|w:7204b9f88b1220be|t:79a6f4f782a3b488|think:strip",
    "trajectories_version": "fa43776ce0d61d57",
    "split_fingerprint:two_way": "43bb1cd52df6c7c1",
    "split_fingerprint:three_way": "bba1daf0ffdbedf6",
    "sft_key": "b2cbf83ec71edf43",
    "grpo_key": "e15f19cffe20fc06",
    "arm_key:grpo_adv": "c7866b6a3319ddcb",
    "arm_key:sft_same_data": "bb6a743765563ece",
}


def write_fixed_model(path: Path) -> Path:
    """A model dir whose bytes are fixed: config.json, one safetensors file of fixed values, a chat template that
    renders tools. What model_fingerprint reads, and nothing a library version or a CPU writes differently."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(FIXED_MODEL_CONFIG, indent=2, sort_keys=True), encoding="utf-8")
    save_file({"model.embed_tokens.weight": (np.arange(128, dtype=np.float32) / 128).reshape(16, 8)},
              str(path / "model.safetensors"))
    (path / "chat_template.jinja").write_text(FIXED_TEMPLATE, encoding="utf-8")
    return path


def write_fixed_warehouse(root: Path):
    import pyarrow as pa

    from pivot_assets.core.warehouse import Warehouse

    wh = Warehouse(root)
    wh.write_table("trajectories", pa.table({"trajectory_id": list(FIXED_GROUPS),
                                             "conversation_id": list(FIXED_GROUPS.values())}))
    return wh


def real_identity_values(tmp_path: Path, monkeypatch) -> dict:
    monkeypatch.setenv("PIVOT_NATIVE_BF16", "1")  # the pins were taken where `dtype: auto` resolves to bf16
    model = str(write_fixed_model(tmp_path / "somewhere" / "model"))
    wh = write_fixed_warehouse(tmp_path / "wh")
    cfg = PivotConfig.model_validate({"policy": {"model": model},
                                      "training": {"init": "reference", "eval_fraction": 0.3}})
    three_way = cfg.model_copy(update={"training": cfg.training.model_copy(update={"warmup_fraction": 0.25})})
    out = {
        "model_fingerprint": runs.model_fingerprint(model, cfg),
        "model_fingerprint:embedded_template": runs.model_fingerprint(
            model, cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"chat_template": "embedded"})})),
        "model_fingerprint:thinking_strip": runs.model_fingerprint(
            model, cfg.model_copy(update={"policy": cfg.policy.model_copy(update={"thinking": "strip"})})),
        "trajectories_version": runs.trajectories_version(wh),
        "split_fingerprint:two_way": ConversationSplit.from_config(cfg).fingerprint(wh),
        "split_fingerprint:three_way": ConversationSplit.from_config(three_way).fingerprint(wh),
    }
    # the composed keys also name the training device: pinned as on a CPU box (has_cuda is pinned on its own below)
    monkeypatch.setattr(hardware, "has_cuda", lambda: False)
    out["sft_key"] = runs.sft_key(wh, cfg)
    out["grpo_key"] = runs.grpo_key(wh, cfg, "vfp")
    for arm in ("grpo_adv", "sft_same_data"):
        out[f"arm_key:{arm}"] = runs.arm_key(wh, cfg, arm, 1, "vfp", ["t1", "t2"])
    return out


def test_real_identity_pieces_on_fixed_inputs_are_unchanged(tmp_path, monkeypatch):
    got = real_identity_values(tmp_path, monkeypatch)
    assert got == REAL_PINS
    # the split's sides are not empty: the two-way and three-way fingerprints hash real held-out / warm-up sets
    assert got["split_fingerprint:two_way"] != got["split_fingerprint:three_way"]


def test_real_identity_pieces_follow_their_inputs(tmp_path, monkeypatch):
    """Each pinned piece moves with what it names, and not with where the model or the warehouse lies."""
    import pyarrow as pa

    base = real_identity_values(tmp_path / "a", monkeypatch)
    assert real_identity_values(tmp_path / "b", monkeypatch) == base  # other paths, same bytes: same identities
    model = tmp_path / "a" / "somewhere" / "model"
    (model / "chat_template.jinja").write_text(FIXED_TEMPLATE + " ", encoding="utf-8")
    assert runs.model_fingerprint(str(model), PivotConfig.model_validate({"policy": {"model": str(model)}})) \
        != base["model_fingerprint"]
    from pivot_assets.core.warehouse import Warehouse

    wh = Warehouse(tmp_path / "a" / "wh")
    wh.write_table("trajectories", pa.table({"trajectory_id": list(FIXED_GROUPS)[:-1],
                                             "conversation_id": list(FIXED_GROUPS.values())[:-1]}))
    assert runs.trajectories_version(wh) != base["trajectories_version"]


def test_has_cuda_is_torchs_answer():
    """The stub above says has_cuda() is False; the real one asks torch, and the training device follows it."""
    import torch

    assert hardware.has_cuda() is torch.cuda.is_available()
    assert hardware.training_device() == ("cuda" if torch.cuda.is_available() else "cpu")


def test_tiny_model_is_built_the_same_every_time(tiny_model_dir, embedded_model_dir, tmp_path):
    """tests/tiny_model.py's model stands in for the embedded one in the plumbing tests, which compare identities
    computed from it across runs: two builds from its seed give the same weights, so the same model fingerprint.
    (On one machine: torch's CPU kernels draw the random init differently without AVX2, so no value is pinned.)"""
    from pivot_assets.policies.models import PromptFormat, policy_fingerprint
    from tests.tiny_model import build_tiny_model

    first = build_tiny_model(embedded_model_dir, tmp_path / "first")
    second = build_tiny_model(embedded_model_dir, tmp_path / "second")
    fingerprints = {policy_fingerprint(str(p), PromptFormat()) for p in (first, second, tiny_model_dir)}
    assert len(fingerprints) == 1, fingerprints
    other_seed = build_tiny_model(embedded_model_dir, tmp_path / "other", seed=1)
    assert policy_fingerprint(str(other_seed), PromptFormat()) not in fingerprints  # the weights are in it
