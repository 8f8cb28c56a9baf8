"""Stage 4 in Dagster: `turn_profiles` -> pivot sets (D_mixed, D_adv, D_cand), data contracts as asset checks
(blocking on the pivot sets), and the exports trainers read (group `curation`)."""

import dagster as dg

from pivot_assets.core.catalog import BLOCKING_TABLES, CONTRACT_TABLES, PIVOT_TABLES, SELECTION_LOG, SET_TABLES
from pivot_assets.core.config import PivotConfig
from pivot_assets.core.identity import pivots_version
from pivot_assets.core.plots import bars_png, markdown_image, save_png
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.materialization import number_table, publish

from .tables import check_table, contract_params, export_set, profiles_table, select_and_write

GROUP = __package__.rsplit(".", 1)[-1]
CONTRACT_CHECK = "data_contract"
HF_EXPORT = "pivot_dataset"
NEMO_EXPORT = "pivot_nemo_gym"
PIVOT_SET_DOCS = {
    "pivots_mixed": "D_mixed: turns whose reference outcomes are mixed (reward_var > 0).",
    "pivots_adv": "D_adv: the mixed turns the selection rule in force keeps (pivots.rule; pivotrl: reward_mean <= lambda_diff).",
    "pivots_cand": "D_cand: a seeded random sample of candidate turns, the size of D_adv (the no-filter ablation).",
    SELECTION_LOG: "Every (turn, set) decision with its reason (kept, zero_variance, too_easy, outside_band, over caps, ...) and the rule in force.",
}


def funnel_plot(wh: Warehouse, funnel: dict[str, int]) -> str:
    png = bars_png(list(funnel), list(funnel.values()), title="pivot funnel: turns kept at each stage",
                   ylabel="turns")
    save_png(png, wh.root / "plots" / "pivot_funnel.png")
    return markdown_image(png, "pivot funnel")


def build_pivot_sets_asset(cfg: PivotConfig, wh: Warehouse):
    """All three sets and the selection log from ONE selection over one profile generation: the sampled
    turn_profiles or the imported_profiles (pivots.profile_source)."""

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(name, deps=[profiles_table(cfg.pivots), "turns"], group_name=GROUP, description=text,
                         code_version=pivots_version(cfg.pivots), kinds={"parquet", "duckdb"})
            for name, text in PIVOT_SET_DOCS.items()
        ],
        can_subset=False,
    )
    def pivot_sets(context: dg.AssetExecutionContext):
        funnel = select_and_write(wh, cfg.pivots)
        context.log.info("pivot funnel: " + ", ".join(f"{stage} {n}" for stage, n in funnel.items()))
        meta = {"funnel": number_table(funnel), "funnel_plot": dg.MetadataValue.md(funnel_plot(wh, funnel)),
                **{f"funnel/{stage}": n for stage, n in funnel.items()}}
        for table in PIVOT_TABLES:
            yield publish(wh, table, meta)
        yield publish(wh, SELECTION_LOG, meta, preview=False)

    return pivot_sets


def build_contract_check(cfg: PivotConfig, wh: Warehouse, table: str):
    @dg.asset_check(asset=table, name=CONTRACT_CHECK, blocking=table in BLOCKING_TABLES,
                    description=f"Great Expectations suite data_contracts/{table}.json")
    def contract() -> dg.AssetCheckResult:
        result = check_table(wh, table, contract_params(cfg))
        failed = [f["expectation"] + (f" on {f['column']}" if f.get("column") else "") for f in result.failures]
        return dg.AssetCheckResult(
            passed=result.success,
            severity=dg.AssetCheckSeverity.ERROR,
            description=result.headline(),  # a failing run prints it: expectation, column, one offending row
            metadata={
                "rows": result.n_rows,
                "failed_expectations": dg.MetadataValue.json(failed),
                "summary": dg.MetadataValue.md("```\n" + result.summary() + "\n```"),
                "sample_failing_rows": dg.MetadataValue.json([f.get("sample_rows", [])[:3] for f in result.failures]),
            },
        )

    return contract


def build_export_assets(cfg: PivotConfig, wh: Warehouse) -> list:
    train_table = SET_TABLES[cfg.training.set]

    # Exports depend on all three sets: they come from one selection, so a failed contract on any of them
    # (blocking checks) means the selection is suspect and nothing reaches a trainer.
    @dg.asset(name=HF_EXPORT, deps=[*PIVOT_TABLES, "trajectories"], group_name=GROUP, kinds={"huggingface"},
              code_version=f"1-{cfg.training.set}")
    def pivot_dataset(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """The training pivot set as a Hugging Face dataset dir with TRL-ready columns (prompt, tools, ...)."""
        out = export_set(wh, cfg.training.set, "hf", wh.root / "exports" / f"{train_table}_hf")
        return dg.MaterializeResult(
            metadata={"path": dg.MetadataValue.path(str(out)), "set": cfg.training.set},
            data_version=dg.DataVersion(wh.data_version(train_table)),
        )

    @dg.asset(name=NEMO_EXPORT, deps=[*PIVOT_TABLES, "trajectories"], group_name=GROUP, kinds={"json"}, code_version="1")
    def pivot_nemo_gym(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """D_adv as NeMo-Gym pivot JSONL (responses_create_params + expected_action) for NeMo-RL."""
        path = export_set(wh, "adv", "nemo-gym", wh.root / "exports" / "pivots_adv.jsonl")
        n = sum(1 for _ in open(path, encoding="utf-8"))
        return dg.MaterializeResult(
            metadata={"path": dg.MetadataValue.path(str(path)), "rows": n},
            data_version=dg.DataVersion(wh.data_version("pivots_adv")),
        )

    return [pivot_dataset, pivot_nemo_gym]


def build_assets(cfg: PivotConfig, wh: Warehouse, verifiers=None) -> list:
    return [build_pivot_sets_asset(cfg, wh), *build_export_assets(cfg, wh),
            *(build_contract_check(cfg, wh, t) for t in CONTRACT_TABLES)]
