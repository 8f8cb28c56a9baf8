"""Curation over the warehouse's tables, as the assets and the CLI call it (Dagster-free): one selection writing
every pivot set and the selection log, a table's data contract where the table is, a pivot set's export."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pivot_assets.core.catalog import IMPORTED_PROFILES, PIVOT_TABLES, RULE_COMPARISON, SELECTION_LOG, SET_TABLES
from pivot_assets.core.config import PivotConfig, PivotsSection
from pivot_assets.core.warehouse import Warehouse


def select_and_write(wh: Warehouse, pivots: PivotsSection) -> dict[str, int]:
    """Select D_mixed, D_adv, D_cand from the current profiles and write them with the selection log and D_adv
    under every rule (the rule comparison); returns the funnel counts. One selection writes all these tables, so
    they always agree."""
    from pivot_assets.curation.selection import compare_rules, funnel_counts, select_pivots

    profiles, turns = wh.read(profiles_table(pivots)), wh.read("turns")
    _one_imported_model(profiles, pivots)
    result = select_pivots(profiles, turns, pivots)
    for table in PIVOT_TABLES:
        wh.write_table(table, result[table].to_arrow())
    wh.write_table(SELECTION_LOG, result["selection_log"].to_arrow())
    wh.write_table(RULE_COMPARISON, compare_rules(profiles, turns, pivots).to_arrow())
    return funnel_counts(result)


def profiles_table(pivots: PivotsSection) -> str:
    """The profiles selection reads: turn_profiles (sampled) or imported_profiles (pivots.profile_source)."""
    return IMPORTED_PROFILES if pivots.profile_source == "imported" else "turn_profiles"


def _one_imported_model(profiles, pivots: PivotsSection) -> None:
    """Selection compares the turns of one profiling model: imported rows of several models are refused in one line."""
    if pivots.profile_source != "imported":
        return
    models = sorted(set(profiles["policy_fp"].to_list()))
    if len(models) > 1:
        raise ValueError(f"imported_profiles holds the profiles of {len(models)} models ({', '.join(models)}): "
                         "selection takes one model's; give the inputs of one model")


def contract_params(cfg: PivotConfig) -> dict:
    pivots = cfg.pivots
    # an imported profile's k is the source's sample count, not bounded by this project's policy.k
    policy_k = cfg.policy.k if pivots.profile_source == "sampled" else None
    return {"lambda_diff": pivots.lambda_diff, "policy_k": policy_k, "rule": pivots.rule, "band": pivots.band,
            "min_std": pivots.min_std}


CONTRACT_RESULTS_DIR = ".contract_results"  # in the warehouse's local root: the latest result per table


def check_table(wh: Warehouse, table: str, params: dict):
    """Run one table's data contract where the table is: DuckDB over its Parquet files (exact, bounded memory),
    the Great Expectations suite on a bounded sample (contracts.py). A result is kept under its contract key (the
    data versions of the table and its related tables, the suite, the params, the checking code and GE's version):
    a rerun over unchanged tables reads it instead of validating again (seconds per table, mostly GE's)."""
    from pivot_assets.curation.contracts import RELATED_TABLES, ContractResult, check_parquet, contract_key

    names = (table, *RELATED_TABLES.get(table, ()))
    for name in names:
        if not wh.exists(name):
            raise ValueError(f"table {name!r} is not materialized in {wh.root}")
    key = contract_key(table, {name: wh.data_version(name) for name in names}, params)
    kept = wh.root / CONTRACT_RESULTS_DIR / f"{table}-{key}.json"
    if kept.is_file():
        try:
            return ContractResult(**json.loads(kept.read_text(encoding="utf-8")))
        except (ValueError, TypeError):  # unreadable (a torn write elsewhere): validate again
            pass
    result = check_parquet(table, {name: wh.source_glob(name) for name in names}, params=params)
    with wh.atomic_path(kept) as tmp:
        tmp.write_text(json.dumps(dataclasses.asdict(result), default=str), encoding="utf-8")
    for older in kept.parent.glob(f"{table}-*.json"):  # one kept result per table: the folder does not grow
        if older != kept:
            older.unlink(missing_ok=True)
    return result


def holds_contract_results(wh: Warehouse) -> bool:
    """Whether contract results are kept in this warehouse (a rerun's checks likely read them)."""
    kept = wh.root / CONTRACT_RESULTS_DIR
    return kept.is_dir() and any(kept.glob("*.json"))


def check_tables(wh: Warehouse, params: dict, table: str | None = None):
    """Yield (table, ContractResult) for one table, or for every materialized table with a contract."""
    from pivot_assets.curation.contracts import CONTRACT_TABLES

    if table is not None and table not in CONTRACT_TABLES:
        raise ValueError(f"no contract for {table!r} (known: {', '.join(CONTRACT_TABLES)})")
    tables = [table] if table else [t for t in CONTRACT_TABLES if wh.exists(t)]
    if not tables:
        raise ValueError(f"nothing materialized in {wh.root} yet: run `pivot run` first")
    for name in tables:
        yield name, check_table(wh, name, params)


def export_set(wh: Warehouse, pivot_set: str, fmt: str, out: Path, profile_key: str | None = None) -> Path:
    """Write a pivot set as a Hugging Face dataset dir (`hf`) or NeMo-Gym pivot JSONL (`nemo-gym`), streamed from
    the warehouse in batches (exports.stream_pivot_states): neither the set nor the trajectories are loaded.
    `profile_key` names the NeMo-Gym rows' profile object (exports.DEFAULT_PROFILE_KEY when None)."""
    from pivot_assets.curation import exports

    table = SET_TABLES[pivot_set]
    if not wh.exists(table):
        raise ValueError(f"{table} is not materialized yet: run `pivot run --select {table}` first")
    profile_key = exports.check_profile_key(exports.DEFAULT_PROFILE_KEY if profile_key is None else profile_key)
    rewards = wh.source_glob("rollout_rewards") if fmt == "nemo-gym" and wh.exists("rollout_rewards") else None
    states = exports.stream_pivot_states(wh.source_glob(table), wh.source_glob("trajectories"), rewards_path=rewards)
    out = Path(out)
    if fmt == "hf":
        exports.export_hf(states, out)
        return out
    path = out / f"{table}.jsonl" if out.suffix != ".jsonl" else out
    path.parent.mkdir(parents=True, exist_ok=True)
    exports.export_nemo_gym(states, path, profile_key=profile_key)
    return path
