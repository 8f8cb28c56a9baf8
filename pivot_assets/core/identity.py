"""Identity: which config fields decide what is stale and what is a cache hit (Dagster-free).

A config field belongs to an identity by a marker in its annotation, read here and nowhere else:

    k: Annotated[int, In(ROLLOUTS, SAMPLING)] = Field(8, ge=1)

A field with no marker belongs to no identity (a speed knob, a path of the shell). A new field says where it
belongs where it is declared; no list elsewhere has to remember it. The identities:

    ROLLOUTS    policy: what changes the samples (the code version of `rollouts`, with the resolved dtype)
    SAMPLING    policy: a rollout row's sampling_fp (per-sample seeding drops k: sample i is the same draw whatever k)
    PIVOTS      pivots: the code version of the pivot sets
    SFT         sft: the SFT model's key and sft_policy's code version
    TRAINING    training: a GRPO model's key and grpo_run's code version (the ablation's arms too)
    EVALUATION  training: pivot_eval's code version (evaluation-only keys never retrain a model)
    REFRESH     refresh: a refresh round's code version and model key (refresh/rounds.py)

Every code version, run key and row key is `fingerprint(...)`: core/ids.short_hash of core/ids.canonical_json.
The config-only identities are computed here from the sections they read (typed BaseModel: core/config.py imports
this module for the marker, so it cannot import the config back); the run keys (training/runs.py,
evaluation/heldout.py) add the split, data versions and model fingerprints. The shapes below keep the hashes of
existing warehouses.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from .ids import canonical_json, short_hash

ROLLOUTS, SAMPLING, PIVOTS = "rollouts", "sampling", "pivots"
SFT, TRAINING, EVALUATION = "sft", "training", "evaluation"
REFRESH = "refresh"
# What trains the SFT model: TRL's SFTTrainer (its schedule, accumulation and loss normalisation) since it
# replaced the plain AdamW loop; a change of trainer is a new model.
SFT_TRAINER = "trl.SFTTrainer"


class In:
    """The marker: `Annotated[type, In(identity, ...)]` puts a config field in those identities."""

    def __init__(self, *identities: str) -> None:
        self.identities = frozenset(identities)

    def __repr__(self) -> str:
        return f"In({', '.join(sorted(self.identities))})"


def fingerprint(obj: Any) -> str:
    """The one hash of an identity: short_hash(canonical_json(obj))."""
    return short_hash(canonical_json(obj))


def fields_in(section: type[BaseModel] | BaseModel, identity: str) -> list[str]:
    """The section's fields marked with `identity`, in declaration order."""
    model = section if isinstance(section, type) else type(section)
    return [name for name, info in model.model_fields.items()
            if any(isinstance(m, In) and identity in m.identities for m in info.metadata)]


def values(section: BaseModel, identity: str) -> dict:
    """{field: value as dumped} of the section's fields in `identity`."""
    names = fields_in(section, identity)
    dumped = section.model_dump(include=set(names))
    return {name: dumped[name] for name in names}


# -- the config-only identities ---------------------------------------------------------------------
def adaptive_identity(adaptive: BaseModel | None, rule: dict) -> dict:
    """What adaptive stopping adds to the identity of the samples and profiles: its settings and the selection
    rule it settles turns on (`rule`: profiling/adaptive.AdvBounds.identity; pivotrl's is {"lambda_diff": value}),
    or nothing when it is off."""
    if adaptive is None or not adaptive.enabled:
        return {}
    fields = adaptive.model_dump()
    if fields["scheduler"] == "rounds":  # the rounds' samples do not depend on a wave size (and keep their identity)
        fields = {k: v for k, v in fields.items() if k not in ("scheduler", "wave_samples")}
    return {"adaptive": {**fields, **rule}}


def pivots_version(pivots: BaseModel) -> str:
    """Code version of the pivot sets: the `pivots:` section, less the rule fields idle under the rule in force
    (PivotsSection.idle_rule_fields: the default rule adds nothing, which keeps existing versions)."""
    idle = pivots.idle_rule_fields()
    return fingerprint({k: v for k, v in values(pivots, PIVOTS).items() if k not in idle})


def sft_identity(sft: BaseModel, dtype: str) -> dict:
    """The `sft:` section's part of the SFT model's identity: `dtype` as resolved on the device SFT runs on
    (core/hardware.sft_precision; training/runs.sft_identity adds the split)."""
    section = values(sft, SFT)
    if section.get("model") == "embedded":
        section.pop("model")  # the default keeps the keys of models trained before the field existed
    return {**section, "dtype": dtype, "trainer": SFT_TRAINER}


def training_identity(training: BaseModel, dtype: str) -> dict:
    """The training section's TRAINING fields (the evaluation section never retrains) and `dtype` as resolved on the
    device training runs on (core/hardware.training_precision: a run key on the real one; an asset's code version,
    built without torch, on the CPU)."""
    section = values(training, TRAINING)
    if section.get("reward_verifier") is None:
        section.pop("reward_verifier", None)  # the default keeps the keys of models trained before it existed
    return {**section, "dtype": dtype}


def launch_identity(training: BaseModel) -> dict:
    """What a launched run (grpo_run, sft_policy; the ablation's arms and refresh rounds train in-process) adds to a model's identity: its world size (each DDP process takes a per-device batch,
    so the global batch grows with it). One process, launched or not, trains as in-process does: nothing, which
    keeps the keys of models trained before the launcher existed. ZeRO-3 and FSDP shard the same math: not in it."""
    n = training.num_processes if training.launcher != "inprocess" else 1
    return {"processes": n} if n > 1 else {}


# The `evaluation:` section's keys as they were named in `training:` (config.py points a config still using them to
# the new keys; pivot_eval's identity keeps these names, so evaluations cached before the section stay cached).
MOVED_TO_EVALUATION = {"eval_k": "k", "eval_seed": "seed", "eval_max_turns": "max_turns", "bootstrap": "bootstrap",
                       "ood_probe": "ood_probe", "ood_max_items": "ood_max_items"}


def eval_identity(training: BaseModel, evaluation: BaseModel) -> list:
    """pivot_eval's code version: [the `evaluation:` section, under the names its keys had in `training:` (so
    evaluations cached before the section existed stay cached), then the training fields evaluation also depends
    on (the split and the completion length), in declaration order]."""
    legacy_name = {new: old for old, new in MOVED_TO_EVALUATION.items()}
    own = {legacy_name.get(k, k): v for k, v in values(evaluation, EVALUATION).items()}
    return [own, *values(training, EVALUATION).values()]
