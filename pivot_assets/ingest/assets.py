"""Stage 1 in Dagster: raw trajectory files -> `trajectories` + `quarantine` -> `turns`, and the profiles pivot rows
arrive with -> `imported_profiles` (group `ingest`: no model is loaded)."""

import dagster as dg

from pivot_assets.core.catalog import IMPORTED_PROFILES
from pivot_assets.core.config import PivotConfig
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.materialization import publish, timed

from .imported_profiles import IMPORT_VERSION, import_profiles
from .inputs import (action_kind_mix, inputs_fingerprint, resolved_inputs, skipped_files_line, write_ingest,
                     write_turns)

GROUP = __package__.rsplit(".", 1)[-1]
TURNS_VERSION = "1"
INGEST_TABLES = {
    "trajectories": "Canonical trajectories (one row per unique trajectory; content-hash id).",
    "quarantine": "Every input record that could not be ingested, with its reason and raw text.",
}


def build_assets(cfg: PivotConfig, wh: Warehouse, verifiers=None) -> list:
    version = inputs_fingerprint(cfg)

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(name, group_name=GROUP, code_version=version, description=text, kinds={"parquet", "duckdb"})
            for name, text in INGEST_TABLES.items()
        ],
        can_subset=False,
    )
    def ingest(context: dg.AssetExecutionContext):
        inputs = resolved_inputs(cfg)
        with timed() as t:
            counts = write_ingest(wh, inputs)
        context.log.info(
            f"read {counts['read']} records: {counts['ingested']} ingested, "
            f"{counts['quarantined']} quarantined, {counts['duplicates']} duplicates in {t['seconds']:.1f}s"
        )
        if counts["skipped"]:
            context.log.warning(skipped_files_line(counts["skipped"]))
        yield publish(wh, "trajectories", {
            "read": counts["read"], "ingested": counts["ingested"], "quarantined": counts["quarantined"],
            "duplicates": counts["duplicates"], "skipped_files": len(counts["skipped"]),
            "skipped": dg.MetadataValue.json(counts["skipped"]), "by_format": dg.MetadataValue.json(counts["by_format"]),
            "by_adapter": dg.MetadataValue.json(counts["by_adapter"]), "workers": counts["workers"],
            "inputs": dg.MetadataValue.json([i["path"] for i in inputs]), "seconds": round(t["seconds"], 2),
        })
        yield publish(wh, "quarantine", {"reasons": dg.MetadataValue.json(counts["quarantine_reasons"])})

    @dg.asset(deps=["trajectories"], group_name=GROUP, code_version=TURNS_VERSION, kinds={"parquet", "duckdb"})
    def turns(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """Extracted assistant turns: (state = messages before it + tools, action = the expert's message)."""
        with timed() as t:
            n = write_turns(wh)
        context.log.info(f"extracted {n} turns in {t['seconds']:.2f}s")
        return publish(wh, "turns", {
            "seconds": round(t["seconds"], 3), "turns_per_second": round(n / max(t["seconds"], 1e-9)),
            "action_kinds": dg.MetadataValue.json(action_kind_mix(wh)),
        })

    return [ingest, turns, build_imported_profiles_asset(cfg, wh)]


def build_imported_profiles_asset(cfg: PivotConfig, wh: Warehouse):
    @dg.asset(name=IMPORTED_PROFILES, deps=["trajectories", "turns"], group_name=GROUP, code_version=IMPORT_VERSION,
              kinds={"parquet", "duckdb"})
    def imported_profiles(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """The profiles NeMo-Gym pivot rows arrive with (pass_rate, pass_rate_total, pass_rate_passed,
        <model>_info), one per pivot turn, with their source (imported, the model, the file's fingerprint); read
        by selection under pivots.profile_source: imported. Nothing is sampled."""
        with timed() as t:
            table, counts = import_profiles(resolved_inputs(cfg))
        wh.write_table(IMPORTED_PROFILES, table)
        context.log.info(f"imported {counts['profiles']} turn profiles from {counts['rows_read']} pivot rows "
                         f"({counts['duplicate_rows']} duplicate, {counts['quarantined_rows']} quarantined)")
        return publish(wh, IMPORTED_PROFILES, {**counts, "seconds": round(t["seconds"], 2),
                                               "models": dg.MetadataValue.json(sorted(
                                                   {m for m in table.column("model").to_pylist() if m}))})

    return imported_profiles

