"""What `pivot run` checks before it materializes anything (cli.cmd_run): that what the config names is here.

One function per kind of name; each raises PreflightError, a ConfigError whose one line names the key, what is
wrong and the fix: the input files, the verifiers (built through the registry as the run builds them), the engine
(installed here), the models (`embedded` installed, a local dir with config.json, a Hub id in the cache or
downloadable). Without it such a run starts, materializes what comes before the step that needs the name, and
fails there with a Dagster stack trace. Dagster-free: the CLI passes the asset groups the selection runs.
"""

from __future__ import annotations

from pivot_assets.core.config import ConfigError, PivotConfig
from pivot_assets.core.engines import capabilities, missing

# the asset groups that load the reference policy's model (or its engine): profiling samples it, training warms it
# up and trains from it, evaluation samples it, refresh rounds profile with its engine; ingest and curation never do
MODEL_GROUPS = frozenset({"profiling", "training", "evaluation", "refresh"})
SFT_POLICY = "sft"  # `policy.model: sft`: the warm-up is the reference; it starts from `sft.model`


class PreflightError(ConfigError):
    """A name in the config that does not resolve here, as one line with the fix."""


def check_run(cfg: PivotConfig, groups: set[str]) -> list[str]:
    """Every check the run of assets in `groups` needs; returns the Hub ids it downloaded (none when cached)."""
    check_inputs(cfg)
    check_verifiers(cfg)
    if not groups & MODEL_GROUPS:  # ingest or curation only: no model or engine is loaded
        return []
    check_engine(cfg)
    return [model for key, model in models_loaded(cfg, groups) if check_model(cfg, key, model)]


def check_inputs(cfg: PivotConfig) -> None:
    """Every input's files: its path and answers (load_config checked them), and its `tools:` file, which
    ingestion would read only in its step."""
    if not cfg.inputs:
        return
    from pivot_assets.ingest.inputs import resolved_inputs

    try:
        resolved_inputs(cfg)
    except ConfigError as e:
        raise PreflightError(f"{cfg.source}: {e}: fix the path (relative to the config file)") from None


def check_verifiers(cfg: PivotConfig) -> None:
    """The verifier sets (`verifier:`, training.reward_verifier, ablation.exact_verifier) build from the registry:
    every name is registered, every parameter accepted (verifiers/sets.py phrases the error)."""
    from pivot_assets.verifiers import VerifierSets

    try:
        VerifierSets.from_config(cfg)
    except ConfigError as e:
        raise PreflightError(str(e)) from None


def check_engine(cfg: PivotConfig) -> None:
    """The engines policy.backend and training.rollout_engine name are installed here (core/engines.missing says
    how to install them)."""
    why = missing(cfg.policy.backend)
    if why:
        raise PreflightError(f"{cfg.source}: policy.backend {cfg.policy.backend}: {why} (or pick another backend)")
    rollout = cfg.training.rollout_engine
    why = missing(rollout) if rollout not in ("auto", "transformers") else None
    if why:
        raise PreflightError(f"{cfg.source}: training.rollout_engine {rollout}: {why} (or set it to auto)")
    from pivot_assets.training.vllm_rollout import resolve_rollout_engine

    launched = cfg.training.launcher != "inprocess" and cfg.training.num_processes > 1
    if launched and resolve_rollout_engine(cfg).name != "transformers":
        raise PreflightError(f"{cfg.source}: training.rollout_engine samples beside one training process, not "
                             f"{cfg.training.num_processes} launched ones: set training.rollout_engine: transformers "
                             "(on GPUs, TRL's own vLLM modes: training.grpo.use_vllm)")


def models_loaded(cfg: PivotConfig, groups: set[str]) -> list[tuple[str, str]]:
    """(config key, model) of the model the groups load here: policy.model, or sft.model when the warm-up is the
    reference. A served model (backend openai) is loaded here only to train and evaluate from it."""
    key = "sft.model" if cfg.policy.model == SFT_POLICY else "policy.model"
    model = cfg.sft.model if key == "sft.model" else cfg.policy.model
    if not capabilities(cfg.policy.backend).local_model and not groups & {"training", "evaluation", "refresh"}:
        return []
    return [(key, model)]


def check_model(cfg: PivotConfig, key: str, model: str) -> bool:
    """`embedded` installed, a local dir with config.json, or a Hub id resolved (policies/hub.py); True when a Hub
    id was downloaded now. The embedded model is only located: its conversion (30 s) is the first step's."""
    from pivot_assets.policies.hub import pinned_id
    from pivot_assets.policies.models import (
        EMBEDDED,
        embedded_gguf_path,
        resolve_model_dir,
    )

    pinned = pinned_id(model)
    try:
        if model == EMBEDDED:
            embedded_gguf_path()
        else:
            resolve_model_dir(model)
    except (ValueError, RuntimeError) as e:
        raise PreflightError(f"{cfg.source}: {key}: {str(e).strip().splitlines()[0]}") from None
    return pinned_id(model) != pinned
