"""Data contracts: clean tables pass; corrupted tables fail, naming the expectation with sample rows."""

from __future__ import annotations

import json

import polars as pl
import pytest

from pivot_assets.curation.contracts import BLOCKING_TABLES, CONTRACT_TABLES, load_suite_spec, run_contract
from pivot_assets.core.config import PivotsSection
from pivot_assets.curation.selection import select_pivots
from pivot_assets.core.ids import canonical_json, trajectory_id, turn_id
from pivot_assets.core.shapes import action_from_message, action_tool_names

K = 4
# Per turn: the rewards of its K samples (binary except the last trajectory's second turn).
REWARDS = [[1, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0], [1.0, 0.5, 0.5, 0.0], [1, 1, 0, 1]]
TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order",
                                           "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}]


def _message(role, content=None, tool_calls=None, tool_call_id=None):
    return {"role": role, "content": content, "reasoning": None, "tool_calls": tool_calls, "tool_call_id": tool_call_id}


def _conversation(n: int) -> list[dict]:
    call = {"id": f"c{n}", "name": "get_order", "arguments": canonical_json({"order_id": f"#{n}"})}
    return [
        _message("system", "You are a store agent."),
        _message("user", f"Where is order #{n}?"),
        _message("assistant", None, tool_calls=[call]),
        _message("tool", canonical_json({"status": "shipped"}), tool_call_id=f"c{n}"),
        _message("assistant", "It has shipped."),
    ]


def build_world() -> dict[str, pl.DataFrame]:
    """A small consistent warehouse: 3 trajectories, 6 turns, K rewarded samples per turn, profiles, pivots."""
    trajectories, turns, rollouts, rewards, profiles = [], [], [], [], []
    for n in range(3):
        messages = _conversation(n)
        traj = trajectory_id(messages, TOOLS)
        trajectories.append({"trajectory_id": traj, "source": "handmade", "record": str(n), "source_format": "openai_chat",
                             "domain": "retail", "messages": messages, "tools": canonical_json(TOOLS), "outcome_reward": 1.0,
                             "conversation_id": traj})
        for turn_index, index in enumerate(i for i, m in enumerate(messages) if m["role"] == "assistant"):
            kind, action = action_from_message(messages[index])
            tid = turn_id(traj, index)
            turns.append({"turn_id": tid, "trajectory_id": traj, "domain": "retail", "message_index": index,
                          "turn_index": turn_index, "action_kind": kind, "expert_action": canonical_json(action),
                          "tool_names": action_tool_names(action)})
            sample_rewards = [float(r) for r in REWARDS[len(profiles)]]
            for s, reward in enumerate(sample_rewards):
                key = {"turn_id": tid, "policy_fp": "pol", "sampling_fp": "samp", "sample_index": s}
                rollouts.append({**key, "completion": "...", "n_completion_tokens": 12, "finish_reason": "stop"})
                rewards.append({**key, "verifier_fp": "ver", "reward": reward, "reason": "ok", "action": canonical_json(action)})
            mean = sum(sample_rewards) / K
            var = sum((r - mean) ** 2 for r in sample_rewards) / K
            profiles.append({"turn_id": tid, "trajectory_id": traj, "domain": "retail", "policy_fp": "pol", "sampling_fp": "samp", "verifier_fp": "ver",
                             "k": K, "reward_mean": mean, "reward_var": var, "reward_std": var ** 0.5,
                             "n_pass": sum(r == 1.0 for r in sample_rewards), "n_distinct_actions": 1,
                             "expert_logprob": -12.5, "expert_tokens": 20, "stop_reason": "k_reached", "p_flip": 0.0})
    world = {
        "trajectories": pl.DataFrame(trajectories),
        "quarantine": pl.DataFrame({"source": ["handmade"], "record": ["9"], "reason": ["no assistant message"], "raw": ["{}"]}),
        "turns": pl.DataFrame(turns),
        "rollouts": pl.DataFrame(rollouts),
        "rollout_rewards": pl.DataFrame(rewards),
        "turn_profiles": pl.DataFrame(profiles),
    }
    selected = select_pivots(world["turn_profiles"], world["turns"], PivotsSection(lambda_diff=0.6))
    world.update({name: selected[name] for name in BLOCKING_TABLES})
    return world


RELATED = {"turn_profiles": ("rollout_rewards",), "pivots_mixed": ("turns",), "pivots_adv": ("turns",), "pivots_cand": ("turns",)}


def check(world, table, frame=None):
    related = {name: world[name] for name in RELATED.get(table, ())}
    return run_contract(table, world[table] if frame is None else frame, related=related, params={"lambda_diff": 0.6})


@pytest.fixture(scope="module")
def world():
    return build_world()


def failed(result) -> dict[str, dict]:
    return {f"{f['expectation']}:{f['column']}": f for f in result.failures}


def test_every_table_has_a_suite_file():
    """... with expectations, none listed twice (the GE suite is built from the list as it is: contracts.py)."""
    for table in CONTRACT_TABLES:
        expectations = load_suite_spec(table)["expectations"]
        assert expectations, table
        signatures = [json.dumps([e["type"], e["kwargs"]], sort_keys=True) for e in expectations]
        assert len(set(signatures)) == len(signatures), table


def test_clean_tables_pass(world):
    assert world["pivots_adv"].height >= 2 and world["pivots_mixed"].height > world["pivots_adv"].height
    for table in CONTRACT_TABLES:
        result = check(world, table)
        assert result.success, result.summary()
        assert result.statistics["evaluated_expectations"] == len(load_suite_spec(table)["expectations"])


def test_reward_out_of_range_fails_with_sample_row(world):
    bad = world["rollout_rewards"].with_columns(
        pl.when(pl.col("sample_index") == 2).then(2.0).otherwise(pl.col("reward")).alias("reward"))
    result = check(world, "rollout_rewards", bad)
    assert not result.success
    failure = failed(result)["expect_column_values_to_be_between:reward"]
    assert failure["unexpected_count"] == 6
    assert failure["sample_rows"][0]["reward"] == 2.0 and failure["sample_rows"][0]["sample_index"] == 2
    assert "expect_column_values_to_be_between on reward" in result.summary()


def test_duplicated_key_fails(world):
    bad = pl.concat([world["rollout_rewards"], world["rollout_rewards"].head(1)])
    failure = failed(check(world, "rollout_rewards", bad))[
        "expect_compound_columns_to_be_unique:['turn_id', 'policy_fp', 'sampling_fp', 'sample_index', 'verifier_fp']"]
    assert failure["unexpected_count"] == 2 and len(failure["sample_rows"]) == 2
    bad_turns = pl.concat([world["turns"], world["turns"].tail(1)])
    assert "expect_column_values_to_be_unique:turn_id" in failed(check(world, "turns", bad_turns))


def test_pivot_whose_turn_is_missing_fails(world):
    missing = world["pivots_adv"]["turn_id"][0]
    world_without = {**world, "turns": world["turns"].filter(pl.col("turn_id") != missing)}
    result = check(world_without, "pivots_adv")
    failure = failed(result)["expect_column_values_to_be_in_set:turn_in_turns"]
    assert failure["unexpected_count"] == 1 and failure["sample_rows"][0]["turn_id"] == missing


def test_wrong_k_fails(world):
    rewards = world["rollout_rewards"].filter(~((pl.col("sample_index") == 3) & (pl.col("turn_id") == world["turns"]["turn_id"][0])))
    result = check({**world, "rollout_rewards": rewards}, "turn_profiles")
    failure = failed(result)["expect_column_values_to_be_between:k_gap"]
    assert failure["unexpected_count"] == 1 and failure["sample_rows"][0]["k_gap"] == -1


def test_variance_inconsistent_with_binary_mean_fails(world):
    bad = world["turn_profiles"].with_columns((pl.col("reward_var") * 0.5).alias("reward_var"), (pl.col("reward_std") * 0.5 ** 0.5).alias("reward_std"))
    result = check(world, "turn_profiles", bad)
    failure = failed(result)["expect_column_values_to_be_between:var_gap"]
    # Turns with var 0 stay consistent; the non-binary turn has var_gap null (not checked).
    assert failure["unexpected_count"] == 3


def test_adv_pivot_with_high_mean_fails(world):
    bad = world["pivots_adv"].with_columns(pl.when(pl.col("selection_rank") == 1).then(0.9).otherwise(pl.col("reward_mean")).alias("reward_mean"))
    result = check(world, "pivots_adv", bad)
    failure = failed(result)["expect_column_values_to_be_between:reward_mean"]
    assert failure["kwargs"]["max_value"] == 0.6 and failure["sample_rows"][0]["reward_mean"] == 0.9
    assert "D_adv" in failure["notes"]
    # The same row is fine in D_mixed, whose definition has no mean bound.
    assert check(world, "pivots_mixed", bad.with_columns(pl.lit("mixed").alias("pivot_set"))).success


def test_zero_variance_mixed_pivot_and_missing_column_fail(world):
    bad = world["pivots_mixed"].with_columns(pl.lit(0.0).alias("reward_var"), pl.lit(0.0).alias("reward_std"))
    assert "expect_column_values_to_be_between:reward_var" in failed(check(world, "pivots_mixed", bad))
    result = check(world, "pivots_mixed", world["pivots_mixed"].drop("expert_action"))
    assert not result.success and "expect_column_to_exist:expert_action" in failed(result)


def test_turn_action_must_match_its_kind(world):
    bad = world["turns"].with_columns(pl.lit("message").alias("action_kind"))
    failure = failed(check(world, "turns", bad))["expect_column_values_to_be_null:action_problem"]
    assert "does not match action_kind" in failure["sample_rows"][0]["action_problem"]


def test_bad_trajectory_messages_fail(world):
    trajectories = world["trajectories"].to_dicts()
    trajectories[0]["messages"][2]["tool_calls"][0]["arguments"] = "{not json"
    bad = pl.DataFrame(trajectories, schema=world["trajectories"].schema)
    failure = failed(check(world, "trajectories", bad))["expect_column_values_to_be_null:messages_problem"]
    assert "not JSON text" in failure["sample_rows"][0]["messages_problem"]


def test_missing_related_table_is_a_clear_error(world):
    with pytest.raises(ValueError, match="needs related tables \\['turns'\\]"):
        run_contract("pivots_adv", world["pivots_adv"])
    with pytest.raises(ValueError, match="no contract for table"):
        run_contract("nope", world["turns"])


def test_accepts_arrow_and_pandas(world):
    assert run_contract("turns", world["turns"].to_arrow()).success
    assert run_contract("quarantine", world["quarantine"].to_pandas()).success
    assert json.loads(json.dumps(check(world, "rollouts").statistics))


def test_empty_pivot_set_passes_and_missing_profile_column_is_named(world):
    assert check(world, "pivots_adv", world["pivots_adv"].head(0)).success
    result = check(world, "turn_profiles", world["turn_profiles"].drop("n_pass"))
    assert not result.success and "expect_column_to_exist:n_pass" in failed(result)


# -- where the data is: Parquet files checked in DuckDB, exact beyond the GE sample ------------------


def big_rewards(n_turns: int = 600, bad_from: int = 2000) -> pl.DataFrame:
    """K=8 rewards for n_turns turns; every row from `bad_from` on has reward 2.0 (out of range)."""
    n = n_turns * 8
    return pl.DataFrame({
        "turn_id": [f"t{i // 8:06d}" for i in range(n)], "policy_fp": ["p"] * n, "sampling_fp": ["s"] * n,
        "sample_index": [i % 8 for i in range(n)], "verifier_fp": ["v"] * n,
        "reward": [2.0 if i >= bad_from else float(i % 2) for i in range(n)], "reason": ["OK"] * n,
        "action": [None] * n, "domain": ["d"] * n,
    }, schema_overrides={"sample_index": pl.Int32})


def test_parquet_check_counts_every_row_not_just_the_sample(tmp_path):
    from pivot_assets.curation.contracts import GX_SAMPLE_ROWS, check_parquet

    rewards = big_rewards()
    assert rewards.height - 2000 > GX_SAMPLE_ROWS  # the bad rows lie past the GE sample's first rows
    parts = tmp_path / "rollout_rewards"
    parts.mkdir()
    for i, start in enumerate(range(0, rewards.height, 1000)):  # a parted table, as the profiler writes it
        rewards.slice(start, 1000).write_parquet(parts / f"part-{i:03d}.parquet")
    result = check_parquet("rollout_rewards", {"rollout_rewards": str(parts / "part-*.parquet")})
    assert not result.success and result.n_rows == rewards.height
    failure = failed(result)["expect_column_values_to_be_between:reward"]
    assert failure["unexpected_count"] == rewards.height - 2000  # exact, from SQL over every row
    assert failure["sample_rows"] and all(r["reward"] == 2.0 for r in failure["sample_rows"])
    assert result.statistics["rows_validated_by_gx"] <= GX_SAMPLE_ROWS + 5
    # the same rows as a frame give the same verdict
    same = run_contract("rollout_rewards", rewards)
    assert failed(same).keys() == failed(result).keys() and same.n_rows == result.n_rows


def test_duplicates_far_apart_are_found_and_shown_together(tmp_path):
    from pivot_assets.curation.contracts import check_parquet

    rewards = big_rewards(bad_from=10**9)
    duplicated = pl.concat([rewards, rewards.head(1)])  # the copy is 4800 rows after the original
    duplicated.write_parquet(tmp_path / "r.parquet")
    result = check_parquet("rollout_rewards", {"rollout_rewards": str(tmp_path / "r.parquet")})
    failure = failed(result)["expect_compound_columns_to_be_unique:['turn_id', 'policy_fp', 'sampling_fp', 'sample_index', 'verifier_fp']"]
    assert failure["unexpected_count"] == 2 and len(failure["sample_rows"]) == 2


def test_profiles_contract_joins_rewards_in_sql(world, tmp_path):
    from pivot_assets.curation.contracts import check_parquet

    world["turn_profiles"].write_parquet(tmp_path / "turn_profiles.parquet")
    rewards = world["rollout_rewards"].filter(~((pl.col("sample_index") == 3) & (pl.col("turn_id") == world["turns"]["turn_id"][0])))
    rewards.write_parquet(tmp_path / "rollout_rewards.parquet")
    result = check_parquet("turn_profiles", {"turn_profiles": str(tmp_path / "turn_profiles.parquet"),
                                             "rollout_rewards": str(tmp_path / "rollout_rewards.parquet")})
    failure = failed(result)["expect_column_values_to_be_between:k_gap"]
    assert failure["unexpected_count"] == 1 and failure["sample_rows"][0]["k_gap"] == -1


def test_prewarm_builds_one_context_in_the_background(world, monkeypatch):
    """Two prewarm() calls build the GE context once, in a background thread, and the first check then uses that
    context instead of building its own. (Comparing `_context()` with itself could not fail: the cache returns
    one object by construction; what can break is how many builds there are and where they run.)"""
    import threading

    from pivot_assets.curation import contracts

    def prewarm_threads():
        return [t for t in threading.enumerate() if t.name == "pivot-contracts-prewarm"]

    for thread in prewarm_threads():  # a prewarm started before this test must not build into our count
        thread.join(timeout=120)
    builds: list[tuple[str, tuple]] = []
    real_build = contracts._build_context

    def counting_build():
        built = real_build()
        builds.append((threading.current_thread().name, built))
        return built

    monkeypatch.setattr(contracts, "_CONTEXT", None)  # restored after the test: later tests keep their context
    monkeypatch.setattr(contracts, "_build_context", counting_build)
    contracts.prewarm()
    contracts.prewarm()
    for thread in prewarm_threads():
        thread.join(timeout=120)
    assert not prewarm_threads(), "prewarm still building after 120 s"
    assert [name for name, _ in builds] == ["pivot-contracts-prewarm"]  # one build, in the background
    assert contracts._context() is builds[0][1]  # the check's context is the one prewarm built
    assert check(world, "quarantine").success
    assert len(builds) == 1  # the check built nothing more


def test_a_kept_result_answers_a_recheck_of_unchanged_tables_only(world, tmp_path, monkeypatch):
    """check_table keeps each result under its contract key: the same tables, suite and params are answered from it
    (no validation runs); a changed related table, other params or an edited suite validate again."""
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.curation import contracts, tables

    wh = Warehouse(tmp_path / "wh")
    for name in ("turn_profiles", "rollout_rewards"):
        wh.write_table(name, world[name].to_arrow())
    runs: list[str] = []
    real = contracts.check_parquet

    def counted(table, sources, params=None, **kw):
        runs.append(table)
        return real(table, sources, params=params, **kw)

    monkeypatch.setattr(contracts, "check_parquet", counted)
    first = tables.check_table(wh, "turn_profiles", {"lambda_diff": 0.6})
    again = tables.check_table(wh, "turn_profiles", {"lambda_diff": 0.6})
    assert first.success and again == first and runs == ["turn_profiles"]  # the second answered from the kept one
    tables.check_table(wh, "turn_profiles", {"lambda_diff": 0.5})  # other params
    assert len(runs) == 2
    changed = world["rollout_rewards"].filter(~((pl.col("sample_index") == 3) &
                                                (pl.col("turn_id") == world["turns"]["turn_id"][0])))
    wh.write_table("rollout_rewards", changed.to_arrow())  # the related table changed: a turn lost a sample
    failing = tables.check_table(wh, "turn_profiles", {"lambda_diff": 0.6})
    assert len(runs) == 3 and not failing.success
    assert tables.check_table(wh, "turn_profiles", {"lambda_diff": 0.6}) == failing and len(runs) == 3
    suite = contracts.CONTRACTS_DIR / "turn_profiles.json"
    edited = tmp_path / "contracts"
    edited.mkdir()
    for path in contracts.CONTRACTS_DIR.glob("*.json"):
        (edited / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    (edited / suite.name).write_text(suite.read_text(encoding="utf-8").replace("\n", "\n ", 1), encoding="utf-8")
    monkeypatch.setattr(contracts, "CONTRACTS_DIR", edited)  # the suite file edited (whitespace is an edit too)
    tables.check_table(wh, "turn_profiles", {"lambda_diff": 0.6})
    assert len(runs) == 4
    assert len(list((wh.root / tables.CONTRACT_RESULTS_DIR).glob("turn_profiles-*.json"))) == 1  # the latest only
