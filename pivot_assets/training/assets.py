"""Stage 5 in Dagster (group `training`): same-data SFT (`sft_policy`: the warm-up reference policy and the
paper's baseline), local GRPO on the pivot set (`grpo_run`), and local accuracy plus an OOD probe for every
policy (`pivot_eval`). Each body is one call into this package's library; the libraries write completion
markers keyed by everything a model depends on, so a rerun with the same inputs trains nothing."""

import dagster as dg
import pyarrow as pa

from pivot_assets.core.catalog import SET_TABLES
from pivot_assets.core.config import PivotConfig
from pivot_assets.core.ids import canonical_json, short_hash
from pivot_assets.core.plots import lines_png, markdown_image, save_png
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.resources import publish
from pivot_assets.verifiers import DomainVerifiers

from .evaluation import evaluate_policies, fmt_accuracy
from .grpo import run_local_grpo
from .runs import sft_identity, training_identity
from .sft import train_sft_policy

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


def build_sft_asset(cfg: PivotConfig):
    @dg.asset(deps=["trajectories"], group_name=GROUP, kinds={"pytorch"},
              code_version=short_hash(canonical_json(sft_identity(cfg))))
    def sft_policy(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """SmolLM2 fine-tuned on the expert turns (assistant tokens only), held-out trajectories excluded:
        the warm-up reference policy and the same-data SFT baseline."""
        wh = Warehouse(cfg.warehouse_dir)
        result = train_sft_policy(wh, cfg, context.log.info)
        extra = {k: result[k] for k in ("n_examples", "n_held_out", "not_trained_on") if k in result}
        rows = wh.read("sft_steps").to_dicts()
        return publish(wh, "sft_steps", {
            **run_metadata(result), **extra, "final_loss": rows[-1]["loss"],
            "loss": dg.MetadataValue.md(steps_plot(wh, "sft_loss", rows, ["loss"])),
        }, preview=False, asset="sft_policy", data_version=result["key"])

    return sft_policy


def build_grpo_asset(cfg: PivotConfig, verifiers: DomainVerifiers):
    init_deps = ["sft_policy"] if cfg.training.init == "sft" else []

    @dg.asset(deps=[HF_EXPORT, *init_deps], group_name=GROUP, kinds={"pytorch"},
              code_version=short_hash(canonical_json(training_identity(cfg))))
    def grpo_run(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """TRL GRPOTrainer on the pivot set, one short turn per sample, rewarded by the local verifier."""
        wh = Warehouse(cfg.warehouse_dir)
        result = run_local_grpo(wh, cfg, verifiers, context.log.info)
        meta = run_metadata(result)
        if not result["skipped"]:
            meta.update({"train_prompts": result["train_prompts"],
                         "verifier_fingerprints": dg.MetadataValue.json(result["verifier_fingerprints"]),
                         "grpo_config": dg.MetadataValue.json({k: str(v) for k, v in result["grpo_config"].items()})})
        rows = wh.read("grpo_steps").to_dicts()
        plot = steps_plot(wh, "grpo_steps", rows, ["reward_mean", "reward_std", "frac_reward_zero_std", "loss"])
        return publish(wh, "grpo_steps", {
            **meta, "steps": len(rows), "final_reward_mean": rows[-1].get("reward_mean") if rows else None,
            "metrics": dg.MetadataValue.md(plot),
        }, preview=False, asset="grpo_run", data_version=result["key"])

    return grpo_run


def build_eval_asset(cfg: PivotConfig, verifiers: DomainVerifiers):
    init_deps = ["sft_policy"] if cfg.training.init == "sft" else []

    @dg.asset(deps=["grpo_run", SET_TABLES[cfg.training.set], *init_deps], group_name=GROUP, kinds={"duckdb"},
              code_version=short_hash(canonical_json([cfg.training.eval_k, cfg.training.max_completion_length])))
    def pivot_eval(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """Local accuracy (mean verifier reward over K samples) on held-out pivots and OOD-probe accuracy,
        for the reference, SFT and GRPO policies side by side."""
        wh = Warehouse(cfg.warehouse_dir)
        rows = evaluate_policies(wh, cfg, verifiers, context.log.info)
        wh.write_table("pivot_eval", pa.Table.from_pylist(rows))
        table = "\n".join(
            ["| policy | n_pivots | k | local_accuracy | ood_accuracy |", "|---|---|---|---|---|"]
            + [f"| {r['policy']} | {r['n_pivots']} | {r['k']} | {fmt_accuracy(r['local_accuracy'])} | "
               f"{fmt_accuracy(r['ood_accuracy'])} |" for r in rows]
        )
        return publish(wh, "pivot_eval", {"comparison": dg.MetadataValue.md(table)}, preview=False)

    return pivot_eval


def build_assets(cfg: PivotConfig) -> list:
    verifiers = DomainVerifiers(cfg.verifier)
    return [build_sft_asset(cfg), build_grpo_asset(cfg, verifiers), build_eval_asset(cfg, verifiers)]
