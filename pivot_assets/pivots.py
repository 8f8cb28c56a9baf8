"""Stage 4: `turn_profiles` -> pivot sets (D_mixed, D_adv, D_cand), data contracts as asset checks
(blocking on the pivot sets), and the exports trainers read (HF dataset for TRL, NeMo-Gym JSONL)."""


import dagster as dg

from pivot_assets.config import PivotConfig
from pivot_assets.plots import histogram_png, markdown_image, save_png
from pivot_assets.resources import PivotSettings, publish
from pivot_assets.schema import canonical_json, short_hash
from pivot_assets.warehouse import Warehouse
from pivot_assets.warehouse_ops import SET_TABLES, check_table, contract_params, export_set

CONTRACT_CHECK = "data_contract"
PIVOT_TABLES = tuple(SET_TABLES[s] for s in ("mixed", "adv", "cand"))
SELECTION_LOG = "pivot_selection_log"
HF_EXPORT = "pivot_dataset"
NEMO_EXPORT = "pivot_nemo_gym"


def pivot_options(cfg: PivotConfig):
    from pivot_assets.pivot_selection import PivotOptions

    return PivotOptions(**cfg.section("pivots"))


def select(wh: Warehouse, cfg: PivotConfig) -> dict:
    from pivot_assets.pivot_selection import select_pivots

    return select_pivots(wh.read("turn_profiles"), wh.read("turns"), pivot_options(cfg))


def funnel_metadata(result: dict) -> dict:
    from pivot_assets.pivot_selection import funnel_counts

    return {f"funnel/{stage}": n for stage, n in funnel_counts(result).items()}


def pass_rate_plot(wh: Warehouse, table: str) -> str:
    means = wh.read(table, ["reward_mean"])["reward_mean"].to_list()
    png = histogram_png(means, title=f"{table}: reference pass rate per turn", xlabel="reward_mean")
    save_png(png, wh.root / "plots" / f"{table}_pass_rate.png")
    return markdown_image(png, f"{table} pass-rate histogram")


PIVOT_SET_DOCS = {
    "pivots_mixed": "D_mixed: turns whose reference outcomes are mixed (reward_var > 0).",
    "pivots_adv": "D_adv: mixed turns that are also hard (reward_mean <= lambda_diff).",
    "pivots_cand": "D_cand: a seeded random sample of candidate turns, the size of D_adv (the no-filter ablation).",
    SELECTION_LOG: "Every (turn, set) decision with its reason: kept, zero_variance, too_easy, over caps, ...",
}


def build_pivot_sets_asset(version: str):
    """All three sets and the selection log from ONE selection over one profile generation, so they
    always agree with each other and with the funnel."""

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(name, deps=["turn_profiles", "turns"], group_name="pivots", code_version=version,
                         description=text, kinds={"parquet", "duckdb"})
            for name, text in PIVOT_SET_DOCS.items()
        ],
        can_subset=False,
    )
    def pivot_sets(context: dg.AssetExecutionContext, settings: PivotSettings):
        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        result = select(wh, cfg)
        for table in (*PIVOT_TABLES, SELECTION_LOG):
            key = "selection_log" if table == SELECTION_LOG else table
            wh.write_table(table, result[key].to_arrow())
        funnel = funnel_metadata(result)
        context.log.info(f"pivot sets: {funnel}")
        plot = dg.MetadataValue.md(pass_rate_plot(wh, "turn_profiles"))
        for table in PIVOT_TABLES:
            yield publish(wh, table, {**funnel, "pass_rate_histogram": plot})
        yield publish(wh, SELECTION_LOG, funnel, preview=False)

    return pivot_sets


def build_contract_check(table: str, blocking: bool):
    @dg.asset_check(asset=table, name=CONTRACT_CHECK, blocking=blocking,
                    description=f"Great Expectations suite data_contracts/{table}.json")
    def contract(settings: PivotSettings) -> dg.AssetCheckResult:
        cfg = settings.load()
        result = check_table(Warehouse(cfg.warehouse_dir), table, contract_params(cfg))
        failed = [f["expectation"] + (f" on {f['column']}" if f.get("column") else "") for f in result.failures]
        return dg.AssetCheckResult(
            passed=result.success,
            severity=dg.AssetCheckSeverity.ERROR,
            description=result.summary().splitlines()[0] if result.success else "; ".join(failed),
            metadata={
                "rows": result.n_rows,
                "failed_expectations": dg.MetadataValue.json(failed),
                "summary": dg.MetadataValue.md("```\n" + result.summary() + "\n```"),
                "sample_failing_rows": dg.MetadataValue.json([f.get("sample_rows", [])[:3] for f in result.failures]),
            },
        )

    return contract


def build_export_assets(cfg: PivotConfig) -> list:
    train_table = SET_TABLES[cfg.training.set]

    # Exports depend on all three sets: they come from one selection, so a failed contract on any of them
    # (blocking checks) means the selection is suspect and nothing reaches a trainer.
    @dg.asset(name=HF_EXPORT, deps=[*PIVOT_TABLES, "trajectories"], group_name="pivots", kinds={"huggingface"},
              code_version=f"1-{cfg.training.set}")
    def pivot_dataset(context: dg.AssetExecutionContext, settings: PivotSettings) -> dg.MaterializeResult:
        """The training pivot set as a Hugging Face dataset dir with TRL-ready columns (prompt, tools, ...)."""
        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        out = export_set(cfg, cfg.training.set, "hf", wh.root / "exports" / f"{train_table}_hf")
        return dg.MaterializeResult(
            metadata={"path": dg.MetadataValue.path(str(out)), "set": cfg.training.set},
            data_version=dg.DataVersion(wh.data_version(train_table)),
        )

    @dg.asset(name=NEMO_EXPORT, deps=[*PIVOT_TABLES, "trajectories"], group_name="pivots", kinds={"json"}, code_version="1")
    def pivot_nemo_gym(context: dg.AssetExecutionContext, settings: PivotSettings) -> dg.MaterializeResult:
        """D_adv as NeMo-Gym pivot JSONL (responses_create_params + expected_action) for NeMo-RL."""
        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        path = export_set(cfg, "adv", "nemo-gym", wh.root / "exports" / "pivots_adv.jsonl")
        n = sum(1 for _ in open(path, encoding="utf-8"))
        return dg.MaterializeResult(
            metadata={"path": dg.MetadataValue.path(str(path)), "rows": n},
            data_version=dg.DataVersion(wh.data_version("pivots_adv")),
        )

    return [pivot_dataset, pivot_nemo_gym]


def build_pivot_assets(cfg: PivotConfig) -> list:
    from pivot_assets.contracts import BLOCKING_TABLES, CONTRACT_TABLES

    version = short_hash(canonical_json(cfg.section("pivots")))
    assets = [build_pivot_sets_asset(version), *build_export_assets(cfg)]
    checks = [build_contract_check(t, blocking=t in BLOCKING_TABLES) for t in CONTRACT_TABLES]
    return assets + checks
