"""The table catalog: every warehouse table's Arrow schema, key, contract and blocking flag, in one place.

Stages write their tables with these schemas, the contracts (curation/contracts.py) check them by these
keys, and the Dagster shell reads which checks block. Also where the shipped SQL and contract files
are: inside the package in a wheel (pyproject maps sql/ and data_contracts/ there), the top-level
folders of the design card in a checkout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

_PACKAGE = Path(__file__).resolve().parents[1]


def bundled_dir(name: str) -> Path:
    """`sql` or `data_contracts`: pivot_assets/<name> in an installed wheel, else <checkout>/<name>."""
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


SQL_DIR = bundled_dir("sql")
CONTRACTS_DIR = bundled_dir("data_contracts")

# -- canonical shapes as Arrow types (core/shapes.py describes them in words) ------------------------
# acceptable: canonical JSON of {argument: [accepted values]} (BFCL's possible answers), null when the source has none
TOOL_CALL_TYPE = pa.struct([("id", pa.string()), ("name", pa.string()), ("arguments", pa.string()),
                            ("acceptable", pa.string())])
MESSAGE_TYPE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("reasoning", pa.string()),
        ("tool_calls", pa.list_(TOOL_CALL_TYPE)),
        ("tool_call_id", pa.string()),
    ]
)

TRAJECTORY_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("source", pa.string()),
        ("record", pa.int64()),
        ("source_format", pa.string()),
        ("domain", pa.string()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("tools", pa.string()),
        ("outcome_reward", pa.float64()),
        ("conversation_id", pa.string()),  # source-conversation group key (rule: ingest/formats/)
        # canonical JSON {kind, ...} of an executable source (environments/), null for the others
        ("environment", pa.string()),
    ]
)
QUARANTINE_SCHEMA = pa.schema(
    [("source", pa.string()), ("record", pa.int64()), ("reason", pa.string()), ("raw", pa.string())]
)
TURNS_SCHEMA = pa.schema(
    [
        ("turn_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("domain", pa.string()),
        ("message_index", pa.int64()),
        ("turn_index", pa.int64()),
        ("action_kind", pa.string()),
        ("expert_action", pa.string()),
        ("tool_names", pa.list_(pa.string())),
    ]
)
ROLLOUTS_SCHEMA = pa.schema(
    [
        ("turn_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("policy_fp", pa.string()),
        ("sampling_fp", pa.string()),
        ("sample_index", pa.int32()),
        ("completion", pa.string()),
        ("n_prompt_tokens", pa.int32()),
        ("n_completion_tokens", pa.int32()),
        ("finish_reason", pa.string()),
    ]
)
REWARDS_SCHEMA = pa.schema(
    [
        ("turn_id", pa.string()),
        ("policy_fp", pa.string()),
        ("sampling_fp", pa.string()),
        ("sample_index", pa.int32()),
        ("verifier_fp", pa.string()),
        ("domain", pa.string()),
        ("reward", pa.float64()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("action", pa.string()),  # the parsed candidate action (canonical JSON), null when unparseable
    ]
)
# The expert action's log-likelihood under the reference policy (policies/base.ActionLikelihood), one row per turn
# and (policy, sampling): written by generation beside the samples, shown per turn in turn_profiles.
EXPERT_LIKELIHOODS_SCHEMA = pa.schema(
    [
        ("turn_id", pa.string()),
        ("policy_fp", pa.string()),
        ("sampling_fp", pa.string()),
        ("expert_logprob", pa.float64()),
        ("expert_tokens", pa.int32()),
    ]
)
# Why a turn's sampling stopped (turn_profiles.stop_reason, profiling/adaptive.py): k_reached (policy.k samples),
# settled (no completion of its remaining samples can change its pivot-set membership), posterior (the Beta
# posterior says that changes with probability < epsilon), unsettled (fewer than k samples that the rule in force
# does not settle: after a verifier or rule change; `rollouts` tops them up).
STOP_REASONS = ("k_reached", "settled", "posterior", "unsettled")
EARLY_STOPS = ("settled", "posterior")  # stopped before k because the rule vouches for the membership
# Turns the profiler left out, with why (profiling/prompt_guard.py: a prompt longer than policy.max_prompt_tokens).
SKIPPED_TURNS = "skipped_turns"
SKIPPED_TURNS_SCHEMA = pa.schema([("turn_id", pa.string()), ("trajectory_id", pa.string()), ("reason", pa.string()),
                                  ("n_prompt_tokens", pa.int64()), ("max_prompt_tokens", pa.int64())])
# Profiles a pivot row arrived with (ingest/imported_profiles.py; pivots.profile_source picks them or the sampled
# turn_profiles), one row per turn: policy_fp "imported:<model>", verifier_fp "imported", sampling_fp null;
# source / source_fp / record: the input file, its content fingerprint and the row; source_turn_id: the turn id the
# row names (metadata.turn_id of this project's export), null when it names none; rewards: per-sample rewards when
# the row lists them; n_distinct_actions null (a row states no sampled actions).
IMPORTED_PROFILES = "imported_profiles"
IMPORTED_PROFILES_SCHEMA = pa.schema(
    [("turn_id", pa.string()), ("trajectory_id", pa.string()), ("domain", pa.string()), ("policy_fp", pa.string()),
     ("sampling_fp", pa.string()), ("verifier_fp", pa.string()), ("k", pa.int32()), ("reward_mean", pa.float64()),
     ("reward_var", pa.float64()), ("reward_std", pa.float64()), ("n_pass", pa.int32()),
     ("n_distinct_actions", pa.int32()), ("rewards", pa.list_(pa.float64())), ("profile_source", pa.string()),
     ("model", pa.string()), ("source", pa.string()), ("source_fp", pa.string()), ("record", pa.int64()),
     ("source_turn_id", pa.string())]
)
# rule: the selection rule in force (pivots.rule), the same on every row of one selection
SELECTION_LOG_SCHEMA = pa.schema(
    [("turn_id", pa.string()), ("set", pa.string()), ("kept", pa.bool_()), ("reason", pa.string()),
     ("rule", pa.string())]
)
# D_adv under each selection rule (selection.compare_rules, written beside the pivot sets by the same selection; not
# an asset of its own): parameters is canonical JSON of the rule's parameter as configured, in_force marks pivots.rule.
RULE_COMPARISON = "selection_rule_comparison"
RULE_COMPARISON_SCHEMA = pa.schema(
    [("rule", pa.string()), ("parameters", pa.string()), ("in_force", pa.bool_()), ("pivots", pa.int64()),
     ("overlap_with_pivotrl", pa.int64()), ("mean_reward", pa.float64()), ("mean_variance", pa.float64())]
)

# Refresh rounds (refresh/rounds.py): one row per (round, turn of the pool). policy_fp: the round's policy (the
# checkpoint it profiles with); profiled_by: the policy whose samples the row's stats are (another round's when the
# turn was skipped and its profile carried forward). bucket: adv | mixed | easy | unsolved (REFRESH_BUCKETS).
REFRESH_PROFILES = "refresh_profiles"
REFRESH_BUCKETS = ("adv", "mixed", "easy", "unsolved")
REFRESH_PROFILES_SCHEMA = pa.schema(
    [("round", pa.int32()), ("turn_id", pa.string()), ("trajectory_id", pa.string()), ("domain", pa.string()),
     ("policy_fp", pa.string()), ("profiled_by", pa.string()), ("verifier_fp", pa.string()), ("k", pa.int32()),
     ("n_pass", pa.int32()), ("reward_mean", pa.float64()), ("reward_var", pa.float64()), ("stop_reason", pa.string()),
     ("bucket", pa.string()), ("skipped", pa.bool_()), ("replayed", pa.bool_()), ("trained", pa.bool_())]
)
# What each round spent, per phase (profiling | grpo_generation | evaluation): samples (one assistant turn each) and
# generated tokens; the GRPO figures the end-to-end estimate of sql/rollout_budget.sql reads.
REFRESH_BUDGET = "refresh_budget"
BUDGET_PHASES = ("profiling", "grpo_generation", "evaluation")
REFRESH_BUDGET_SCHEMA = pa.schema(
    [("round", pa.int32()), ("phase", pa.string()), ("samples", pa.int64()), ("generated_tokens", pa.int64()),
     ("grpo_steps", pa.int32()), ("prompts_per_step", pa.int32()), ("num_generations", pa.int32()),
     ("policy_fp", pa.string())]
)

# pivot_eval (evaluation/heldout.py writes it): one row per (policy, evaluation set), its accuracy with a 95% interval
# and the paired difference against the reference; arm and seed are null outside the ablation. Mirrors
# heldout.EVAL_SCHEMA_FIELDS (a test holds the two equal: the stage below core cannot be imported here).
PIVOT_EVAL = "pivot_eval"
PIVOT_EVAL_SCHEMA = pa.schema(
    [("policy", pa.string()), ("arm", pa.string()), ("seed", pa.int64()), ("model_fp", pa.string()),
     ("eval_key", pa.string()), ("eval_set", pa.string()), ("n", pa.int64()), ("n_conversations", pa.int64()),
     ("n_seeds", pa.int64()), ("k", pa.int64()), ("accuracy", pa.float64()), ("ci_low", pa.float64()),
     ("ci_high", pa.float64()), ("delta", pa.float64()), ("delta_low", pa.float64()), ("delta_high", pa.float64()),
     ("backend", pa.string()), ("dtype", pa.string()), ("device", pa.string()), ("seconds", pa.float64())]
)

# -- pivot sets ------------------------------------------------------------------------------------
PIVOT_SETS = ("mixed", "adv", "cand")
SET_TABLES = {name: f"pivots_{name}" for name in PIVOT_SETS}
PIVOT_TABLES = tuple(SET_TABLES.values())
SELECTION_LOG = "pivot_selection_log"


@dataclass(frozen=True)
class Table:
    """One warehouse table: its key, its schema where it has a fixed one, and its data contract."""

    name: str
    key: tuple[str, ...]
    schema: pa.Schema | None = None
    contract: bool = True  # a suite data_contracts/<name>.json checks it
    blocking: bool = False  # a failed contract stops everything downstream
    related: tuple[str, ...] = field(default=())  # other tables its contract reads

    @property
    def contract_path(self) -> Path:
        return CONTRACTS_DIR / f"{self.name}.json"


_PROFILE_KEY = ("turn_id", "policy_fp", "verifier_fp")
TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        Table("trajectories", ("trajectory_id",), TRAJECTORY_SCHEMA),
        Table("quarantine", ("source", "record"), QUARANTINE_SCHEMA),
        Table("turns", ("turn_id",), TURNS_SCHEMA),
        Table("rollouts", ("turn_id", "policy_fp", "sampling_fp", "sample_index"), ROLLOUTS_SCHEMA),
        Table("rollout_rewards", ("turn_id", "policy_fp", "sampling_fp", "sample_index", "verifier_fp"),
              REWARDS_SCHEMA),
        Table("expert_likelihoods", ("turn_id", "policy_fp", "sampling_fp"), EXPERT_LIKELIHOODS_SCHEMA, contract=False),
        Table("turn_profiles", _PROFILE_KEY, related=("rollout_rewards",)),
        *(Table(name, _PROFILE_KEY, blocking=True, related=("turns",)) for name in PIVOT_TABLES),
        Table(SELECTION_LOG, ("turn_id", "set"), SELECTION_LOG_SCHEMA, contract=False),
        Table(SKIPPED_TURNS, ("turn_id",), SKIPPED_TURNS_SCHEMA, contract=False),
        Table(IMPORTED_PROFILES, _PROFILE_KEY, IMPORTED_PROFILES_SCHEMA, contract=False),
        Table(RULE_COMPARISON, ("rule",), RULE_COMPARISON_SCHEMA, contract=False),
        Table(REFRESH_PROFILES, ("round", "turn_id"), REFRESH_PROFILES_SCHEMA, contract=False),
        Table(REFRESH_BUDGET, ("round", "phase"), REFRESH_BUDGET_SCHEMA, contract=False),
        Table(PIVOT_EVAL, ("policy", "eval_set"), PIVOT_EVAL_SCHEMA, contract=False),
    )
}
CONTRACT_TABLES = tuple(name for name, t in TABLES.items() if t.contract)
BLOCKING_TABLES = tuple(name for name, t in TABLES.items() if t.blocking)
KEY_COLUMNS = {name: list(t.key) for name, t in TABLES.items()}
RELATED_TABLES = {name: t.related for name, t in TABLES.items() if t.related}
