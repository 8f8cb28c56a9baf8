"""Stage 5 in Dagster (group `training`): same-data SFT (`sft_policy`: the warm-up reference policy and the
paper's baseline), local GRPO on the pivot set (`grpo_run`), and local accuracy plus an OOD probe for every
policy (`pivot_eval`). Each body is one call into this package's library; the libraries write completion
markers keyed by everything a model depends on, so a rerun with the same inputs trains nothing."""

from pathlib import Path
from typing import Callable

import dagster as dg
import pyarrow as pa

from pivot_assets.core.catalog import SET_TABLES
from pivot_assets.core.config import PivotConfig
from pivot_assets.core.identity import eval_identity, fingerprint
from pivot_assets.core.plots import lines_png, markdown_image, save_png
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.materialization import publish
from pivot_assets.verifiers import DomainVerifiers, VerifierSets

from .evaluation import eval_table, evaluate_policies
from .grpo import grpo_run_status, run_local_grpo
from .runs import grpo_run_identity, sft_identity, sft_run_identity, training_identity
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


def eval_deps(cfg: PivotConfig) -> list[str]:
    """What evaluation reads: the fixed evaluation sets (profiles, D_mixed, D_adv) and the reference model."""
    models = ["sft_policy"] if "sft" in (cfg.training.init, cfg.policy.model) else []
    return ["turns", "turn_profiles", "pivots_mixed", "pivots_adv", *models]


def comparison_markdown(rows: list[dict]) -> str:
    from .evaluation import fmt_interval

    head = "| policy | set | n | accuracy [95% CI] | Δ vs reference [95% CI] |\n|---|---|---|---|---|"
    return "\n".join([head] + [f"| {r['policy']} | {r['eval_set']} | {r['n']} | {fmt_interval(r)} | "
                               f"{fmt_interval(r, 'delta')} |" for r in rows])


def build_eval_asset(cfg: PivotConfig, wh: Warehouse, verifiers: DomainVerifiers):
    @dg.asset(deps=["grpo_run", *eval_deps(cfg)], group_name=GROUP, kinds={"duckdb"},
              code_version=fingerprint(eval_identity(cfg.training)))
    def pivot_eval(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """Local accuracy (mean verifier reward over eval_k fresh samples, evaluation seeds apart from profiling's)
        on fixed held-out sets (all profiled turns, D_mixed, D_adv) and OOD-probe accuracy, for the base model,
        the reference (the policy that profiled), the SFT warm-up and the GRPO policy: 95% bootstrap intervals
        and paired differences against the reference."""
        rows = evaluate_policies(wh, cfg, verifiers, context.log.info)
        wh.write_table("pivot_eval", eval_table(rows))
        plot = intervals_plot(wh, rows, name="pivot_eval", title="pivot_eval: accuracy with 95% bootstrap intervals")
        return publish(wh, "pivot_eval", {"comparison": dg.MetadataValue.md(comparison_markdown(rows)),
                                          "intervals": dg.MetadataValue.md(plot)}, preview=False)

    return pivot_eval


ABLATION_TAGS = {"pivot/stage": "ablation"}  # pivot_jobs selects ablation_job by this tag


def build_ablation_asset(cfg: PivotConfig, wh: Warehouse, verifiers: VerifierSets):
    from .runs import ARM_SPECS

    sets = sorted({SET_TABLES[ARM_SPECS[a][1]] for a in cfg.ablation.arms})
    init_deps = ["sft_policy"] if "sft" in (cfg.training.init, cfg.policy.model) else []
    identity = {"ablation": cfg.ablation.model_dump(), "training": training_identity(cfg), "sft": sft_identity(cfg),
                "eval": eval_identity(cfg.training)}

    @dg.asset(deps=sorted({"trajectories", *sets, *eval_deps(cfg), *init_deps}), group_name=GROUP,
              kinds={"pytorch", "duckdb"}, tags=ABLATION_TAGS, code_version=fingerprint(identity))
    def ablation_results(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """The paper's ablation: GRPO on D_adv / D_cand / D_mixed, GRPO on D_adv with the exact-match reward and
        same-data SFT, from one init with one update budget, once per ablation seed; evaluated with the base
        model and the reference on fixed held-out sets with fresh draws: 95% intervals, paired differences."""
        from .ablation import ablation_markdown, pairs_markdown, run_ablation
        from .evaluation import PAIR_SCHEMA_FIELDS

        result = run_ablation(wh, cfg, verifiers, context.log.info)
        rows, primary = result["rows"], cfg.ablation.primary
        wh.write_table("ablation_results", eval_table(rows, extra=(("train_s", "float64"), ("primary", "bool_"))))
        wh.write_table("ablation_pairs", eval_table(result["pairs"], fields=PAIR_SCHEMA_FIELDS))
        wh.write_table("ablation_runs", pa.Table.from_pylist(result["runs"]))
        if result["steps"]:
            wh.write_table("ablation_steps", pa.Table.from_pylist(result["steps"]))
        plot = intervals_plot(wh, rows, sets=(primary, *[s for s in ("adv", "mixed", "profiled") if s != primary], "ood"))
        runs = {f"{r['arm']}/s{r['seed']}": {k: r[k] for k in ("steps", "pool", "turns_trained", "tokens",
                                                                 "useful_share", "cand_overlap_adv", "train_s")}
                for r in result["runs"]}
        return publish(wh, "ablation_results", {
            "primary_set": primary,
            f"table_{primary} (primary)": dg.MetadataValue.md(ablation_markdown(rows, primary)),
            "pairs": dg.MetadataValue.md(pairs_markdown(result["pairs"], primary)),
            **{f"table_{s}": dg.MetadataValue.md(ablation_markdown(rows, s)) for s in ("adv", "profiled")
               if s != primary},
            "intervals": dg.MetadataValue.md(plot), "eval_key": result["eval_key"],
            "runs": dg.MetadataValue.json(runs), "eval_s": result["eval_s"], "wall_s": result["wall_s"],
        }, preview=False)

    return ablation_results


def intervals_plot(wh: Warehouse, rows: list[dict], name: str = "ablation_results",
                   title: str = "ablation: accuracy with 95% bootstrap intervals",
                   sets: tuple[str, ...] = ("adv", "mixed", "profiled", "ood")) -> str:
    """Accuracy with its 95% interval per policy, one panel per evaluation set (a PNG on the asset)."""
    from .ablation import intervals_png

    series = {s: [(r["policy"], r["accuracy"], r["ci_low"], r["ci_high"]) for r in rows if r["eval_set"] == s]
              for s in sets}
    png = intervals_png(series, title=title)
    save_png(png, wh.root / "plots" / f"{name}.png")
    return markdown_image(png, name)


def _json_value(value):
    """A GRPOConfig value as metadata: numbers, bools and strings keep their type; anything else as text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def build_assets(cfg: PivotConfig, wh: Warehouse, verifiers: VerifierSets) -> list:
    """GRPO is rewarded by the reward set, evaluation scores with the profiling set (the reference's measure)."""
    assets = [build_sft_asset(cfg, wh), build_grpo_asset(cfg, wh, verifiers.reward),
              build_eval_asset(cfg, wh, verifiers.profiling)]
    if cfg.ablation is not None:  # only a config with an `ablation:` section has the (long) ablation asset
        assets.append(build_ablation_asset(cfg, wh, verifiers))
    return assets
