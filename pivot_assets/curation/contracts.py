"""Data contracts (Dagster-free): the Great Expectations 1.x suites in data_contracts/, run on one table.

A suite is a GE suite JSON file, data_contracts/<table>.json. Facts a column expectation cannot see on
its own (a turn's rewards, a pivot's turn in `turns`, JSON validity) are computed here first as helper
columns (`*_gap`, `*_problem`, `turn_in_turns`, ...; see data_contracts/README.md), then checked by plain
expectations, so every rule fails with a named expectation and sample rows.

Great Expectations is imported lazily (it costs seconds); one ephemeral context per process is reused.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from pivot_assets.core.ids import turn_id
from pivot_assets.core.shapes import ROLES, action_tool_names

from pivot_assets.core.catalog import (  # noqa: E402
    BLOCKING_TABLES,
    CONTRACT_TABLES,
    CONTRACTS_DIR,
    KEY_COLUMNS,
    PIVOT_TABLES,
    RELATED_TABLES,
)

DEFAULT_PARAMS = {"lambda_diff": 0.6}
SAMPLE_ROWS = 5
ACTION_TYPE_OF_KIND = {"tool_call": "function_call", "message": "message", "tool_call_batch": "function_call_batch"}


@dataclass
class ContractResult:
    """Outcome of one table's contract; `failures` name the expectation and carry sample failing rows."""

    table: str
    success: bool
    failures: list[dict] = field(default_factory=list)
    statistics: dict = field(default_factory=dict)
    n_rows: int = 0

    def summary(self) -> str:
        """One line per failed expectation (or one line saying all passed)."""
        stats = self.statistics
        head = (
            f"{self.table}: {'PASS' if self.success else 'FAIL'} "
            f"({stats.get('successful_expectations', 0)}/{stats.get('evaluated_expectations', 0)} expectations, {self.n_rows} rows)"
        )
        lines = [head]
        for f in self.failures:
            where = f" on {f['column']}" if f.get("column") else ""
            count = f" ({f['unexpected_count']} unexpected)" if f.get("unexpected_count") is not None else ""
            detail = f": {f['error']}" if f.get("error") else ""
            sample = f"; e.g. {json.dumps(f['sample_rows'][0], default=str)[:300]}" if f.get("sample_rows") else ""
            lines.append(f"  - {f['expectation']}{where}{count}{detail}{sample}")
        return "\n".join(lines)


def run_contract(table: str, df: Any, *, related: dict[str, Any] | None = None, params: dict | None = None) -> ContractResult:
    """Validate `df` (polars, pyarrow or pandas) against data_contracts/<table>.json.

    related: the other tables the contract needs (RELATED_TABLES[table]); a missing one is an error.
    params: suite parameters, e.g. {"lambda_diff": 0.6} for pivots_adv (DEFAULT_PARAMS fill the rest).
    """
    if table not in CONTRACT_TABLES:
        raise ValueError(f"no contract for table {table!r} (known: {', '.join(CONTRACT_TABLES)})")
    related = related or {}
    missing = [t for t in RELATED_TABLES.get(table, ()) if t not in related]
    if missing:
        raise ValueError(f"the {table} contract needs related tables {missing}: pass them as related={{name: frame}}")
    frame = with_helper_columns(table, _to_polars(df), {k: _to_polars(v) for k, v in related.items()})
    pandas_frame = _to_pandas(frame)
    validation = _validate(table, pandas_frame, {**DEFAULT_PARAMS, **(params or {})})
    failures = [_failure(r, pandas_frame, table) for r in validation.results if not r.success]
    return ContractResult(
        table=table,
        success=bool(validation.success),
        failures=failures,
        statistics=dict(validation.statistics),
        n_rows=len(pandas_frame),
    )


def load_suite_spec(table: str) -> dict:
    """The suite file of a table as a dict {name, expectations: [{type, kwargs, meta}]}."""
    return json.loads((CONTRACTS_DIR / f"{table}.json").read_text(encoding="utf-8"))


# -- helper columns -------------------------------------------------------------------------------


def with_helper_columns(table: str, frame: pl.DataFrame, related: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Add the helper columns the table's suite checks (documented in data_contracts/README.md)."""
    if table == "trajectories":
        return _trajectory_helpers(frame)
    if table == "turns":
        return _turn_helpers(frame)
    if table in ("turn_profiles", *PIVOT_TABLES):
        frame = _profile_helpers(frame)
    if table == "turn_profiles":
        return _reward_helpers(frame, related["rollout_rewards"])
    if table in PIVOT_TABLES:
        return _turn_exists(frame, related["turns"])
    return frame


def _messages_problem(messages: list[dict] | None) -> str | None:
    for i, m in enumerate(messages or []):
        if m.get("role") not in ROLES:
            return f"message {i}: role {m.get('role')!r}"
        for call in m.get("tool_calls") or []:
            try:
                json.loads(call.get("arguments"))
            except (TypeError, ValueError):
                return f"message {i}: tool call {call.get('name')!r} arguments are not JSON text"
    return None


def _tools_problem(tools: str | None) -> str | None:
    try:
        parsed = json.loads(tools) if tools is not None else []
    except (TypeError, ValueError):
        return "tools is not JSON text"
    if not isinstance(parsed, list) or not all(isinstance(t, dict) for t in parsed):
        return "tools is not a JSON list of tool schemas"
    return None


def _trajectory_helpers(frame: pl.DataFrame) -> pl.DataFrame:
    if "messages" not in frame.columns:
        return frame
    messages = frame["messages"].to_list()
    helpers = [
        pl.Series("n_messages", [len(m or []) for m in messages], dtype=pl.Int64),
        pl.Series("messages_problem", [_messages_problem(m) for m in messages], dtype=pl.Utf8),
    ]
    if "tools" in frame.columns:
        helpers.append(pl.Series("tools_problem", [_tools_problem(t) for t in frame["tools"].to_list()], dtype=pl.Utf8))
    return frame.with_columns(helpers)


def _action_problem(kind: str | None, action_text: str | None, tool_names: list[str] | None) -> str | None:
    try:
        action = json.loads(action_text)
    except (TypeError, ValueError):
        return "expert_action is not JSON text"
    if not isinstance(action, dict) or action.get("type") != ACTION_TYPE_OF_KIND.get(kind):
        return f"expert_action type {action.get('type') if isinstance(action, dict) else None!r} does not match action_kind {kind!r}"
    try:
        names = action_tool_names(action)
    except (KeyError, TypeError):
        return "expert_action lacks its name/calls"
    if tool_names is not None and list(tool_names) != names:
        return f"tool_names {list(tool_names)} != the action's {names}"
    return None


def _turn_helpers(frame: pl.DataFrame) -> pl.DataFrame:
    needed = {"turn_id", "trajectory_id", "message_index", "action_kind", "expert_action"}
    if not needed <= set(frame.columns):
        return frame  # the suite's expect_column_to_exist names what is missing
    rows = frame.select(*needed, pl.col("tool_names") if "tool_names" in frame.columns else pl.lit(None).alias("tool_names"))
    matches, problems = [], []
    for r in rows.iter_rows(named=True):
        ok = r["trajectory_id"] is not None and r["message_index"] is not None
        matches.append(ok and r["turn_id"] == turn_id(r["trajectory_id"], r["message_index"]))
        problems.append(_action_problem(r["action_kind"], r["expert_action"], r["tool_names"]))
    return frame.with_columns(
        pl.Series("turn_id_matches", matches, dtype=pl.Boolean),
        pl.Series("action_problem", problems, dtype=pl.Utf8),
    )


def _profile_helpers(frame: pl.DataFrame) -> pl.DataFrame:
    if not {"reward_std", "reward_var"} <= set(frame.columns):
        return frame
    return frame.with_columns(
        (pl.col("reward_std") - pl.col("reward_var").clip(lower_bound=0).sqrt()).abs().alias("std_gap")
    )


def _reward_helpers(profiles: pl.DataFrame, rewards: pl.DataFrame) -> pl.DataFrame:
    """k_gap, mean_gap, n_pass_gap and (binary rewards only) var_gap from the profile's own rewards."""
    key = KEY_COLUMNS["turn_profiles"]
    if "sampling_fp" in profiles.columns:  # profiles of one sampling config count only its samples
        key = [*key, "sampling_fp"]
    if not {*key, "k", "reward_mean", "reward_var", "n_pass"} <= set(profiles.columns):
        return profiles  # the suite's expect_column_to_exist names what is missing
    if not {*key, "reward"} <= set(rewards.columns):
        raise ValueError(f"turn_profiles contract: the related rollout_rewards table needs columns {[*key, 'reward']}")
    per_turn = rewards.group_by(key).agg(
        pl.len().alias("_n_rewards"),
        pl.col("reward").mean().alias("_mean"),
        (pl.col("reward") == 1.0).sum().alias("_n_full"),
        pl.col("reward").is_in([0.0, 1.0]).all().alias("_binary"),
    )
    joined = profiles.join(per_turn, on=key, how="left", maintain_order="left")
    mean = pl.col("reward_mean")
    return joined.with_columns(
        (pl.col("_n_rewards").fill_null(0) - pl.col("k")).alias("k_gap"),
        (mean - pl.col("_mean")).abs().alias("mean_gap"),
        (pl.col("n_pass") - pl.col("_n_full").fill_null(0)).alias("n_pass_gap"),
        pl.when(pl.col("_binary")).then((pl.col("reward_var") - mean * (1 - mean)).abs()).otherwise(None).alias("var_gap"),
    ).drop("_n_rewards", "_mean", "_n_full", "_binary")


def _turn_exists(pivots: pl.DataFrame, turns: pl.DataFrame) -> pl.DataFrame:
    if "turn_id" not in pivots.columns:
        return pivots
    if "turn_id" not in turns.columns:
        raise ValueError("pivot contract: the related turns table has no turn_id column")
    known = turns["turn_id"].unique()
    return pivots.with_columns(pl.col("turn_id").is_in(known.implode()).fill_null(False).alias("turn_in_turns"))


# -- conversion -----------------------------------------------------------------------------------


def _to_polars(df: Any) -> pl.DataFrame:
    if isinstance(df, pl.DataFrame):
        return df
    if isinstance(df, pl.LazyFrame):
        return df.collect()
    if isinstance(df, pa.Table):
        return pl.from_arrow(df)
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas comes with great_expectations
        pd = None
    if pd is not None and isinstance(df, pd.DataFrame):
        return pl.from_pandas(df)
    raise TypeError(f"cannot validate a {type(df).__name__}: pass a polars, pyarrow or pandas frame")


def _to_pandas(frame: pl.DataFrame):
    """Scalar columns as they are; nested (list/struct) columns as JSON text, so GE can hash and type them."""
    nested = [c for c, t in frame.schema.items() if isinstance(t, (pl.List, pl.Struct, pl.Array))]
    if nested:
        frame = frame.with_columns(
            pl.Series(c, [None if v is None else json.dumps(v, default=str) for v in frame[c].to_list()], dtype=pl.Utf8)
            for c in nested
        )
    pandas_frame = frame.to_arrow().to_pandas()
    # pandas 3 infers a `str` dtype that GE's type check does not know; object columns are checked
    # value by value against the suite's "str" type instead.
    for c, t in frame.schema.items():
        if t == pl.Utf8:
            pandas_frame[c] = pandas_frame[c].astype(object)
    return pandas_frame


# -- Great Expectations ---------------------------------------------------------------------------


@functools.cache
def _context():
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no network from here
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context, context.data_sources.add_pandas("pivot_contracts")


@functools.cache
def _suite_and_batch_definition(table: str):
    import great_expectations as gx
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    context, source = _context()
    spec = load_suite_spec(table)
    suite = gx.ExpectationSuite(name=spec["name"])
    for e in spec["expectations"]:
        # add_expectation, not add_expectation_configuration: the latter upserts by domain and would
        # merge e.g. every expect_column_to_exist of the suite into one.
        config = ExpectationConfiguration(type=e["type"], kwargs=e["kwargs"], meta=e.get("meta", {}))
        suite.add_expectation(config.to_domain_obj())
    suite = context.suites.add(suite)
    batch_definition = source.add_dataframe_asset(name=table).add_batch_definition_whole_dataframe("whole")
    return suite, batch_definition


def _validate(table: str, pandas_frame, params: dict):
    suite, batch_definition = _suite_and_batch_definition(table)
    batch = batch_definition.get_batch(batch_parameters={"dataframe": pandas_frame})
    # SUMMARY carries unexpected counts and the first 20 failing row indices: enough for sample rows.
    return batch.validate(suite, expectation_parameters=params, result_format={"result_format": "SUMMARY"})


def _failure(result, pandas_frame, table: str) -> dict:
    config = result.expectation_config
    kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
    column = kwargs.get("column") or kwargs.get("column_list") or (
        [kwargs["column_A"], kwargs["column_B"]] if "column_A" in kwargs else None
    )
    info = result.result or {}
    failure = {
        "expectation": config.type,
        "column": column,
        "kwargs": kwargs,
        "notes": (config.meta or {}).get("notes"),
        "unexpected_count": info.get("unexpected_count"),
        "observed_value": info.get("observed_value"),
        "sample_rows": _sample_rows(pandas_frame, info.get("partial_unexpected_index_list") or info.get("unexpected_index_list") or [], table, column),
    }
    exception = (result.exception_info or {}) if isinstance(result.exception_info, dict) else {}
    if exception.get("raised_exception"):
        failure["error"] = str(exception.get("exception_message"))[:300]
    return failure


def _sample_rows(pandas_frame, indices: list, table: str, column) -> list[dict]:
    if not indices:
        return []
    involved = [column] if isinstance(column, str) else list(column or [])
    helpers = [c for c in pandas_frame.columns if c.endswith(("_gap", "_problem", "_matches", "_in_turns"))]
    keep = [c for c in dict.fromkeys([*KEY_COLUMNS.get(table, []), *involved, *helpers]) if c in pandas_frame.columns]
    rows = pandas_frame.loc[list(indices[:SAMPLE_ROWS]), keep].to_dict(orient="records")
    return [{k: _plain(v) for k, v in row.items()} for row in rows]


def _plain(value):
    """JSON-friendly scalars for metadata (numpy -> python, NaN -> None)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
