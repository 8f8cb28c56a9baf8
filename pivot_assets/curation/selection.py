"""Pivot selection (Dagster-free): turn profiles -> D_mixed, D_adv, D_cand.

Definitions (PivotRL, arXiv 2603.21383, section 3):
    candidates   = profiled turns whose profile has k >= min_k, or fewer samples whose sampling stopped because
                   its membership was settled (stop_reason settled / posterior: adaptive profiling), all profiled
                   turns when min_k is None; and whose expert action is of one of `action_kinds` (every kind
                   when it is None). k may differ from turn to turn.
    pivots_mixed = candidates with reward_var > 0 (the reference policy's outcome is mixed)
    pivots_adv   = the mixed candidates the selection rule in force (`pivots.rule`) keeps:
                     pivotrl         reward_mean <= lambda_diff (mixed and hard; PivotRL, the default)
                     band            band[0] < reward_mean < band[1] (verl #2791, OpenRLHF dynamic_filtering_range)
                     variance_top_p  ranked by reward_var (then the ranking below), the smallest prefix holding
                                     top_p of their total variance (RAGEN-2)
                     std_min         sqrt(reward_var) >= min_std (OpenRLHF #1270; for continuous rewards)
    pivots_cand  = a seeded random sample of candidates, len(pivots_adv) rows unless cand_size is set
                   (the no-filter ablation); keyed on turn_id, or on the source_turn_id an imported profile
                   carries (ingest/imported_profiles.py)

Each set is filtered by its definition first, then ranked (reward_var desc, then lower reward_mean,
then turn_id), then capped: at most `max_per_trajectory` rows per trajectory (best ranks kept), then at
most `domain_quotas[domain]` rows per listed domain (domains not listed are not capped). Caps apply per
set after its definition, so a hard turn capped out of pivots_mixed by easier high-variance siblings can
still be in pivots_adv; set sizes stay monotone (turns >= profiled >= candidates >= mixed >= adv).
pivots_cand ranks by its seeded random order instead, so the caps keep a random subset.

Nothing disappears silently: `selection_log` holds one row per (turn, set) with kept and the reason a
row was dropped (not_profiled / turn_missing / below_min_k / action_kind_excluded / zero_variance / too_easy /
outside_band / below_variance_mass / below_min_std / over_trajectory_cap / over_domain_quota / not_sampled), and
the rule in force.
"""

from __future__ import annotations


import polars as pl
import pyarrow as pa

from pivot_assets.core.catalog import PIVOT_SETS, SELECTION_LOG_SCHEMA, SET_TABLES, EARLY_STOPS  # noqa: F401  (SET_TABLES: the set -> table names)
from pivot_assets.core.catalog import RULE_COMPARISON_SCHEMA
from pivot_assets.core.config import SELECTION_RULES, PivotsSection
from pivot_assets.core.ids import canonical_json, seeded_digest

REJECT_REASONS = (
    "not_profiled",
    "turn_missing",
    "below_min_k",
    "action_kind_excluded",
    "zero_variance",
    "too_easy",
    "outside_band",
    "below_variance_mass",
    "below_min_std",
    "over_trajectory_cap",
    "over_domain_quota",
    "not_sampled",
)
PROFILE_KEY = ("turn_id", "policy_fp", "verifier_fp")
PROFILE_COLUMNS = ("turn_id", "policy_fp", "verifier_fp", "k", "reward_mean", "reward_var")
# Turn columns the pivot sets carry so exports and SQL need no join back to `turns`.
TURN_COLUMNS = ("trajectory_id", "domain", "message_index", "turn_index", "action_kind", "expert_action", "tool_names")




def select_pivots(profiles: pl.DataFrame, turns: pl.DataFrame, options: PivotsSection | None = None) -> dict[str, pl.DataFrame]:
    """Select the three pivot sets from one (policy_fp, verifier_fp) profile generation.

    Returns {"pivots_mixed", "pivots_adv", "pivots_cand": profile columns + TURN_COLUMNS + selection_rank
    (1 = best) + pivot_set; "selection_log": turn_id, set, kept, reason; "funnel": stage, turns}.
    """
    options = options or PivotsSection()
    log: list[pl.DataFrame] = []
    profiled, candidates = _candidates(profiles, turns, options, log)

    mixed_pool = _reject(candidates, pl.col("reward_var") > 0, "zero_variance", "mixed", log)
    mixed = _cap_and_rank(_rank_by_difficulty(mixed_pool), options, "mixed", log)
    adv = _select_adv(candidates, options, log)
    cand_size = len(adv) if options.cand_size is None else options.cand_size
    cand = _sample_candidates(candidates, cand_size, options, log)

    selection_log = pl.concat(log, how="vertical") if log else pl.from_arrow(SELECTION_LOG_SCHEMA.empty_table())
    selection_log = selection_log.with_columns(pl.lit(options.rule, pl.Utf8).alias("rule"))
    funnel = pl.DataFrame(
        {
            "stage": ["turns", "profiled", "candidates", "mixed", "adv", "cand"],
            "turns": [turns.height, profiled.height, candidates.height, mixed.height, adv.height, cand.height],
        }
    )
    return {
        "pivots_mixed": mixed,
        "pivots_adv": adv,
        "pivots_cand": cand,
        "selection_log": selection_log,
        "funnel": funnel,
    }


def compare_rules(profiles: pl.DataFrame, turns: pl.DataFrame, options: PivotsSection | None = None) -> pl.DataFrame:
    """D_adv under each selection rule with the parameters of `options` (caps included), beside the set of the
    pivotrl rule: one row per rule (RULE_COMPARISON_SCHEMA), for `pivot sql selection_rules`."""
    options = options or PivotsSection()
    _, candidates = _candidates(profiles, turns, options, [])
    sets = {rule: _select_adv(candidates, options.model_copy(update={"rule": rule}), []) for rule in SELECTION_RULES}
    pivotrl = set(sets["pivotrl"]["turn_id"])
    rows = [{"rule": rule, "parameters": canonical_json({SELECTION_RULES[rule]: getattr(options, SELECTION_RULES[rule])}),
             "in_force": rule == options.rule, "pivots": adv.height,
             "overlap_with_pivotrl": len(pivotrl & set(adv["turn_id"])),
             "mean_reward": adv["reward_mean"].mean(), "mean_variance": adv["reward_var"].mean()}
            for rule, adv in sets.items()]
    return pl.from_arrow(pa.Table.from_pylist(rows, schema=RULE_COMPARISON_SCHEMA))


def funnel_counts(result: dict[str, pl.DataFrame]) -> dict[str, int]:
    """The funnel frame of a select_pivots result as {stage: count}."""
    return dict(zip(result["funnel"]["stage"].to_list(), result["funnel"]["turns"].to_list()))


def rejection_counts(selection_log: pl.DataFrame) -> dict[tuple[str, str], int]:
    """{(set, reason): rows dropped}, for metadata and reports."""
    dropped = selection_log.filter(~pl.col("kept")).group_by("set", "reason").len()
    return {(r["set"], r["reason"]): r["len"] for r in dropped.iter_rows(named=True)}


# -- the selection rules (D_adv) -------------------------------------------------------------------


def _select_adv(candidates: pl.DataFrame, options: PivotsSection, log: list[pl.DataFrame]) -> pl.DataFrame:
    """D_adv: the mixed candidates the rule in force keeps, ranked, then capped."""
    pool = _reject(candidates, pl.col("reward_var") > 0, "zero_variance", "adv", log)
    keep, reason = RULE_TESTS[options.rule](pool, options)
    return _cap_and_rank(_rank_by_difficulty(_reject(pool, keep, reason, "adv", log)), options, "adv", log)


def _pivotrl(pool: pl.DataFrame, options: PivotsSection) -> tuple[pl.Expr, str]:
    return pl.col("reward_mean") <= options.lambda_diff, "too_easy"


def _band(pool: pl.DataFrame, options: PivotsSection) -> tuple[pl.Expr, str]:
    low, high = options.band
    return (pl.col("reward_mean") > low) & (pl.col("reward_mean") < high), "outside_band"


def _variance_top_p(pool: pl.DataFrame, options: PivotsSection) -> tuple[pl.Expr, str]:
    """In rank order (variance first), a turn is in the prefix while the variance ranked before it is short of
    top_p of the pool's total: the last turn kept is the one that reaches it."""
    ranked = _rank_by_difficulty(pool)
    before = ranked["reward_var"].cum_sum() - ranked["reward_var"]
    inside = ranked.filter(before < options.top_p * ranked["reward_var"].sum())["turn_id"]
    return pl.col("turn_id").is_in(inside.to_list()), "below_variance_mass"


def _std_min(pool: pl.DataFrame, options: PivotsSection) -> tuple[pl.Expr, str]:
    return pl.col("reward_var").sqrt() >= options.min_std, "below_min_std"


# rule -> (mixed pool, options) -> (what D_adv keeps, the reason a dropped row is logged with)
RULE_TESTS = {"pivotrl": _pivotrl, "band": _band, "variance_top_p": _variance_top_p, "std_min": _std_min}
assert set(RULE_TESTS) == set(SELECTION_RULES), "every rule config.py offers has a definition here"


def adv_contract_bounds(params: dict) -> dict:
    """The row-wise bounds the D_adv contract checks under the rule in `params` (rule, lambda_diff, band,
    min_std): reward_mean within [adv_mean_min, adv_mean_max] (strict both ends when adv_mean_strict) and
    reward_std >= adv_min_std. variance_top_p has no row-wise bound: its cut depends on the whole pool."""
    rule = params.get("rule", "pivotrl")
    low, high, strict = None, 1.0, False
    if rule == "pivotrl":
        high = params["lambda_diff"]
    elif rule == "band":
        (low, high), strict = params["band"], True
    min_std = params["min_std"] if rule == "std_min" else 0.0
    return {"adv_mean_min": low, "adv_mean_max": high, "adv_mean_strict": strict, "adv_min_std": min_std}


# -- steps -----------------------------------------------------------------------------------------


def _check_inputs(profiles: pl.DataFrame, turns: pl.DataFrame) -> None:
    missing = [c for c in PROFILE_COLUMNS if c not in profiles.columns]
    if missing:
        raise ValueError(f"turn_profiles lacks columns {missing}")
    missing = [c for c in ("turn_id", *TURN_COLUMNS) if c not in turns.columns]
    if missing:
        raise ValueError(f"turns lacks columns {missing}")
    fingerprints = [c for c in ("policy_fp", "sampling_fp", "verifier_fp") if c in profiles.columns]
    generations = profiles.select(fingerprints).unique()
    if generations.height > 1:
        # Mixing generations would put one turn in a set twice with different stats; the caller picks one.
        raise ValueError(
            f"select_pivots takes profiles of one ({', '.join(fingerprints)}); got {generations.height}: "
            "filter turn_profiles to the current fingerprints first"
        )
    duplicated = profiles.filter(pl.col("turn_id").is_duplicated())
    if duplicated.height:
        raise ValueError(f"turn_profiles has {duplicated.height} rows with a duplicated turn_id, e.g. {duplicated['turn_id'][0]!r}")


def _candidates(profiles: pl.DataFrame, turns: pl.DataFrame, options: PivotsSection,
                log: list[pl.DataFrame]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(profiled turns with their turn columns, the candidates among them: min_k and action_kinds applied)."""
    _check_inputs(profiles, turns)
    profiled = _join_turns(profiles, turns, log)
    return profiled, _apply_action_kinds(_apply_min_k(profiled, options.min_k, log), options.action_kinds, log)


def _log(frame: pl.DataFrame, pivot_set: str, kept: bool, reason: str | None) -> pl.DataFrame:
    return frame.select(
        pl.col("turn_id").cast(pl.Utf8),
        pl.lit(pivot_set, pl.Utf8).alias("set"),
        pl.lit(kept).alias("kept"),
        pl.lit(reason, pl.Utf8).alias("reason"),
    )


def _join_turns(profiles: pl.DataFrame, turns: pl.DataFrame, log: list[pl.DataFrame]) -> pl.DataFrame:
    """Profiles with their turn columns; profiles of unknown turns and unprofiled turns are logged."""
    turn_part = turns.select("turn_id", *TURN_COLUMNS)
    profile_part = profiles.drop([c for c in TURN_COLUMNS if c in profiles.columns])
    orphans = profile_part.join(turn_part, on="turn_id", how="anti")
    unprofiled = turn_part.join(profile_part, on="turn_id", how="anti")
    for pivot_set in PIVOT_SETS:
        log.append(_log(orphans, pivot_set, False, "turn_missing"))
        log.append(_log(unprofiled, pivot_set, False, "not_profiled"))
    return profile_part.join(turn_part, on="turn_id", how="inner")


def _apply_min_k(profiled: pl.DataFrame, min_k: int | None, log: list[pl.DataFrame]) -> pl.DataFrame:
    """k >= min_k, or a turn adaptive profiling stopped early because its membership was settled."""
    if min_k is None:
        return profiled
    enough = pl.col("k") >= min_k
    if "stop_reason" in profiled.columns:
        enough = enough | pl.col("stop_reason").is_in(list(EARLY_STOPS))
    return _reject_for_every_set(profiled, enough, "below_min_k", log)


def _apply_action_kinds(profiled: pl.DataFrame, kinds: list[str] | None, log: list[pl.DataFrame]) -> pl.DataFrame:
    """Keep only turns whose expert action is of the listed kinds (e.g. no replies without a judge)."""
    if kinds is None:
        return profiled
    return _reject_for_every_set(profiled, pl.col("action_kind").is_in(kinds), "action_kind_excluded", log)


def _reject_for_every_set(frame: pl.DataFrame, keep: pl.Expr, reason: str, log: list[pl.DataFrame]) -> pl.DataFrame:
    for pivot_set in PIVOT_SETS:
        _reject(frame, keep, reason, pivot_set, log)
    return frame.filter(keep.fill_null(False))


def _reject(frame: pl.DataFrame, keep: pl.Expr, reason: str, pivot_set: str, log: list[pl.DataFrame]) -> pl.DataFrame:
    """Rows passing `keep`; the others go to the log with `reason` (null tests count as failing)."""
    keep = keep.fill_null(False)
    log.append(_log(frame.filter(~keep), pivot_set, False, reason))
    return frame.filter(keep)


def _rank_by_difficulty(frame: pl.DataFrame) -> pl.DataFrame:
    """Best first: most mixed outcome (variance desc), then harder (lower mean), then turn_id for ties."""
    return frame.sort(["reward_var", "reward_mean", "turn_id"], descending=[True, False, False])


def _cap_and_rank(ordered: pl.DataFrame, options: PivotsSection, pivot_set: str, log: list[pl.DataFrame]) -> pl.DataFrame:
    """Apply the per-trajectory cap, then per-domain quotas, in the given (best-first) row order."""
    ordered = ordered.with_row_index("_order")
    if options.max_per_trajectory is not None:
        within = pl.col("_order").rank("ordinal").over("trajectory_id")
        ordered = _reject(ordered, within <= options.max_per_trajectory, "over_trajectory_cap", pivot_set, log)
    if options.domain_quotas:
        quotas = pl.DataFrame(
            {"domain": list(options.domain_quotas), "_quota": list(options.domain_quotas.values())},
            schema={"domain": ordered.schema["domain"], "_quota": pl.Int64},
        )
        ordered = ordered.join(quotas, on="domain", how="left", maintain_order="left")
        within = pl.col("_order").rank("ordinal").over("domain")
        ordered = _reject(ordered, pl.col("_quota").is_null() | (within <= pl.col("_quota")), "over_domain_quota", pivot_set, log)
        ordered = ordered.drop("_quota")
    selected = ordered.sort("_order").drop("_order")
    log.append(_log(selected, pivot_set, True, None))
    return selected.with_columns(
        pl.int_range(1, selected.height + 1, dtype=pl.Int64).alias("selection_rank"),
        pl.lit(pivot_set).alias("pivot_set"),
    )


def sample_key(seed: int, turn_id: str) -> str:
    """Seeded sort key for the candidate sample: stable across row order, processes and polars versions."""
    return seeded_digest(seed, turn_id).hex()


def _draw_ids(candidates: pl.DataFrame) -> pl.Series:
    """The ids D_cand's draw is keyed on: a turn's own, or the turn id its imported profile's row names
    (imported_profiles.source_turn_id), so a pool exported and imported again draws the same turns."""
    if "source_turn_id" not in candidates.columns:
        return candidates["turn_id"]
    return candidates.select(pl.coalesce("source_turn_id", "turn_id"))["source_turn_id"]


def _sample_candidates(candidates: pl.DataFrame, size: int, options: PivotsSection, log: list[pl.DataFrame]) -> pl.DataFrame:
    keys = [sample_key(options.seed, t) for t in _draw_ids(candidates).to_list()]
    shuffled = candidates.with_columns(pl.Series("_key", keys, dtype=pl.Utf8)).sort("_key").drop("_key")
    sink: list[pl.DataFrame] = []
    capped = _cap_and_rank(shuffled, options, "cand", sink)
    # _cap_and_rank logs its survivors as kept; only the first `size` of them are really sampled.
    log.extend(frame.filter(~pl.col("kept")) for frame in sink)
    sampled = capped.filter(pl.col("selection_rank") <= size)
    log.append(_log(capped.filter(pl.col("selection_rank") > size), "cand", False, "not_sampled"))
    log.append(_log(sampled, "cand", True, None))
    return sampled
