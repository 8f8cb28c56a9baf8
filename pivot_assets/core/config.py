"""pivot.yaml: the one configuration file (Dagster-free).

Resolution order: an explicit path (`--config FILE`), else $PIVOT_CONFIG, else ./pivot.yaml if present,
else the built-in defaults (embedded synthetic sample, ./warehouse). Relative paths in the file are
relative to the file itself. Every error is a `ConfigError` with a one-line message naming the key or path.
A field's `In(...)` marker names the identities (code versions, cache keys) it belongs to: core/identity.py.
"""

from __future__ import annotations

import glob
import importlib
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_serializer,
                      model_validator)
from pydantic.json_schema import SkipJsonSchema

from pivot_assets.core.engines import AUTO, EngineChoice, capabilities, choose_engine
from pivot_assets.core.identity import EVALUATION, PIVOTS, ROLLOUTS, SAMPLING, SFT, TRAINING, In
from pivot_assets.core.identity import MOVED_TO_EVALUATION, REFRESH

Dtype = Literal["auto", "float32", "bfloat16"]
LAMBDA_DIFF = 0.6  # pivots.lambda_diff's default: the one source (contracts and the profiler's defaults read it)
# The selection rules that decide D_adv (curation/selection.py defines them), each with the field holding its
# parameter. pivotrl is the default: the rule the pivot sets had before there was a choice.
SELECTION_RULES = {"pivotrl": "lambda_diff", "band": "band", "variance_top_p": "top_p", "std_min": "min_std"}
DEFAULT_RULE = "pivotrl"
BAND, TOP_P, MIN_STD = (0.2, 0.8), 0.5, 0.3  # the rule parameters' defaults
STATE_DIR = ".warehouse-state"  # beside the config: the local state of s3:// warehouses, one dir per bucket/prefix


class ConfigError(ValueError):
    """A configuration problem, phrased as one line for the user."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# A verifier: its name, or {name: ..., **its parameters} (verifiers/registry.py checks both when the sets are built)
VerifierSpec = str | dict[str, Any]


def _spec(v):
    if not isinstance(v, (str, dict)):
        raise ValueError(f"a verifier is a name or a mapping with a 'name', got {v!r:.60}")
    return v


class VerifierSection(_Strict):
    """A verifier set: a default verifier and optional per-domain ones. The shape of `verifier:`,
    training.reward_verifier and ablation.exact_verifier; the specs are built and checked, as config errors, where
    the verifier sets are resolved (verifiers/sets.py: core does not import the verifiers)."""

    default: VerifierSpec = Field(default_factory=lambda: {"name": "tool_call"}, description=(
        "The verifier of every domain not listed in `domains`: a verifier name, or {name: ..., **its parameters}."))
    domains: dict[str, VerifierSpec] = Field(default_factory=dict, description=(
        "Per-domain verifiers: domain name -> verifier name or {name: ..., **its parameters}."))

    @field_validator("default", mode="before")
    @classmethod
    def _default_spec(cls, v):
        return _spec({"name": "tool_call"} if v is None else v)

    @field_validator("domains", mode="before")
    @classmethod
    def _domain_specs(cls, v):
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise ValueError("must map domain names to verifiers")
        return {d: _spec(spec) for d, spec in v.items()}

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """No empty `domains`: a section dumps as a config that sets none was written (identities hash the dump)."""
        data = handler(self)
        if not data.get("domains"):
            data.pop("domains", None)
        return data


def input_formats() -> tuple[str, ...]:
    """The input formats' names: `auto`, then every registered format (pivot_assets/ingest/formats/registry.py).
    Asked when an input names a format or the schema is written, never at import: core sits below ingest (the
    layers contract), so the registry is looked up by module name at run time rather than imported."""
    registry = importlib.import_module("pivot_assets.ingest.formats.registry")
    return (registry.AUTO, *registry.names())


def _input_format_schema(schema: dict) -> None:
    """The JSON Schema of `inputs[].format`: the registered names (editors complete them; the reference lists
    them) and each format's one-line description."""
    registry = importlib.import_module("pivot_assets.ingest.formats.registry")
    schema["enum"] = list(input_formats())
    schema["description"] += f" Formats: {registry.describe()}."


class InputSpec(_Strict):
    """One input: a file, directory or glob of SFT trajectories in one format."""

    path: str = Field(description="A file, directory or glob of trajectories (relative to the config file).")
    format: str = Field("auto", json_schema_extra=_input_format_schema, description=(
        "The input format; auto: detected from each record (ingest/formats/: one module per format)."))
    domain: str | None = Field(None, description=(
        "The domain given to every record of this input; null: the record's own, else `default`."))
    tools: str | None = Field(None, description=(
        "A JSON file of OpenAI tool schemas given to every record of this input that carries none "
        "(ingest/inputs.py)."))
    answers: str | None = Field(None, description=(
        "BFCL possible answers: a file, or a folder of them named like the data files; null: "
        "possible_answer/<the data file's name> beside each data file (ingest/bfcl_records.py)."))

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v != "auto" and v not in input_formats():
            raise ValueError(f"unknown input format {v!r} (one of {', '.join(input_formats())})")
        return v


class PolicySection(_Strict):
    """The reference policy that profiles every turn: K samples per turn, each scored by the verifier."""

    backend: Annotated[Literal["transformers", "vllm", "openai", "auto"], In(ROLLOUTS)] = Field(
        "transformers", description=(
            "transformers | vllm | openai | auto: vLLM where it is installed (make setup-vllm), else transformers; "
            "with a base_url: openai (core/engines.py). Resolved when read: the rollouts' identity records the "
            "engine that ran."))
    model: Annotated[str, In(ROLLOUTS)] = Field("embedded", description=(
        "A local model dir (with config.json); a Hugging Face Hub id, `org/name` or `org/name@revision` (a branch, "
        "tag or commit), taken from the Hub cache ($HF_HOME/hub), else downloaded unless HF_HUB_OFFLINE is set, and "
        "identified by the snapshot's commit (policies/hub.py); the served model's name (openai); `sft` (the SFT "
        "warm-up, started from sft.model); or `embedded` (the tiny built-in model)."))
    base_url: Annotated[str | None, In(ROLLOUTS)] = Field(None, description=(
        "An OpenAI-compatible server's URL (backend openai); null: the model runs in this process."))
    api_key_env: str | None = Field(None, description=(
        "The environment variable holding the server's API key (backend openai); null: OPENAI_API_KEY."))
    k: Annotated[int, In(ROLLOUTS, SAMPLING)] = Field(8, ge=1, description=(
        "Samples drawn per turn (the paper's K); the most per turn with adaptive profiling."))
    temperature: Annotated[float, In(ROLLOUTS, SAMPLING)] = Field(1.0, ge=0.0, description="Sampling temperature.")
    top_p: Annotated[float, In(ROLLOUTS, SAMPLING)] = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling p.")
    max_new_tokens: Annotated[int, In(ROLLOUTS, SAMPLING)] = Field(256, ge=1, description=(
        "Tokens generated per sample at most."))
    seed: Annotated[int, In(ROLLOUTS, SAMPLING)] = Field(0, description="Seed of the sampling draws.")
    limit_turns: Annotated[int | None, In(ROLLOUTS)] = Field(None, ge=1, description=(
        "Profile only the first N turns by turn_id (a stable, content-derived order), e.g. for a quick run; null: all."))
    max_prompt_tokens: Annotated[int | None, In(ROLLOUTS)] = Field(None, ge=1, description=(
        "Turns whose rendered prompt has more tokens are not profiled (listed in skipped_turns); null: the "
        "model's context minus max_new_tokens (profiling/prompt_guard.py)."))
    dtype: Dtype = Field("auto", description=(
        "Weights' precision; auto: bf16 only where the device runs it natively (core/hardware.py)."))
    device: Annotated[str, In(ROLLOUTS)] = Field("cpu", description=(
        "cpu | cuda | cuda:N (transformers backend; vllm: cpu or cuda)."))
    batch_size: int = Field(64, ge=1, description="Decode rows (turns x K) per engine call, and per rollouts part.")
    engine_args: dict[str, Any] = Field(default_factory=dict, description=(
        "vllm backend: extra vllm.LLM arguments (enforce_eager, max_model_len, kv_cache_memory_bytes, "
        "block_size, ...); speed and memory knobs, so not part of the policy identity."))
    concurrency: int = Field(8, ge=1, description="Requests in flight at once (backend openai).")
    chat_template: Annotated[str, In(ROLLOUTS)] = Field("auto", description=(
        "auto (the model's own template when it renders tools; the embedded Hermes one for the embedded model or "
        "a model whose template drops tools) | embedded | model | PATH of a Jinja file (policies/models.py)."))
    thinking: Annotated[Literal["keep", "strip", "off"], In(ROLLOUTS)] = Field("keep", description=(
        "keep: the thought stays in the completion (the verifier skips it) | strip: a closed thought is cut "
        "before storing | off: the template's enable_thinking=False switch (policies/thinking.py)."))
    thinking_budget: Annotated[int | None, In(ROLLOUTS)] = Field(None, ge=1, description=(
        "Tokens of thought before </think> is forced (transformers); null: no budget."))
    _engine_reason: str = PrivateAttr("named by policy.backend")

    @model_validator(mode="wrap")
    @classmethod
    def _resolve_auto(cls, data, handler):
        """`backend: auto` becomes the engine it picks here; why is kept for the run's log (engine_choice)."""
        choice = None
        if isinstance(data, dict) and data.get("backend") == AUTO:
            choice = choose_engine(AUTO, base_url=data.get("base_url"), thinking_budget=data.get("thinking_budget"))
            data = {**data, "backend": choice.name}
        section = handler(data)
        if choice is not None:
            section._engine_reason = choice.reason
        return section

    @property
    def engine_choice(self) -> EngineChoice:
        """The engine this section runs and why (`auto`'s pick, or the one it names)."""
        return EngineChoice(self.backend, self._engine_reason)


class AdaptiveSection(_Strict):
    """Adaptive profiling (profiling/adaptive.py, docs/adaptive.md): sample each turn in rounds of
    `round_size` up to policy.k, and stop once its membership in `sets` is settled."""

    enabled: bool = Field(False, description="Sample in rounds and stop early; off: every turn gets policy.k samples.")
    rule: Literal["exact", "posterior"] = Field("posterior", description=(
        "exact: stop only when no completion of the remaining samples can change the membership (never wrong); "
        "posterior: also stop when a Beta posterior says it changes with probability < epsilon."))
    round_size: int = Field(2, ge=1, description="Samples drawn per turn in each round.")
    sets: list[Literal["mixed", "adv"]] = Field(default_factory=lambda: ["mixed", "adv"], min_length=1, description=(
        "The pivot sets whose membership must be settled before a turn stops."))
    epsilon: float = Field(0.05, gt=0.0, lt=1.0, description=(
        "posterior rule: stop when the membership changes with probability below this."))
    prior: Literal["pooled", "likelihood"] = Field("likelihood", description=(
        "The posterior's Beta prior, fitted on every turn's first round (empirical Bayes): pooled (one Beta for "
        "all turns) | likelihood (its mean follows the expert action's log-likelihood under the reference "
        "policy)."))
    scheduler: Literal["rounds", "waves", "stream"] = Field("rounds", description=(
        "rounds: every open turn is sampled once per round, the rounds one after another (the prior fitted once, "
        "on every turn's first round) | waves: engine calls of wave_samples samples, each scored and decided as it "
        "returns, its freed room given to the next turns (the prior refitted before every call on the first rounds "
        "in so far; profiling/adaptive.py run_waves) | stream: wave_samples single requests kept in the "
        "engine, each turn decided as its chunk comes in, a settled turn's requests still in flight cancelled "
        "(run_stream; an engine that streams requests, vLLM, in this process: not with scale.engine ray)."))
    wave_samples: int = Field(64, ge=1, description=(
        "waves: samples per engine call; stream: requests kept in the engine (the engine's batch capacity: "
        "policy.batch_size for the transformers backend; larger keeps vLLM's continuous batching full)."))


class ProfilingSection(_Strict):
    """How turns are sampled when profiled."""

    seeding: Literal["per_sample", "per_turn"] = Field("per_sample", description=(
        "per_sample: sample i of a turn is drawn under its own seed (sample_seed(policy.seed, i), then by turn), "
        "so it is the same draw whatever k, the engine or adaptive stopping; per_turn: one generator for a turn's "
        "K samples (the local engine's seeding before adaptive profiling; keeps a warehouse profiled so cached)."))
    adaptive: AdaptiveSection = Field(default_factory=AdaptiveSection, description="Adaptive profiling (off by default).")

    @model_validator(mode="after")
    def _adaptive_needs_per_sample_seeds(self):
        if self.adaptive.enabled and self.seeding != "per_sample":
            raise ValueError("adaptive.enabled needs seeding: per_sample (sample i must be the same draw whenever "
                             "sampling stops)")
        return self


class PivotsSection(_Strict):
    """Pivot selection: which profiled turns become the pivot sets (mixed, adv, cand)."""

    rule: Annotated[Literal[tuple(SELECTION_RULES)], In(PIVOTS)] = Field(DEFAULT_RULE, description=(
        "The rule that picks the adv set from the mixed turns (reward_var > 0): pivotrl (reward mean <= "
        "lambda_diff; PivotRL) | band (band[0] < reward mean < band[1]; verl #2791, OpenRLHF "
        "dynamic_filtering_range) | variance_top_p (the highest-variance mixed turns holding top_p of their total "
        "variance; RAGEN-2) | std_min (reward std >= min_std; OpenRLHF #1270, for continuous rewards). Adaptive "
        "profiling settles turns on the rule's own bounds (pivotrl, band, std_min); it refuses variance_top_p."))
    lambda_diff: Annotated[float, In(PIVOTS)] = Field(LAMBDA_DIFF, ge=0.0, le=1.0, description=(
        "The adv set keeps mixed turns whose reward mean is at most this (the paper's lambda_diff; rule pivotrl)."))
    band: Annotated[list[Annotated[float, Field(ge=0.0, le=1.0)]], In(PIVOTS)] = Field(
        list(BAND), min_length=2, max_length=2, description=(
            "rule band: the adv set keeps mixed turns whose reward mean lies strictly between these two ends "
            "[low, high] (0 <= low < high <= 1)."))
    top_p: Annotated[float, In(PIVOTS)] = Field(TOP_P, gt=0.0, le=1.0, description=(
        "rule variance_top_p: the adv set is the smallest prefix of the mixed turns, ranked by reward variance, "
        "that holds this share of their total variance."))
    min_std: Annotated[float, In(PIVOTS)] = Field(MIN_STD, ge=0.0, description=(
        "rule std_min: the adv set keeps mixed turns whose reward std is at least this."))
    profile_source: Annotated[Literal["sampled", "imported"], In(PIVOTS)] = Field("sampled", description=(
        "The turn profiles selection reads: sampled (turn_profiles, from the reference policy's samples) | "
        "imported (imported_profiles: the pass rates NeMo-Gym pivot rows arrive with, e.g. NVIDIA's released pivot "
        "sets; no sampling, no policy loaded). A turn can have both."))
    max_per_trajectory: Annotated[int | None, In(PIVOTS)] = Field(None, ge=1, description=(
        "At most this many pivots per trajectory; null: no cap."))
    cand_size: Annotated[int | None, In(PIVOTS)] = Field(None, ge=0, description=(
        "Size of the random candidate set D_cand (the no-filter ablation); null: the size of the adv set."))
    seed: Annotated[int, In(PIVOTS)] = Field(0, description="Seed of the random candidate draw (D_cand).")
    min_k: Annotated[int | None, In(PIVOTS)] = Field(None, ge=1, description=(
        "Candidates need k >= min_k samples, unless adaptive profiling stopped them early as settled; null: any K."))
    domain_quotas: Annotated[dict[str, Annotated[int, Field(ge=0)]] | None, In(PIVOTS)] = Field(None, description=(
        "Most pivots per domain: domain name -> count; null: no quotas."))
    action_kinds: Annotated[list[Literal["tool_call", "message", "tool_call_batch"]] | None, In(PIVOTS)] = Field(
        None, description=(
            "Only turns whose expert action is of these kinds become candidates (e.g. [tool_call, "
            "tool_call_batch] keeps replies out of the pivot sets when no judge can check them); null: every "
            "kind."))

    @field_validator("band")
    @classmethod
    def _band_is_an_interval(cls, band: list[float]) -> list[float]:
        if band[0] >= band[1]:
            raise ValueError(f"{band}: the low end must be below the high end ([low, high] within [0, 1])")
        return band

    def idle_rule_fields(self) -> set[str]:
        """The rule fields that do not decide the sets under the rule in force: the other rules' parameters, and
        `rule` itself under the default, and `profile_source` under the default (core/identity.pivots_version leaves
        them out, so the pivot sets selected before there was a choice of rule or source keep their code version)."""
        own = SELECTION_RULES[self.rule]
        idle = {field for field in SELECTION_RULES.values() if field not in (own, "lambda_diff")}
        return idle | ({"rule"} if self.rule == DEFAULT_RULE else set()) | (
            {"profile_source"} if self.profile_source == "sampled" else set())


class TrainingSection(_Strict):
    """GRPO on a pivot set (TRL), and the held-out split (eval_fraction, seed) evaluation reads."""

    set: Annotated[Literal["adv", "mixed", "cand"], In(TRAINING)] = Field("adv", description=(
        "The pivot set GRPO trains on."))
    init: Annotated[Literal["sft", "reference"], In(TRAINING)] = Field("sft", description=(
        "The policy GRPO starts from: the SFT warm-up's model, or the reference policy itself."))
    steps: Annotated[int, In(TRAINING)] = Field(50, ge=1, description="GRPO optimizer steps.")
    num_generations: Annotated[int, In(TRAINING)] = Field(8, ge=2, description="Completions per prompt (GRPO's group).")
    learning_rate: Annotated[float, In(TRAINING)] = Field(1.0e-6, gt=0, description="GRPO learning rate.")
    max_completion_length: Annotated[int, In(TRAINING, EVALUATION)] = Field(256, ge=1, description=(
        "Tokens per completion at most, in training and evaluation."))
    eval_fraction: Annotated[float, In(TRAINING, EVALUATION)] = Field(0.1, ge=0.0, lt=1.0, description=(
        "Fraction of conversations held out for evaluation (core/split.py)."))
    warmup_fraction: Annotated[float, In(TRAINING)] = Field(0.0, ge=0.0, lt=1.0, description=(
        "Conversations only the SFT warm-up trains on; profiling skips them, so the reference never profiles "
        "what it was trained on (the three-way split, core/split.py). 0: warm-up / pool are one side (the "
        "two-way split)."))
    seed: Annotated[int, In(TRAINING, EVALUATION)] = Field(0, description="Seed of GRPO training and of the held-out split.")
    dtype: Annotated[Dtype, In(TRAINING)] = Field("auto", description=(
        "GRPO training precision; auto: bf16 autocast only where native."))
    grpo: Annotated[dict[str, Any], In(TRAINING)] = Field(default_factory=dict, description=(
        "Extra trl.GRPOConfig arguments (e.g. beta, loss_type)."))
    reward_verifier: Annotated[VerifierSection | None, In(TRAINING)] = Field(None, description=(
        "GRPO's reward verifier (the shape of the top-level `verifier:` section); null: the profiling verifier."))
    share_prompt: bool = Field(True, description=(
        "Score each GRPO group's completions with its prompt run forward once, not once per completion (the same "
        "log-probabilities and gradients: training/shared_prompt.py); false: TRL's own computation. Needs "
        "grpo.gradient_checkpointing false (TRL's default is true), else TRL's path runs."))
    rollout_engine: Literal["auto", "transformers", "vllm"] = Field("auto", description=(
        "Where GRPO's completions are sampled: transformers (the trainer's own generate), vllm (the project's vLLM "
        "engine through TRL's rollout_func, the trainer's weights loaded into it after every optimizer step: "
        "training/vllm_rollout.py), or auto: the policy's engine when it can (policy.backend vllm), else "
        "transformers. A vLLM rollout is part of the models' keys."))
    launcher: Literal["inprocess", "accelerate"] = Field("inprocess", description=(
        "Where grpo_run and sft_policy train: in the Dagster step's process, or as `accelerate launch` with "
        "num_processes workers (DDP; DeepSpeed or FSDP from accelerate_config), its logs and progress reaching the "
        "run through Dagster Pipes (training/launcher.py). The world size is part of the models' keys."))
    num_processes: int = Field(2, ge=1, description=(
        "Training processes `accelerate launch` starts (launcher: accelerate): one per GPU, or CPU processes "
        "(DDP over gloo) where there is none."))
    accelerate_config: str | None = Field(None, description=(
        "An accelerate config file (configs/accelerate/*.yaml: ZeRO-3, FSDP), relative to the config's dir; "
        "null: plain DDP."))
    save_steps: int = Field(50, ge=1, description=(
        "grpo_run writes a checkpoint every this many steps; a rerun of the same run resumes from the last one."))
    @model_validator(mode="before")
    @classmethod
    def _moved_to_evaluation(cls, data):
        moved = sorted(set(data) & set(MOVED_TO_EVALUATION)) if isinstance(data, dict) else []
        if moved:
            raise ValueError("; ".join(f"{k} moved to evaluation.{MOVED_TO_EVALUATION[k]}" for k in moved)
                             + " (the `evaluation:` section)")
        return data

    @model_validator(mode="after")
    def _split_leaves_a_pool(self):
        if self.eval_fraction + self.warmup_fraction >= 1.0:
            raise ValueError(f"warmup_fraction {self.warmup_fraction} + eval_fraction {self.eval_fraction} leave no "
                             "training pool (their sum must be below 1)")
        return self


class EvaluationSection(_Strict):
    """pivot_eval and the ablation's measurements (evaluation/): how held-out turns are sampled and scored, and the
    OOD probe. Never retrains a model (EVALUATION, not TRAINING: core/identity.py). The held-out split itself
    (training.eval_fraction, training.seed) and the completion length are shared with training."""

    k: Annotated[int, In(EVALUATION)] = Field(4, ge=1, description="Samples per held-out turn.")
    seed: Annotated[int, In(EVALUATION)] = Field(0, description=(
        "Evaluation draws are seeded per turn by seeded_int(\"pivot-eval\", seed) (evaluation/heldout.eval_seed), a "
        "stream apart from profiling's policy.seed, and the same for every policy evaluated."))
    max_turns: Annotated[int | None, In(EVALUATION)] = Field(None, ge=1, description=(
        "Cap on held-out profiled turns evaluated (seeded hash order); null: all."))
    bootstrap: Annotated[int, In(EVALUATION)] = Field(1000, ge=100, description=(
        "Bootstrap resamples (over turns / probe items) for the 95% intervals."))
    ood_probe: Annotated[str | None, In(EVALUATION)] = Field(None, description=(
        "JSONL file or HF dataset dir of {prompt, answer, kind}; null: the built-in probe."))
    ood_max_items: Annotated[int | None, In(EVALUATION)] = Field(None, ge=1, description=(
        "Evaluate the first N probe items (seeded order); null: all."))


ARMS = ("grpo_adv", "grpo_cand", "grpo_mixed", "grpo_adv_exact", "sft_same_data")


EVAL_SET_NAMES = Literal["profiled", "mixed", "adv"]


class AblationSection(_Strict):
    """The paper's ablation (evaluation/ablation.py): every arm from one init, each making `epochs` passes over its
    own training pool, once per seed; the headline is the `primary` evaluation set, named before the run."""

    arms: list[Literal["grpo_adv", "grpo_cand", "grpo_mixed", "grpo_adv_exact", "sft_same_data"]] = Field(
        default_factory=lambda: list(ARMS), description="The arms trained and evaluated.")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description=(
        "Each arm is trained once per seed; a seed redraws D_cand, the trainer's sampling and the evaluation "
        "draws."))
    epochs: float = Field(1.0, ge=1.0, description=(
        "Passes over an arm's pool (its pivot set in the training pool): steps = ceil(epochs x steps per pass)."))
    primary: EVAL_SET_NAMES = Field("profiled", description="The evaluation set the headline (ablation_table) reads.")
    exact_verifier: VerifierSection = Field(default_factory=lambda: VerifierSection(default={"name": "exact"}),
                                            description="The grpo_adv_exact arm's reward verifier.")
    sft_learning_rate: float | None = Field(None, gt=0, description=(
        "The same-data SFT arm's learning rate; null: sft.learning_rate."))

    @model_validator(mode="before")
    @classmethod
    def _no_fixed_budget(cls, data):
        if isinstance(data, dict) and "steps" in data:
            raise ValueError("ablation.steps is gone: every arm makes `epochs` passes over its own pool "
                             "(steps from the pool size); set ablation.epochs")
        return data

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v):
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v


class SFTSection(_Strict):
    """The SFT warm-up on the expert trajectories (the policy GRPO starts from with training.init: sft)."""

    model: Annotated[str, In(SFT)] = Field("embedded", description=(
        "With `policy.model: sft` (the warm-up is the reference): the pretrained model the warm-up starts from and "
        "the base policy of every comparison: a local dir, a Hub id `org/name[@revision]` or `embedded`, as for "
        "policy.model. Otherwise the warm-up starts from policy.model."))
    steps: Annotated[int, In(SFT)] = Field(12, ge=1, description="SFT optimizer steps.")
    learning_rate: Annotated[float, In(SFT)] = Field(1.0e-4, gt=0, description="SFT learning rate.")
    batch_size: Annotated[int, In(SFT)] = Field(2, ge=1, description="Examples per SFT step.")
    max_length: Annotated[int, In(SFT)] = Field(1024, ge=16, description="Tokens per example at most.")
    dtype: Annotated[Dtype, In(SFT)] = Field("auto", description=(
        "SFT precision; auto: bf16 autocast only where native (core/hardware.py)."))
    seed: Annotated[int, In(SFT)] = Field(0, description="Seed of the example order.")
    examples: Annotated[Literal["auto", "trajectory", "turn"], In(SFT)] = Field("auto", description=(
        "What one example is: `trajectory` (the whole conversation, its start kept), `turn` (one turn's state, "
        "cut from the left to fit, + its expert action), or `auto` (the whole trajectory when it fits in "
        "max_length, else one example per turn)."))
    lr_scheduler: Annotated[str, In(SFT)] = Field("constant", description=(
        "The learning-rate schedule (a transformers SchedulerType: constant, linear, cosine, ...); constant: "
        "the same rate at every step."))
    warmup_ratio: Annotated[float, In(SFT)] = Field(0.0, ge=0.0, lt=1.0, description=(
        "Share of the steps the learning rate warms up over, linearly from 0."))
    gradient_accumulation_steps: Annotated[int, In(SFT)] = Field(1, ge=1, description=(
        "Micro-batches of batch_size per optimizer step (the loss is averaged over all their assistant tokens)."))
    gradient_checkpointing: bool = Field(True, description=(
        "Recompute activations in the backward pass instead of keeping them: less memory, same gradients "
        "(bench/RESULTS_sft_memory.md). Not in the identity."))
    padding_free: Annotated[bool, In(SFT)] = Field(False, description=(
        "Concatenate a batch's examples into one row without padding (TRL padding_free); needs an attention "
        "kernel that keeps the examples apart (flash attention), so off by default."))
    save_steps: int = Field(50, ge=1, description=(
        "Write a checkpoint every this many steps; a rerun of the same run after a kill resumes from the last "
        "complete one. Not in the identity."))
    trl: Annotated[dict[str, Any], In(SFT)] = Field(default_factory=dict, description=(
        "Further trl.SFTConfig options passed as is (an unknown key is an error; a key this section already "
        "sets, e.g. learning_rate, is set with the section's own field, not here)."))


class RefreshSection(_Strict):
    """Refresh rounds (refresh/rounds.py): round 0 is the pipeline's own chain (the reference profiles, the pivot
    sets, grpo_run); round r profiles the pool again with round r-1's GRPO checkpoint, reselects and trains on."""

    rounds: int = Field(0, ge=0, le=20, description=(
        "Rounds in all, round 0 included: 0 turns refresh off (no refresh assets), 1 records round 0 only, "
        "2 adds round 1 (profiled with grpo_run's checkpoint), and so on. Not in any identity: round r is the "
        "same whatever the number after it."))
    steps_per_round: Annotated[int, In(REFRESH)] = Field(4, ge=1, description=(
        "GRPO steps each round r >= 1 trains from round r-1's checkpoint (round 0 trains training.steps)."))
    skip_settled_prob: Annotated[float, In(REFRESH)] = Field(0.0, ge=0.0, le=1.0, description=(
        "Probability that a turn with zero reward variance in the last round is not profiled again (its last "
        "profile is carried forward, marked skipped); drawn per turn and round from refresh.seed. 0: every turn "
        "is profiled every round."))
    replay_fraction: Annotated[float, In(REFRESH)] = Field(0.0, ge=0.0, le=1.0, description=(
        "Fraction of the turns mastered in the last round (every sample passed) that rejoin the round's training "
        "set, a seeded draw per round (recorded as replayed)."))
    seed: Annotated[int, In(REFRESH)] = Field(0, description="Seed of the skip and replay draws.")


class RuntimeSection(_Strict):
    """How processes run torch: intra-op threads, and how many independent model jobs (ablation arms, policies
    to evaluate) run at once in worker processes (core/parallel.py)."""

    threads: int | Literal["auto"] = Field("auto", description=(
        "torch intra-op threads per process; auto: half the usable cores (bench/RESULTS_threads.md)."))
    workers: int | Literal["auto"] = Field("auto", description=(
        "Independent model jobs run at once; auto: usable cores // threads, fewer when memory is short."))

    @field_validator("threads", "workers")
    @classmethod
    def _positive(cls, v):
        if v != "auto" and v < 1:
            raise ValueError("must be >= 1 or auto")
        return v


class ScaleSection(_Strict):
    """Past one machine (docs/scale.md): profiling tables partitioned by shard = hash(trajectory_id) mod shards.

    shards: 1 and engine: local keep the single-process pipeline. Keep shards below 100: Dagster stops tracking
    data-version dependencies across 100 or more upstream partitions.
    """

    shards: int = Field(1, ge=1, le=99, description="Partitions of the profiling tables (1: unpartitioned).")
    engine: Literal["local", "ray"] = Field("local", description=(
        "local: shards run in this machine's processes; ray: each shard is a Ray job."))
    ray_address: str | None = Field(None, description=(
        "The Ray job server (the head's dashboard), e.g. http://head:8265; null: $RAY_ADDRESS (which Ray's job "
        "client also lets override this key)."))
    ray_runtime_env: dict[str, Any] | None = Field(None, description=(
        "The shard job's runtime_env (pip / py_modules / env_vars)."))
    ray_actors: int = Field(1, ge=1, description="Generation actors (one model each) per shard job.")
    ray_actor_cpus: float = Field(1.0, gt=0, description="CPUs per generation actor.")
    ray_actor_gpus: float = Field(0.0, ge=0, description="GPUs per generation actor (1 on a GPU fleet: vLLM / "
                                                         "transformers on cuda).")
    ray_batch_rows: int = Field(64, ge=1, description="(turn, sample) rows per Ray Data batch = per written part.")
    max_shard_runs: int = Field(4, ge=1, description=(
        "Shard runs `pivot run` keeps in flight at once with engine ray (engine local runs them one by one)."))


class SampleSection(_Strict):
    """The embedded synthetic sample used when `inputs` is omitted."""

    n_trajectories: int = Field(60, ge=1, description="Synthetic trajectories generated.")
    seed: int = Field(0, description="Seed of the synthetic sample.")


class PivotConfig(_Strict):
    """pivot.yaml: where the warehouse is, what to ingest, and every stage's settings."""

    warehouse: str = Field("./warehouse", description=(
        "The warehouse: a local dir, or s3://bucket/prefix on any S3-compatible store (endpoint and credentials "
        "from the env)."))
    inputs: list[InputSpec] | None = Field(None, description=(
        "The SFT trajectories to ingest; null: the embedded synthetic sample (`sample:`)."))
    sample: SampleSection = Field(default_factory=SampleSection, description="The synthetic sample (no `inputs`).")
    policy: PolicySection = Field(default_factory=PolicySection, description="The reference policy that profiles.")
    verifier: VerifierSection = Field(default_factory=VerifierSection, description=(
        "The verifier that scores each profiled sample against the expert action."))
    pivots: PivotsSection = Field(default_factory=PivotsSection, description="Pivot selection.")
    training: TrainingSection = Field(default_factory=TrainingSection, description=(
        "GRPO training, and the held-out split it shares with evaluation."))
    evaluation: EvaluationSection = Field(default_factory=EvaluationSection, description=(
        "Evaluation of the trained policies: held-out local accuracy and the OOD probe."))
    sft: SFTSection = Field(default_factory=SFTSection, description="The SFT warm-up.")
    runtime: RuntimeSection = Field(default_factory=RuntimeSection, description="torch threads and worker processes.")
    scale: ScaleSection = Field(default_factory=ScaleSection, description="Sharding and Ray.")
    profiling: ProfilingSection = Field(default_factory=ProfilingSection, description="Sampling seeds and adaptive "
                                                                                      "profiling.")
    refresh: RefreshSection = Field(default_factory=RefreshSection, description="Refresh rounds (off by default).")
    ablation: AblationSection | None = Field(None, description=(
        "The paper's ablation; present: the ablation_results asset and `ablation_job` run it."))
    # Not a pivot.yaml key (load_config rejects it), so not in the schema editors complete from
    base_dir: Annotated[str, SkipJsonSchema()] = Field(".", description=(
        "Directory the relative paths are resolved against (the config file's folder; set by the loader, not "
        "in pivot.yaml)."))
    _source: str = PrivateAttr("built-in defaults")  # what config errors found after loading name (load_config sets it)

    @property
    def source(self) -> str:
        """The config file this was loaded from (or "built-in defaults"): the start of a config error's line."""
        return self._source

    @model_validator(mode="after")
    def _sft_model_with_sft_policy(self):
        if self.sft.model != "embedded" and self.policy.model != "sft":
            raise ValueError(f"sft.model applies with policy.model: sft; the warm-up of policy.model "
                             f"{self.policy.model!r} starts from that model (drop sft.model)")
        return self

    @model_validator(mode="after")
    def _stream_needs_a_streaming_engine(self):
        adaptive = self.profiling.adaptive
        if not adaptive.enabled or adaptive.scheduler != "stream":
            return self
        if not capabilities(self.policy.backend).streams_requests:
            raise ValueError(f"profiling.adaptive.scheduler stream: policy.backend {self.policy.backend} cannot add "
                             "and cancel single requests (vllm can); use scheduler: waves")
        if self.scale.engine == "ray":
            raise ValueError("profiling.adaptive.scheduler stream drives the engine in the calling process; "
                             "with scale.engine ray use scheduler: waves")
        return self

    @model_validator(mode="after")
    def _adaptive_settles_per_turn_rules_only(self):
        # variance_top_p ranks every turn against the others: no turn's membership is settled by its own samples
        if not self.profiling.adaptive.enabled or self.pivots.rule != "variance_top_p":
            return self
        raise ValueError("pivots.rule variance_top_p with profiling.adaptive.enabled: its membership depends on every "
                         "turn's variance, so it cannot be settled turn by turn; use rule pivotrl, band or std_min, "
                         "or turn adaptive profiling off")

    @model_validator(mode="after")
    def _ray_seeds_per_sample(self):
        if self.scale.engine == "ray" and self.profiling.seeding != "per_sample":
            raise ValueError("scale.engine ray samples each (turn, sample_index) row with its own seed: "
                             "profiling.seeding must be per_sample")
        return self

    @field_validator("warehouse")
    @classmethod
    def _warehouse_location(cls, v: str) -> str:
        """A local dir, or s3://bucket/prefix on any S3-compatible store (endpoint and credentials from the env)."""
        if "://" in v:
            from pivot_assets.core.warehouse import parse_s3_uri

            if not v.startswith("s3://"):
                raise ValueError(f"{v!r}: a warehouse is a local dir or s3://bucket/prefix")
            parse_s3_uri(v)
            return v.rstrip("/")
        return v

    # -- resolved paths -------------------------------------------------------------------
    def resolve(self, p: str) -> Path:
        path = Path(os.path.expanduser(p))
        return path if path.is_absolute() else (Path(self.base_dir) / path).resolve()

    @property
    def warehouse_dir(self) -> Path:
        """The warehouse's local dir: the tables and pivot.duckdb, or for an s3:// warehouse the local state
        (pivot.duckdb with views over the objects, models, plots, exports, caches) under
        <config dir>/.warehouse-state/<bucket>/<prefix>, which records the URI (core/warehouse.py)."""
        if not self.warehouse.startswith("s3://"):
            return self.resolve(self.warehouse)
        from pivot_assets.core.warehouse import bind_state_dir, parse_s3_uri

        bucket, prefix = parse_s3_uri(self.warehouse)
        return bind_state_dir(self.resolve(STATE_DIR) / bucket / prefix, self.warehouse)

    def section(self, name: str) -> dict:
        """A section as a plain dict (what the Dagster-free libraries take)."""
        value = getattr(self, name)
        return value.model_dump() if isinstance(value, BaseModel) else dict(value)


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key '{loc}'"
    return f"{source}: {loc}: {first['msg'].removeprefix('Value error, ')}"


def _check_inputs(cfg: PivotConfig, source: str) -> None:
    for i, spec in enumerate(cfg.inputs or []):
        path = cfg.resolve(spec.path)
        if not (path.exists() or glob.glob(str(path), recursive=True)):
            raise ConfigError(f"{source}: inputs.{i}.path: no such file, directory or glob match: {path}")
        if spec.answers is not None and not cfg.resolve(spec.answers).exists():
            raise ConfigError(f"{source}: inputs.{i}.answers: no such file or directory: {cfg.resolve(spec.answers)}")


def resolve_config_path(path: str | os.PathLike | None = None) -> Path | None:
    """The config file in force: explicit path, else $PIVOT_CONFIG, else ./pivot.yaml, else None."""
    if path is None:
        path = os.environ.get("PIVOT_CONFIG") or ("pivot.yaml" if Path("pivot.yaml").exists() else None)
    return Path(path).resolve() if path else None


def load_config(path: str | os.PathLike | None = None, *, overrides: dict | None = None) -> PivotConfig:
    """Load and validate pivot.yaml (see module docstring for the resolution order)."""
    path = resolve_config_path(path)
    raw: dict = {}
    source = "built-in defaults"
    base_dir = Path.cwd()
    if path is not None:
        p = Path(path)
        source = str(p)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"{source}:{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: the top level must be a mapping of keys")
        base_dir = p.resolve().parent
    raw = {**raw, **(overrides or {})}
    if "base_dir" in raw and path is not None:
        raise ConfigError(f"{source}: unknown key 'base_dir'")
    raw.setdefault("base_dir", str(base_dir))
    try:
        cfg = PivotConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source)) from None
    _check_inputs(cfg, source)
    cfg._source = source
    return cfg
