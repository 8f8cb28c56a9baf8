"""Stage 6 in Dagster (group `evaluation`): local accuracy plus an OOD probe for every policy (`pivot_eval`), and
the paper's ablation (`ablation_results`, only in a config with an `ablation:` section). Each body is one call into
this package's library; scores are cached by model fingerprint and draw, so a rerun samples only what changed."""

import dagster as dg
import pyarrow as pa

from pivot_assets.core.catalog import SET_TABLES
from pivot_assets.core.config import PivotConfig
from pivot_assets.core.identity import eval_identity, fingerprint
from pivot_assets.core.plots import markdown_image, save_png
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.materialization import publish
from pivot_assets.training.runs import sft_identity, training_identity
from pivot_assets.verifiers import DomainVerifiers, VerifierSets

from .heldout import eval_table, evaluate_policies

GROUP = __package__.rsplit(".", 1)[-1]


def eval_deps(cfg: PivotConfig) -> list[str]:
    """What evaluation reads: the fixed evaluation sets (profiles, D_mixed, D_adv) and the reference model."""
    models = ["sft_policy"] if "sft" in (cfg.training.init, cfg.policy.model) else []
    return ["turns", "turn_profiles", "pivots_mixed", "pivots_adv", *models]


def comparison_markdown(rows: list[dict]) -> str:
    from .heldout import fmt_interval

    head = "| policy | set | n | accuracy [95% CI] | Δ vs reference [95% CI] |\n|---|---|---|---|---|"
    return "\n".join([head] + [f"| {r['policy']} | {r['eval_set']} | {r['n']} | {fmt_interval(r)} | "
                               f"{fmt_interval(r, 'delta')} |" for r in rows])


def build_eval_asset(cfg: PivotConfig, wh: Warehouse, verifiers: DomainVerifiers):
    @dg.asset(deps=["grpo_run", *eval_deps(cfg)], group_name=GROUP, kinds={"duckdb"},
              code_version=fingerprint(eval_identity(cfg.training, cfg.evaluation)))
    def pivot_eval(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """Local accuracy (mean verifier reward over evaluation.k fresh samples, evaluation seeds apart from profiling's)
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
    from pivot_assets.training.runs import ARM_SPECS

    sets = sorted({SET_TABLES[ARM_SPECS[a][1]] for a in cfg.ablation.arms})
    init_deps = ["sft_policy"] if "sft" in (cfg.training.init, cfg.policy.model) else []
    identity = {"ablation": cfg.ablation.model_dump(), "training": training_identity(cfg), "sft": sft_identity(cfg),
                "eval": eval_identity(cfg.training, cfg.evaluation)}

    @dg.asset(deps=sorted({"trajectories", *sets, *eval_deps(cfg), *init_deps}), group_name=GROUP,
              kinds={"pytorch", "duckdb"}, tags=ABLATION_TAGS, code_version=fingerprint(identity))
    def ablation_results(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """The paper's ablation: GRPO on D_adv / D_cand / D_mixed, GRPO on D_adv with the exact-match reward and
        same-data SFT, from one init with one update budget, once per ablation seed; evaluated with the base
        model and the reference on fixed held-out sets with fresh draws: 95% intervals, paired differences."""
        from .ablation import ablation_markdown, pairs_markdown, run_ablation
        from .heldout import PAIR_SCHEMA_FIELDS

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


def build_assets(cfg: PivotConfig, wh: Warehouse, verifiers: VerifierSets) -> list:
    """Evaluation scores with the profiling set (the reference's measure); the ablation's arms are rewarded by the
    reward set, its exact arm by ablation.exact_verifier."""
    assets = [build_eval_asset(cfg, wh, verifiers.profiling)]
    if cfg.ablation is not None:  # only a config with an `ablation:` section has the (long) ablation asset
        assets.append(build_ablation_asset(cfg, wh, verifiers))
    return assets
