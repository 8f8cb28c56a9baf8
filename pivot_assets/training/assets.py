"""Stage 5 in Dagster (group `training`): same-data SFT (`sft_policy`: the warm-up reference policy and the
paper's baseline) and local GRPO on the pivot set (`grpo_run`). Each body is one call into this package's library;
the libraries write completion markers keyed by everything a model depends on, so a rerun with the same inputs
trains nothing."""

from pathlib import Path
from typing import Callable

import dagster as dg

from pivot_assets.core.config import PivotConfig
from pivot_assets.core.identity import fingerprint
from pivot_assets.core.plots import lines_png, markdown_image, save_png
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.materialization import publish
from pivot_assets.verifiers import DomainVerifiers, VerifierSets

from .grpo import grpo_run_status, run_local_grpo
from .runs import grpo_run_identity, sft_run_identity
from .sft import sft_run_status, train_sft_policy

GROUP = __package__.rsplit(".", 1)[-1]
HF_EXPORT = "pivot_dataset"  # the curation stage's export asset (an asset key: no import across assets.py files)


def steps_plot(wh: Warehouse, name: str, rows: list[dict], series: list[str]) -> str:
    png = lines_png({s: [(r["step"], r.get(s)) for r in rows] for s in series}, title=name)
    save_png(png, wh.root / "plots" / f"{name}.png")
    return markdown_image(png, name)


def run_metadata(result: dict) -> dict:
    meta = {"skipped": result["skipped"], "model_dir": dg.MetadataValue.path(result["model_dir"]),
            "key": result["key"], **result["precision"].as_metadata()}
    if "train_s" in result:
        meta["train_s"] = round(result["train_s"], 1)
    return meta


def train_stage(context: dg.AssetExecutionContext, cfg: PivotConfig, stage: str, status: Callable[[], dict],
                inprocess: Callable[[], dict]) -> dict:
    """The stage's result: trained in this process, or (training.launcher: accelerate, and `status` says not up to
    date: asked only then, since the in-process stage checks it itself) by launched ranks reporting through Pipes."""
    if cfg.training.launcher == "inprocess" or status()["skipped"]:
        return inprocess()
    return launched_result(context, cfg, stage)


def launched_result(context: dg.AssetExecutionContext, cfg: PivotConfig, stage: str) -> dict:
    """Runs the stage as `accelerate launch` (training/launcher.py) through Dagster Pipes: the main rank's log lines
    and progress reach this run, its result is its last custom message."""
    import shlex
    import tempfile

    from pivot_assets.core.hardware import Precision

    from .launcher import launch_command, launch_env
    from pivot_assets.core import hardware

    on_gpu = hardware.has_cuda() if stage == "grpo" else cfg.policy.device != "cpu"
    with tempfile.TemporaryDirectory(prefix="pivot-launch-") as tmp:
        config_json = Path(tmp) / "config.json"  # every rank reads the run's config from here
        config_json.write_text(cfg.model_dump_json())
        command = launch_command(cfg.training, Path(cfg.base_dir), stage, config_json, on_gpu)
        context.log.info(f"{stage}: {cfg.training.num_processes} processes: {shlex.join(command)}")
        try:
            invocation = dg.PipesSubprocessClient().run(context=context, command=command, env=launch_env())
        except Exception:  # Pipes says "failed with code 1": say what the ranks raised, where they wrote it
            errors = sorted(Path(tmp).glob("error-rank*.txt"))
            if not errors:
                raise
            raise RuntimeError(f"{stage} (launched): " + "; ".join(
                f"{p.stem.removeprefix('error-')}: {p.read_text()}" for p in errors)) from None
    messages = invocation.get_custom_messages()
    if not messages:
        raise RuntimeError(f"{stage}: the launched run exited without reporting a result (see its log above)")
    return {**messages[-1], "precision": Precision(**messages[-1]["precision"])}


def build_sft_asset(cfg: PivotConfig, wh: Warehouse):
    @dg.asset(deps=["trajectories"], group_name=GROUP, kinds={"pytorch"},
              code_version=fingerprint(sft_run_identity(cfg)))
    def sft_policy(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """SmolLM2 fine-tuned on the expert turns (assistant tokens only), held-out trajectories excluded:
        the warm-up reference policy and the same-data SFT baseline."""
        result = train_stage(context, cfg, "sft", lambda: sft_run_status(wh, cfg),
                             lambda: train_sft_policy(wh, cfg, context.log.info))
        extra = {k: result[k] for k in ("n_examples", "n_held_out", "n_warmup_trajectories", "not_trained_on")
                 if k in result}
        rows = wh.read("sft_steps").to_dicts()
        return publish(wh, "sft_steps", {
            **run_metadata(result), **extra, "final_loss": rows[-1]["loss"],
            "loss": dg.MetadataValue.md(steps_plot(wh, "sft_loss", rows, ["loss"])),
        }, preview=False, asset="sft_policy", data_version=result["key"])

    return sft_policy


def build_grpo_asset(cfg: PivotConfig, wh: Warehouse, reward: DomainVerifiers):
    init_deps = ["sft_policy"] if cfg.training.init == "sft" else []

    @dg.asset(deps=[HF_EXPORT, *init_deps], group_name=GROUP, kinds={"pytorch"},
              code_version=fingerprint(grpo_run_identity(cfg)))
    def grpo_run(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """TRL GRPOTrainer on the pivot set, one short turn per sample, rewarded by the local verifier."""
        result = train_stage(context, cfg, "grpo", lambda: grpo_run_status(wh, cfg, reward),
                             lambda: run_local_grpo(wh, cfg, reward, context.log.info))
        meta = run_metadata(result)
        if not result["skipped"]:
            meta.update({"train_prompts": result["train_prompts"],
                         "verifier_fingerprints": dg.MetadataValue.json(result["verifier_fingerprints"]),
                         "grpo_config": dg.MetadataValue.json({k: _json_value(v) for k, v in result["grpo_config"].items()}),
                         "rollout": dg.MetadataValue.json(result["rollout"]),
                         "shared_prompt": dg.MetadataValue.json(result["shared_prompt"])})
        rows = wh.read("grpo_steps").to_dicts()
        plot = steps_plot(wh, "grpo_steps", rows, ["reward_mean", "reward_std", "frac_reward_zero_std", "loss"])
        return publish(wh, "grpo_steps", {
            **meta, "steps": len(rows), "final_reward_mean": rows[-1].get("reward_mean") if rows else None,
            "metrics": dg.MetadataValue.md(plot),
        }, preview=False, asset="grpo_run", data_version=result["key"])

    return grpo_run


def _json_value(value):
    """A GRPOConfig value as metadata: numbers, bools and strings keep their type; anything else as text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def build_assets(cfg: PivotConfig, wh: Warehouse, verifiers: VerifierSets) -> list:
    """GRPO is rewarded by the reward set (evaluation scores with the profiling set: evaluation/assets.py)."""
    return [build_sft_asset(cfg, wh), build_grpo_asset(cfg, wh, verifiers.reward)]
