"""Data contracts (Dagster-free): the Great Expectations 1.x suites in data_contracts/, run where the data is.

A suite is a GE suite JSON file, data_contracts/<table>.json. Every check has two parts:

  1. exact, in DuckDB, over the whole table (Parquet files or a registered frame), with bounded memory: each
     expectation of the suite is compiled to SQL (a row predicate counted in ONE aggregate scan, a uniqueness
     check as a hash aggregate, column existence and types from the schema), and for each failing expectation
     up to SAMPLE_ROWS failing rows are fetched;
  2. the GE suite itself, run by Great Expectations on a bounded sample: the first GX_SAMPLE_ROWS rows plus every
     failing row found in 1, so GE sees each failure and reports it in its own terms.

An expectation passes when both do; `unexpected_count` is the exact SQL count. Facts a column expectation cannot
see on its own (a turn's rewards, a pivot's turn in `turns`, JSON validity) are computed first as helper columns
of a SQL view (`*_gap`, `*_problem`, `turn_id_matches`, `turn_in_turns`; see data_contracts/README.md), then
checked by plain expectations, so every rule fails with a named expectation and sample rows.

Great Expectations is imported lazily (it costs seconds); one ephemeral context per process is reused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from pivot_assets.core.catalog import (
    BLOCKING_TABLES,
    CONTRACT_TABLES,
    CONTRACTS_DIR,
    KEY_COLUMNS,
    PIVOT_TABLES,
    RELATED_TABLES,
)
from pivot_assets.core.config import BAND, DEFAULT_RULE, LAMBDA_DIFF, MIN_STD
from pivot_assets.core.shapes import ROLES
from pivot_assets.core.warehouse import connect_for
from pivot_assets.curation.selection import adv_contract_bounds

__all__ = ["BLOCKING_TABLES", "CONTRACT_TABLES", "ContractResult", "check_parquet", "contract_key", "load_suite_spec",
           "prewarm", "run_contract"]



def suite_params(params: dict) -> dict:
    """The params with the D_adv bounds of the selection rule they name (selection.adv_contract_bounds: the
    rule's one definition) as the suite's adv_* parameters."""
    return {**params, **adv_contract_bounds(params)}


# policy_k None: k has no upper bound; the rule's parameters are read under its own rule only
DEFAULT_PARAMS = suite_params({"lambda_diff": LAMBDA_DIFF, "policy_k": None, "rule": DEFAULT_RULE, "band": list(BAND),
                               "min_std": MIN_STD})
SAMPLE_ROWS = 5  # failing rows shown per failed expectation
GX_SAMPLE_ROWS = 500  # rows Great Expectations validates (plus every failing row found in SQL)
MEMORY_LIMIT = "1GB"  # DuckDB's budget for a check; larger aggregates spill to disk
ACTION_TYPE_OF_KIND = {"tool_call": "function_call", "message": "message", "tool_call_batch": "function_call_batch"}
HELPER_SUFFIXES = ("_gap", "_problem", "_matches", "_in_turns")
ROW_ID = ("__file", "__row")  # identity of a row in the checked relation (never shown, never validated)


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
        return "\n".join([head, *(f"  - {failure_line(f)}" for f in self.failures)])

    def headline(self) -> str:
        """One line for a run's error: the first failed expectation, its column and one offending row."""
        if self.success:
            return self.summary()
        more = f" (+{len(self.failures) - 1} more failed expectations)" if len(self.failures) > 1 else ""
        return f"{self.table}: {failure_line(self.failures[0])}{more}"


def failure_line(f: dict) -> str:
    """A failed expectation as one line: expectation, column, count, error and the first offending row."""
    where = f" on {f['column']}" if f.get("column") else ""
    count = f" ({f['unexpected_count']} unexpected)" if f.get("unexpected_count") is not None else ""
    detail = f": {f['error']}" if f.get("error") else ""
    sample = f"; e.g. {json.dumps(f['sample_rows'][0], default=str)[:300]}" if f.get("sample_rows") else ""
    return f"{f['expectation']}{where}{count}{detail}{sample}"


def load_suite_spec(table: str) -> dict:
    """The suite file of a table as a dict {name, expectations: [{type, kwargs, meta}]}."""
    return json.loads((CONTRACTS_DIR / f"{table}.json").read_text(encoding="utf-8"))


def contract_key(table: str, data_versions: dict[str, str], params: dict | None = None) -> str:
    """What a check's result depends on, as one hash: the data versions of the table and its related tables, the
    table's suite file, the params, this module's code and Great Expectations' version. Equal keys, equal results."""
    import importlib.metadata

    h = hashlib.sha256()
    for piece in (table, json.dumps(data_versions, sort_keys=True),
                  json.dumps({**DEFAULT_PARAMS, **(params or {})}, sort_keys=True, default=str),
                  (CONTRACTS_DIR / f"{table}.json").read_text(encoding="utf-8"), _CODE_DIGEST,
                  importlib.metadata.version("great_expectations")):
        h.update(piece.encode() + b"\0")
    return h.hexdigest()[:20]


def _code_digest() -> str:
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


_CODE_DIGEST = _code_digest()  # this module decides every verdict: an edit of it invalidates kept results


# ---------------------------------------------------------------------------------------------- entry points


def run_contract(table: str, df: Any, *, related: dict[str, Any] | None = None, params: dict | None = None) -> ContractResult:
    """Validate a frame (polars, pyarrow or pandas) against data_contracts/<table>.json.

    related: the other tables the contract needs (RELATED_TABLES[table]); a missing one is an error.
    params: suite parameters, e.g. {"lambda_diff": 0.6} or {"rule": "band", "band": [0.2, 0.8]} for pivots_adv
    (DEFAULT_PARAMS fill the rest).
    The frames are registered in DuckDB (no copy) and checked exactly as check_parquet checks files.
    """
    _known(table)
    related = related or {}
    _require_related(table, related)
    with _connection() as con:
        con.register("contract_source", _with_row_id(_to_arrow(df)))
        for name in RELATED_TABLES.get(table, ()):
            con.register(f"related_{name}", _to_arrow(related[name]))
        return _check(con, table, params)


def check_parquet(table: str, sources: dict[str, str], params: dict | None = None,
                  memory_limit: str = MEMORY_LIMIT) -> ContractResult:
    """Validate a table stored as Parquet: `sources` maps the table and its related tables to what DuckDB's
    read_parquet reads (a file or a glob). Nothing is loaded whole: memory is bounded by `memory_limit`."""
    _known(table)
    _require_related(table, sources)
    with _connection(memory_limit, sources) as con:
        con.execute(f"CREATE VIEW contract_source AS SELECT *, filename AS __file, file_row_number AS __row "
                    f"FROM read_parquet({_sql_str(sources[table])}, union_by_name = true, filename = true, "
                    f"file_row_number = true, hive_partitioning = false)")  # shard=NNN/ is a layout, not a column
        for name in RELATED_TABLES.get(table, ()):
            con.execute(f"CREATE VIEW related_{name} AS SELECT * FROM read_parquet({_sql_str(sources[name])}, "
                        "union_by_name = true, hive_partitioning = false)")
        return _check(con, table, params)


def _known(table: str) -> None:
    if table not in CONTRACT_TABLES:
        raise ValueError(f"no contract for table {table!r} (known: {', '.join(CONTRACT_TABLES)})")


def _require_related(table: str, related: dict) -> None:
    missing = [t for t in RELATED_TABLES.get(table, ()) if t not in related]
    if missing:
        raise ValueError(f"the {table} contract needs related tables {missing}: pass them as related={{name: frame}}")


class _connection:
    """An in-memory DuckDB with a memory budget and a spill directory (a context manager)."""

    def __init__(self, memory_limit: str = MEMORY_LIMIT, sources: dict[str, str] | None = None):
        spill = os.path.join(tempfile.gettempdir(), "pivot-contracts-spill")
        self.con = connect_for(sources, memory_limit=memory_limit, temp_directory=spill)
        self.con.execute("SET enable_progress_bar = false")

    def __enter__(self) -> duckdb.DuckDBPyConnection:
        return self.con

    def __exit__(self, *exc) -> None:
        self.con.close()


# ---------------------------------------------------------------------------------------------- the check


def _check(con: duckdb.DuckDBPyConnection, table: str, params: dict | None) -> ContractResult:
    params = suite_params({**DEFAULT_PARAMS, **(params or {})})
    source_columns = _columns(con, "contract_source")
    related_columns = {name: _columns(con, f"related_{name}") for name in RELATED_TABLES.get(table, ())}
    con.execute(f"CREATE OR REPLACE TEMP VIEW checked AS {helper_view_sql(table, source_columns, related_columns)}")
    columns = _columns(con, "checked")
    spec = load_suite_spec(table)
    rules = [compile_expectation(e, columns, params) for e in spec["expectations"]]
    n_rows, counts = _count_unexpected(con, rules)
    examples = {i: _failing_rows(con, rule) for i, rule in enumerate(rules) if counts[i]}
    gx_results = _gx_on_sample(con, table, columns, examples, params)
    failures, passed = [], 0
    for i, (expectation, rule) in enumerate(zip(spec["expectations"], rules)):
        gx = gx_results.get(_signature(expectation["type"], _resolved(expectation["kwargs"], params)))
        ok = counts[i] == 0 and rule.error is None and (gx is None or gx["success"])
        passed += ok
        if not ok:
            failures.append(_failure(table, expectation, rule, counts[i], examples.get(i, []), gx))
    statistics = {"evaluated_expectations": len(rules), "successful_expectations": passed,
                  "unsuccessful_expectations": len(rules) - passed,
                  "success_percent": 100.0 * passed / len(rules) if rules else 100.0,
                  "rows_checked_in_sql": n_rows, "rows_validated_by_gx": gx_results.get("__rows__", 0)}
    return ContractResult(table=table, success=not failures, failures=failures, statistics=statistics, n_rows=n_rows)


def _columns(con: duckdb.DuckDBPyConnection, relation: str) -> dict[str, str]:
    return {name: str(kind) for name, kind, *_ in con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()}


# ---------------------------------------------------------------------------------------------- helper columns


def helper_view_sql(table: str, columns: dict[str, str], related: dict[str, dict[str, str]]) -> str:
    """The checked relation: the table plus the helper columns its suite checks (only those whose inputs
    exist; a missing input column is named by the suite's expect_column_to_exist)."""
    helpers = []
    if table == "trajectories":
        helpers = _trajectory_helpers(columns)
    elif table == "turns":
        helpers = _turn_helpers(columns)
    if table in ("turn_profiles", *PIVOT_TABLES) and {"reward_std", "reward_var"} <= set(columns):
        helpers.append("abs(s.reward_std - sqrt(greatest(s.reward_var, 0))) AS std_gap")
    select = ", ".join(["s.*", *helpers])
    if table == "turn_profiles":
        return _with_reward_helpers(select, columns, related["rollout_rewards"])
    if table in PIVOT_TABLES and "turn_id" in columns:
        if "turn_id" not in related["turns"]:
            raise ValueError("pivot contract: the related turns table has no turn_id column")
        return (f"SELECT {select}, coalesce(s.turn_id IN (SELECT turn_id FROM related_turns), false) AS turn_in_turns "
                "FROM contract_source s")
    return f"SELECT {select} FROM contract_source s"


def _trajectory_helpers(columns: dict[str, str]) -> list[str]:
    out = []
    if "messages" in columns:
        roles = ", ".join(_sql_str(r) for r in ROLES)
        role_problem = (f"CASE WHEN m.role IS NULL OR m.role NOT IN ({roles}) THEN 'message ' || (i - 1) || ': role ' || "
                        "coalesce('''' || m.role || '''', 'None') END")
        args_problem = ("CASE WHEN NOT coalesce(list_bool_and(list_transform(m.tool_calls, c -> coalesce(json_valid(c.arguments), false))), true) "
                        "THEN 'message ' || (i - 1) || ': tool call ' || coalesce('''' || list_filter(m.tool_calls, "
                        "c -> NOT coalesce(json_valid(c.arguments), false))[1].name || '''', 'None') || ' arguments are not JSON text' END")
        out += ["len(s.messages) AS n_messages",
                f"list_filter(list_transform(s.messages, (m, i) -> coalesce({role_problem}, {args_problem})), x -> x IS NOT NULL)[1] "
                "AS messages_problem"]
    if "tools" in columns:
        out.append("CASE WHEN s.tools IS NULL THEN NULL WHEN NOT json_valid(s.tools) THEN 'tools is not JSON text' "
                   "WHEN json_type(s.tools) <> 'ARRAY' OR NOT coalesce(list_bool_and(list_transform(json_type(s.tools, '$[*]'), "
                   "t -> t = 'OBJECT')), true) THEN 'tools is not a JSON list of tool schemas' END AS tools_problem")
    return out


def _turn_helpers(columns: dict[str, str]) -> list[str]:
    if not {"turn_id", "trajectory_id", "message_index", "action_kind", "expert_action"} <= set(columns):
        return []  # the suite's expect_column_to_exist names what is missing
    kinds = " ".join(f"WHEN {_sql_str(k)} THEN {_sql_str(v)}" for k, v in ACTION_TYPE_OF_KIND.items())
    action_type = "json_extract_string(s.expert_action, '$.type')"
    names = (f"CASE {action_type} WHEN 'function_call' THEN [json_extract_string(s.expert_action, '$.name')] "
             "WHEN 'function_call_batch' THEN json_extract_string(s.expert_action, '$.calls[*].name') ELSE [] END")
    lacks = (f"({action_type} = 'function_call' AND json_extract_string(s.expert_action, '$.name') IS NULL) OR "
             f"({action_type} = 'function_call_batch' AND coalesce(json_type(s.expert_action, '$.calls'), '') <> 'ARRAY')")
    tool_names = ("s.tool_names IS NOT NULL AND CAST(s.tool_names AS VARCHAR[]) IS DISTINCT FROM names" if "tool_names" in columns
                  else "false")
    problem = f"""CASE
        WHEN s.expert_action IS NULL OR NOT json_valid(s.expert_action) THEN 'expert_action is not JSON text'
        WHEN json_type(s.expert_action) <> 'OBJECT' OR {action_type} IS DISTINCT FROM (CASE s.action_kind {kinds} END)
            THEN 'expert_action type ' || coalesce('''' || {action_type} || '''', 'None') || ' does not match action_kind '
                 || coalesce('''' || s.action_kind || '''', 'None')
        WHEN {lacks} THEN 'expert_action lacks its name/calls'
        WHEN {tool_names} THEN 'tool_names ' || CAST(s.tool_names AS VARCHAR) || ' != the action''s ' || CAST(names AS VARCHAR)
    END"""
    return ["coalesce(s.turn_id = substr(md5(s.trajectory_id || ':' || CAST(s.message_index AS VARCHAR)), 1, 16), false) "
            "AS turn_id_matches",
            f"list_transform([{names}], names -> {problem})[1] AS action_problem"]


def _with_reward_helpers(select: str, profiles: dict[str, str], rewards: dict[str, str]) -> str:
    """k_gap, mean_gap, n_pass_gap and (binary rewards only) var_gap from the profile's own rewards: those of its
    key with sample_index < k (per-sample rows of a larger budget share the key and are not the profile's)."""
    key = list(KEY_COLUMNS["turn_profiles"])
    if "sampling_fp" in profiles:  # profiles of one sampling config count only its samples
        key.append("sampling_fp")
    if not {*key, "k", "reward_mean", "reward_var", "n_pass"} <= set(profiles):
        return f"SELECT {select} FROM contract_source s"  # the suite's expect_column_to_exist names what is missing
    if not {*key, "reward"} <= set(rewards):
        raise ValueError(f"turn_profiles contract: the related rollout_rewards table needs columns {[*key, 'reward']}")
    on = " AND ".join(f"s.{k} IS NOT DISTINCT FROM r.{k}" for k in key)
    below_k = " AND r.sample_index < s.k" if "sample_index" in rewards else ""
    # n_pass counts the rewards that pass (verifiers.base.passes) under the threshold the row records; 1.0 without one
    threshold = "coalesce(s.pass_threshold, 1.0)" if "pass_threshold" in profiles else "1.0"
    return f"""
        WITH taken AS (
            SELECT s.__file, s.__row, count(*) AS n_rewards, avg(r.reward) AS mean_reward,
                   count(*) FILTER (WHERE r.reward > 0 AND r.reward >= {threshold}) AS n_passing,
                   bool_and(r.reward IN (0.0, 1.0)) AS binary_rewards
            FROM contract_source s JOIN related_rollout_rewards r ON {on}{below_k}
            GROUP BY s.__file, s.__row
        )
        SELECT {select},
               coalesce(r.n_rewards, 0) - s.k AS k_gap,
               abs(s.reward_mean - r.mean_reward) AS mean_gap,
               s.n_pass - coalesce(r.n_passing, 0) AS n_pass_gap,
               CASE WHEN r.binary_rewards THEN abs(s.reward_var - s.reward_mean * (1 - s.reward_mean)) END AS var_gap
        FROM contract_source s LEFT JOIN taken r ON s.__file IS NOT DISTINCT FROM r.__file AND s.__row = r.__row"""


# ---------------------------------------------------------------------------------------------- expectations -> SQL


@dataclass
class Rule:
    """One expectation as SQL: `unexpected` is a row predicate, or `unique` the columns that must be unique;
    `error` is set when it cannot be evaluated (a missing column)."""

    columns: list[str]
    unexpected: str | None = None
    unique: list[str] | None = None
    error: str | None = None


TYPE_NAMES = {
    "VARCHAR": {"str", "string", "large_string", "object", "String", "Utf8"},
    "BIGINT": {"int64", "Int64", "int"}, "INTEGER": {"int32", "Int32", "int"}, "SMALLINT": {"int16", "Int16", "int"},
    "TINYINT": {"int8", "Int8", "int"}, "UBIGINT": {"uint64", "UInt64"}, "UINTEGER": {"uint32", "UInt32"},
    "USMALLINT": {"uint16", "UInt16"}, "UTINYINT": {"uint8", "UInt8"},
    "DOUBLE": {"float64", "Float64", "float"}, "FLOAT": {"float32", "Float32", "float"}, "BOOLEAN": {"bool", "boolean"},
}


def compile_expectation(expectation: dict, columns: dict[str, str], params: dict) -> Rule:
    kind, kwargs = expectation["type"], _resolved(expectation["kwargs"], params)
    involved = _involved_columns(kwargs)
    missing = [c for c in involved if c not in columns]
    if kind == "expect_column_to_exist":
        return Rule(involved, error=f"column {missing[0]!r} does not exist" if missing else None)
    if missing:
        return Rule(involved, error=f"column {missing[0]!r} does not exist")
    col = _ident(involved[0]) if involved else None
    missing_value = f"({col} IS NULL{f' OR isnan({col})' if col and columns[involved[0]] in ('DOUBLE', 'FLOAT') else ''})"
    if kind == "expect_column_values_to_not_be_null":
        return Rule(involved, unexpected=missing_value)
    if kind == "expect_column_values_to_be_null":
        return Rule(involved, unexpected=f"NOT {missing_value}")
    if kind == "expect_column_values_to_be_between":
        low, high = (">" if kwargs.get("strict_min") else ">="), ("<" if kwargs.get("strict_max") else "<=")
        bounds = [f"{col} {low} {_literal(kwargs['min_value'])}" if kwargs.get("min_value") is not None else None,
                  f"{col} {high} {_literal(kwargs['max_value'])}" if kwargs.get("max_value") is not None else None]
        inside = " AND ".join(b for b in bounds if b) or "true"
        return Rule(involved, unexpected=f"NOT {missing_value} AND NOT ({inside})")
    if kind == "expect_column_values_to_be_in_set":
        values = ", ".join(_literal(v) for v in kwargs["value_set"])
        return Rule(involved, unexpected=f"NOT {missing_value} AND {col} NOT IN ({values})")
    if kind == "expect_column_values_to_be_in_type_list":
        base = columns[involved[0]].split("(")[0]
        fits = bool(TYPE_NAMES.get(base, {base.lower()}) & set(kwargs["type_list"]))
        return Rule(involved, unexpected="false" if fits else f"NOT {missing_value}")
    if kind == "expect_column_pair_values_a_to_be_greater_than_b":
        a, b = _ident(kwargs["column_A"]), _ident(kwargs["column_B"])
        op = ">=" if kwargs.get("or_equal") else ">"
        # GE's ignore_row_if: rows with both values missing are skipped, or with either under either_value_is_missing
        either = kwargs.get("ignore_row_if") == "either_value_is_missing"
        skipped = f"({a} IS NULL OR {b} IS NULL)" if either else f"({a} IS NULL AND {b} IS NULL)"
        return Rule(involved, unexpected=f"NOT {skipped} AND NOT coalesce({a} {op} {b}, false)")
    if kind in ("expect_column_values_to_be_unique", "expect_compound_columns_to_be_unique"):
        return Rule(involved, unique=involved)
    return Rule(involved, error=f"expectation type {kind} has no SQL form here")


def _involved_columns(kwargs: dict) -> list[str]:
    if "column" in kwargs:
        return [kwargs["column"]]
    if "column_list" in kwargs:
        return list(kwargs["column_list"])
    if "column_A" in kwargs:
        return [kwargs["column_A"], kwargs["column_B"]]
    return []


def _resolved(kwargs: dict, params: dict) -> dict:
    """{"$PARAMETER": name} values replaced by the suite parameter."""
    return {k: params[v["$PARAMETER"]] if isinstance(v, dict) and "$PARAMETER" in v else v for k, v in kwargs.items()}


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_str(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(float(value)) if isinstance(value, float) else str(value)
    return _sql_str(value)


def _signature(kind: str, kwargs: dict) -> str:
    # GE drops kwargs that are None (an open bound) and reports bounds as floats: so does the signature
    def norm(v):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    return kind + json.dumps({k: norm(v) for k, v in kwargs.items() if k != "batch_id" and v is not None},
                             sort_keys=True, default=str)


# ---------------------------------------------------------------------------------------------- counting


def _count_unexpected(con: duckdb.DuckDBPyConnection, rules: list[Rule]) -> tuple[int, list[int]]:
    """Exact unexpected counts: every row predicate in one scan, each uniqueness rule as a hash aggregate."""
    predicates = [(i, r.unexpected) for i, r in enumerate(rules) if r.unexpected and r.error is None and r.unexpected != "false"]
    select = ", ".join(["count(*)"] + [f"count(*) FILTER (WHERE {p})" for _, p in predicates])
    row = con.execute(f"SELECT {select} FROM checked").fetchone()
    counts = [0] * len(rules)
    for (i, _), n in zip(predicates, row[1:]):
        counts[i] = int(n)
    for i, rule in enumerate(rules):
        if rule.unique and rule.error is None:
            counts[i] = _duplicated_rows(con, rule.unique)
    return int(row[0]), counts


def _duplicated_rows(con: duckdb.DuckDBPyConnection, columns: list[str]) -> int:
    """Rows whose key occurs more than once (every copy counts, as in GE); rows whose key is all null are
    ignored. A 64-bit hash keeps the aggregate small; the few candidate keys are then checked exactly."""
    cols = ", ".join(_ident(c) for c in columns)
    some = " OR ".join(f"{_ident(c)} IS NOT NULL" for c in columns)
    return int(con.execute(f"""
        WITH candidates AS (SELECT hash({cols}) AS h FROM checked WHERE {some} GROUP BY 1 HAVING count(*) > 1)
        SELECT coalesce(sum(n), 0) FROM (
            SELECT count(*) AS n FROM checked WHERE ({some}) AND hash({cols}) IN (SELECT h FROM candidates)
            GROUP BY {cols} HAVING count(*) > 1)""").fetchone()[0])


def _failing_rows(con: duckdb.DuckDBPyConnection, rule: Rule) -> list[dict]:
    """Up to SAMPLE_ROWS failing rows (all columns, row identity included) of one rule."""
    if rule.unique:
        cols = ", ".join(_ident(c) for c in rule.unique)
        where = f"({cols}) IN (SELECT ({cols}) FROM checked GROUP BY {cols} HAVING count(*) > 1)"
        order = f"ORDER BY {cols}"
    else:
        where, order = rule.unexpected, ""
    return _fetch_rows(con, f"SELECT * FROM checked WHERE {where} {order} LIMIT {SAMPLE_ROWS}")


def _fetch_rows(con: duckdb.DuckDBPyConnection, query: str) -> list[dict]:
    return con.execute(query).to_arrow_table().to_pylist()


def _failure(table: str, expectation: dict, rule: Rule, count: int, rows: list[dict], gx: dict | None) -> dict:
    kwargs = expectation["kwargs"]
    column = kwargs.get("column") or kwargs.get("column_list") or (
        [kwargs["column_A"], kwargs["column_B"]] if "column_A" in kwargs else None)
    failure = {
        "expectation": expectation["type"],
        "column": column,
        "kwargs": gx["kwargs"] if gx else _resolved(kwargs, DEFAULT_PARAMS),
        "notes": (expectation.get("meta") or {}).get("notes"),
        "unexpected_count": count if (count or gx is None or gx["success"]) else gx.get("unexpected_count"),
        "observed_value": gx.get("observed_value") if gx else None,
        "sample_rows": [_shown(row, table, column) for row in rows] or (gx or {}).get("sample_rows", []),
    }
    if rule.error:
        failure["error"] = rule.error
    elif gx and gx.get("error"):
        failure["error"] = gx["error"]
    return failure


def _shown(row: dict, table: str, column) -> dict:
    """A failing row as shown: its key columns, the checked column(s) and the helper columns."""
    involved = [column] if isinstance(column, str) else list(column or [])
    helpers = [c for c in row if c.endswith(HELPER_SUFFIXES)]
    keep = [c for c in dict.fromkeys([*KEY_COLUMNS.get(table, []), *involved, *helpers]) if c in row]
    return {c: _plain(row[c]) for c in keep}


# ---------------------------------------------------------------------------------------------- Great Expectations


def _gx_on_sample(con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, str], examples: dict[int, list[dict]],
                  params: dict) -> dict:
    """Validate the first GX_SAMPLE_ROWS rows plus the failing rows with the GE suite; results by signature."""
    sample = _sample_table(con, columns, examples)
    frame = _to_pandas(sample)
    validation = _validate(table, frame, params)
    out: dict = {"__rows__": len(frame)}
    for result in validation.results:
        config = result.expectation_config
        kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
        info = result.result or {}
        entry = {"success": bool(result.success), "kwargs": kwargs, "unexpected_count": info.get("unexpected_count"),
                 "observed_value": _plain_json(info.get("observed_value"))}
        if not result.success:
            column = kwargs.get("column") or kwargs.get("column_list")
            indices = info.get("partial_unexpected_index_list") or info.get("unexpected_index_list") or []
            entry["sample_rows"] = [_shown(frame.loc[i].to_dict(), table, column) for i in list(indices)[:SAMPLE_ROWS]]
        exception = result.exception_info if isinstance(result.exception_info, dict) else {}
        if exception.get("raised_exception"):
            entry["error"] = str(exception.get("exception_message"))[:300]
        out[_signature(config.type, kwargs)] = entry
    return out


def _sample_table(con: duckdb.DuckDBPyConnection, columns: dict[str, str], examples: dict[int, list[dict]]) -> pa.Table:
    """The first rows and the failing ones, each row once (by row identity), row identity dropped."""
    shown = [c for c in columns if c not in ROW_ID]
    nested = {c for c, t in columns.items() if t.endswith("[]") or t.startswith(("STRUCT", "MAP"))}
    select = ", ".join(f"CAST(to_json({_ident(c)}) AS VARCHAR) AS {_ident(c)}" if c in nested else _ident(c) for c in shown)
    has_id = all(c in columns for c in ROW_ID)
    ids = {(r.get("__file"), r.get("__row")) for rows in examples.values() for r in rows} if has_id else set()
    first = f"SELECT {select}{', __file, __row' if has_id else ''} FROM checked LIMIT {GX_SAMPLE_ROWS}"
    table = con.execute(first).to_arrow_table()
    if ids:
        con.register("failing_ids", pa.table({"f": [i[0] for i in ids], "r": [i[1] for i in ids]}))
        extra = con.execute(
            f"SELECT {select}, __file, __row FROM checked WHERE (__file, __row) IN (SELECT (f, r) FROM failing_ids)"
        ).to_arrow_table()
        con.unregister("failing_ids")
        seen = set(zip(table.column("__file").to_pylist(), table.column("__row").to_pylist()))
        keep = [(f, r) not in seen for f, r in zip(extra.column("__file").to_pylist(), extra.column("__row").to_pylist())]
        table = pa.concat_tables([table, extra.filter(pa.array(keep, pa.bool_()))])
    return table.drop_columns([c for c in ROW_ID if c in table.column_names])


def _to_pandas(table: pa.Table):
    """Arrow -> pandas for GE: text columns as object dtype (pandas 3 infers a `str` dtype that GE's type check
    does not know; object columns are checked value by value against the suite's "str" type instead)."""
    import numpy as np
    import pandas as pd

    frame = table.to_pandas()
    for name, kind in zip(table.column_names, table.schema.types):
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            frame[name] = frame[name].astype(object)
        elif pa.types.is_integer(kind) and table.column(name).null_count:
            # an integer column with nulls (expert_tokens where the engine scores no likelihood) would become
            # float64 and fail its type check, and GE rejects pandas' nullable Int32 too: object dtype holding
            # numpy integers of the column's width and None passes value by value (SQL checks the real type)
            scalar = np.dtype(kind.to_pandas_dtype()).type
            values = [None if v is None else scalar(v) for v in table.column(name).to_pylist()]
            frame[name] = pd.Series(values, index=frame.index, dtype=object)
    return frame


_CONTEXT_LOCK = threading.Lock()


def prewarm() -> None:
    """Import Great Expectations and build its context in a background thread, so that a run whose first steps do
    other work (ingest) finds GE ready at its first check instead of waiting seconds for the import. Idempotent."""
    threading.Thread(target=_prewarm, name="pivot-contracts-prewarm", daemon=True).start()


def _prewarm() -> None:
    # Best effort: a run stopped mid-import can break the import here; the first contract check builds the context
    # again and raises whatever is really wrong, where it matters.
    try:
        _context()
    except BaseException:
        pass


_CONTEXT: tuple | None = None


def _context():
    global _CONTEXT
    with _CONTEXT_LOCK:  # one context per process, also while prewarm() is still building it
        if _CONTEXT is None:
            _CONTEXT = _build_context()
        return _CONTEXT


def _build_context():
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no network from here
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context, context.data_sources.add_pandas("pivot_contracts")


@functools.cache
def _suite_and_batch_definition(table: str):
    import great_expectations as gx
    from great_expectations.expectations.expectation_configuration import (
        ExpectationConfiguration,
    )

    context, source = _context()
    spec = load_suite_spec(table)
    # every expectation given at construction, not one add_expectation each: add_expectation compares the new one
    # with each already added (quadratic, about half of a suite's build); add_expectation_configuration would
    # upsert by domain and merge e.g. every expect_column_to_exist into one. A suite file lists no duplicates.
    suite = gx.ExpectationSuite(name=spec["name"], expectations=[
        ExpectationConfiguration(type=e["type"], kwargs=e["kwargs"], meta=e.get("meta", {})).to_domain_obj()
        for e in spec["expectations"]])
    suite = context.suites.add(suite)
    batch_definition = source.add_dataframe_asset(name=table).add_batch_definition_whole_dataframe("whole")
    return suite, batch_definition


def _validate(table: str, pandas_frame, params: dict):
    suite, batch_definition = _suite_and_batch_definition(table)
    batch = batch_definition.get_batch(batch_parameters={"dataframe": pandas_frame})
    # SUMMARY carries unexpected counts and the first 20 failing row indices: enough for sample rows.
    return batch.validate(suite, expectation_parameters=params, result_format={"result_format": "SUMMARY"})


# ---------------------------------------------------------------------------------------------- conversion


def _to_arrow(df: Any) -> pa.Table:
    if isinstance(df, pa.Table):
        return df
    try:
        import polars as pl

        if isinstance(df, pl.LazyFrame):
            df = df.collect()
        if isinstance(df, pl.DataFrame):
            return df.to_arrow()
    except ImportError:  # pragma: no cover - polars is a dependency
        pass
    try:
        import pandas as pd

        if isinstance(df, pd.DataFrame):
            return pa.Table.from_pandas(df, preserve_index=False)
    except ImportError:  # pragma: no cover - pandas comes with great_expectations
        pass
    raise TypeError(f"cannot validate a {type(df).__name__}: pass a polars, pyarrow or pandas frame")


def _with_row_id(table: pa.Table) -> pa.Table:
    n = table.num_rows
    return table.append_column("__file", pa.array([""] * n, pa.string())).append_column(
        "__row", pa.array(range(n), pa.int64()))


def _plain(value):
    """JSON-friendly scalars for metadata (numpy -> python, NaN -> None)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _plain_json(value):
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)
