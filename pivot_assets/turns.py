"""Stage 2: `trajectories` -> `turns` (one row per assistant message; states are rebuilt, not copied)."""


import dagster as dg
import duckdb

from pivot_assets.config import PivotConfig
from pivot_assets.resources import PivotSettings, publish, timed
from pivot_assets.warehouse import Warehouse

TURNS_VERSION = "1"


def write_turns(wh: Warehouse) -> int:
    from pivot_assets.turn_extraction import extract_turns_parquet

    # extract_turns_parquet writes a temp file and renames it: already atomic
    return extract_turns_parquet(wh.table_path("trajectories"), wh.table_path("turns"))


def build_turn_assets(cfg: PivotConfig) -> list:
    @dg.asset(
        deps=["trajectories"],
        group_name="ingest",
        code_version=TURNS_VERSION,
        kinds={"parquet", "duckdb"},
    )
    def turns(context: dg.AssetExecutionContext, settings: PivotSettings) -> dg.MaterializeResult:
        """Extracted assistant turns: (state = messages before it + tools, action = the expert's message)."""
        wh = settings.warehouse()
        with timed() as t:
            n = write_turns(wh)
        context.log.info(f"extracted {n} turns in {t['seconds']:.2f}s")
        mix = dict(
            duckdb.sql(
                f"select action_kind, count(*) from read_parquet('{wh.table_path('turns')}') group by 1 order by 1"
            ).fetchall()
        )
        return publish(
            wh,
            "turns",
            {
                "seconds": round(t["seconds"], 3),
                "turns_per_second": round(n / max(t["seconds"], 1e-9)),
                "action_kinds": dg.MetadataValue.json(mix),
            },
        )

    return [turns]
