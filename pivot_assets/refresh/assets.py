"""Refresh rounds in Dagster (group `refresh`; refresh/rounds.py does the work): one asset per round,
`refresh_round_0` .. `refresh_round_<rounds-1>`, each below the one before (materializing round 2 materializes
rounds 0 and 1 first when they are missing or stale), and `refresh_report` over all of them.

One asset per round rather than a partition per round: the lineage graph shows the chain of rounds, each round
keeps its own code version, data version and metadata (buckets, churn, pass-rate drift, its spend, the bucket
flow so far), and `pivot run` needs no partition handling (the static partitions of this project are shards).
Only with `refresh.rounds` >= 1; a config without it has none of these assets.
"""

import dagster as dg
import polars as pl

from pivot_assets.core.catalog import PIVOT_TABLES, REFRESH_BUCKETS, REFRESH_BUDGET, REFRESH_PROFILES
from pivot_assets.core.config import ConfigError, PivotConfig
from pivot_assets.core.identity import REFRESH, fingerprint, values
from pivot_assets.core.ids import canonical_json, short_hash
from pivot_assets.core.plots import markdown_image, save_png, stacked_bars_png
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.materialization import number_table, publish
from pivot_assets.verifiers import VerifierSets

from . import rounds as refresh

GROUP = __package__.rsplit(".", 1)[-1]
REPORT = "refresh_report"


def bucket_flow_plot(wh: Warehouse, upto: int | None = None) -> str:
    counts = refresh.bucket_counts(wh, upto)
    labels = [f"round {r}" for r in counts]
    stacks = {b: [counts[r].get(b, 0) for r in counts] for b in REFRESH_BUCKETS}
    png = stacked_bars_png(labels, stacks, title="refresh: turns per bucket in each round", ylabel="turns")
    save_png(png, wh.root / "plots" / "refresh_bucket_flow.png")
    return markdown_image(png, "bucket flow")


def check_config(cfg: PivotConfig) -> None:
    if cfg.scale.shards != 1 or cfg.scale.engine != "local":
        raise ConfigError(f"{cfg.source}: refresh.rounds needs scale.shards 1 and scale.engine local "
                          "(a round profiles the whole pool in one process)")


def round_metadata(wh: Warehouse, result: dict) -> dict:
    rows: pl.DataFrame = result["rows"]
    r = result["round"]
    buckets = {b: rows.filter(pl.col("bucket") == b).height for b in REFRESH_BUCKETS}
    spend = {f"{b['phase']}/{k}": b[k] for b in result["budget"] for k in ("samples", "generated_tokens")}
    meta = {"round": r, "policy_fp": result["policy_fp"], "turns": rows.height,
            "trained_turns": int(rows["trained"].sum()), "buckets": number_table(buckets, "bucket"),
            **{f"bucket/{b}": n for b, n in buckets.items()}, **spend,
            "eval_accuracy": result["evaluation"]["accuracy"], "eval_turns": result["evaluation"]["turns"],
            "rollouts_generated_this_run": int(result["generated"].get("rollouts_generated", 0)),
            "trained_this_run": result["trained"],
            "bucket_flow": dg.MetadataValue.md(bucket_flow_plot(wh, upto=r))}
    if r > 0:
        meta.update({"skipped_settled": result["skipped"], "replayed": result["replayed"], "key": result["key"],
                     **refresh.churn(refresh.read_round(wh, r - 1), rows)})
    return meta


def build_round_asset(cfg: PivotConfig, wh: Warehouse, verifiers: VerifierSets, r: int):
    deps = ["grpo_run", "turn_profiles", *PIVOT_TABLES] if r == 0 else [refresh.round_asset(r - 1), "turns"]
    # round 0 records the chain; a later round also profiles, selects and trains under these settings
    version = {"version": refresh.VERSION, "round": r, "lambda_diff": cfg.pivots.lambda_diff,
               "set": cfg.training.set, "eval_k": cfg.evaluation.k}
    if r:
        version.update(refresh=values(cfg.refresh, REFRESH))

    @dg.asset(name=refresh.round_asset(r), deps=deps, group_name=GROUP, kinds={"pytorch", "parquet"},
              code_version=fingerprint(version))
    def refresh_round(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """A refresh round: round 0 records the pipeline's own chain; round r profiles the pool with round r-1's
        GRPO checkpoint, skips settled turns with refresh.skip_settled_prob, reselects, replays mastered turns and
        trains refresh.steps_per_round GRPO steps on."""
        if r == 0:
            result = refresh.record_round_zero(wh, cfg, verifiers, context.log.info)
        else:
            result = refresh.run_round(wh, cfg, verifiers, r, context.log.info)
        rows = result["rows"].sort("turn_id")
        version_of_rows = short_hash(canonical_json([result.get("key"), rows.select(
            "turn_id", "profiled_by", "k", "n_pass", "bucket", "skipped", "replayed", "trained").rows()]))
        return publish(wh, REFRESH_PROFILES, round_metadata(wh, result), preview=False, asset=refresh.round_asset(r),
                       data_version=version_of_rows)

    return refresh_round


def markdown_rows(wh: Warehouse, query: str) -> str:
    con = wh.connect(read_only=True)
    try:
        df = con.sql(query).pl()
    finally:
        con.close()
    head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns)
    return "\n".join([head] + ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in df.rows()])


def build_report_asset(cfg: PivotConfig, wh: Warehouse):
    @dg.asset(name=REPORT, deps=[refresh.round_asset(r) for r in range(cfg.refresh.rounds)], group_name=GROUP,
              kinds={"duckdb"}, code_version=fingerprint({"version": refresh.VERSION, "rounds": cfg.refresh.rounds}))
    def refresh_report() -> dg.MaterializeResult:
        """Every round side by side: the rollout budget (sql/rollout_budget.sql) with the end-to-end RL estimate,
        the bucket flow across rounds, the churn between rounds (sql/refresh_churn.sql) and the pass-rate drift."""
        meta = {"rollout_budget": dg.MetadataValue.md(markdown_rows(wh, "select * from rollout_budget")),
                "bucket_flow": dg.MetadataValue.md(bucket_flow_plot(wh)),
                "bucket_changes": dg.MetadataValue.md(markdown_rows(wh, "select * from refresh_bucket_flow where "
                                                                        "from_bucket <> to_bucket")),
                "pass_rate_drift": dg.MetadataValue.md(markdown_rows(wh, "select * from refresh_drift"))}
        return publish(wh, REFRESH_BUDGET, meta, preview=False, asset=REPORT)

    return refresh_report


def build_assets(cfg: PivotConfig, wh: Warehouse, verifiers: VerifierSets) -> list:
    if cfg.refresh.rounds == 0:
        return []
    check_config(cfg)
    return [*(build_round_asset(cfg, wh, verifiers, r) for r in range(cfg.refresh.rounds)),
            build_report_asset(cfg, wh)]
