"""Continuous rewards end to end through `pivot run` on the tiny policy: a partial-credit verifier profiles, `std_min`
selects, GRPO trains on the same continuous reward, and the NeMo-Gym export's pass_rate counts the samples that
reach the verifier's pass threshold; then `band` selects again from the same rewards, generating and scoring none.

The verifier is tool_call with argument credit, its replies scored by a graded, fact-blind string similarity: the
tiny random-weight policy (tests/tiny_model.py) writes no tool calls, so its rewards strictly between 0 and 1 come
from the replies (argument credit itself is tests/verifiers/test_partial_credit.py). Small: 6 turns, K=4, 12 tokens a
sample, 2 GRPO steps of one group of 2.
"""

from __future__ import annotations

import json

import duckdb
import pytest

from pivot_jobs.cli import main as pivot

pytestmark = pytest.mark.scenario
THRESHOLD = 0.25  # the verifier's pass threshold: a graded reply passes at this similarity
CONFIG = f"""
warehouse: ./wh
sample: {{n_trajectories: 6, seed: 3}}
policy: {{backend: transformers, model: MODEL, k: 4, max_new_tokens: 12, limit_turns: 6, batch_size: 4}}
verifier:
  default:
    name: tool_call
    credit: arguments
    pass_threshold: {THRESHOLD}
    text_verifier: {{name: string_similarity, graded: true, facts: ignore, threshold: {THRESHOLD}}}
pivots: PIVOTS
training: {{set: adv, init: reference, steps: 2, num_generations: 2, max_completion_length: 8, eval_fraction: 0.0}}
runtime: {{workers: 1, threads: 1}}
"""
STD_MIN = "{rule: std_min, min_std: 0.005}"
BAND = "{rule: band, band: [0.05, 0.6]}"


def write_config(root, model_dir, pivots: str) -> None:
    (root / "pivot.yaml").write_text(CONFIG.replace("MODEL", str(model_dir)).replace("PIVOTS", pivots))


def query(wh, sql: str) -> list[dict]:
    con = duckdb.connect(str(wh / "pivot.duckdb"), read_only=True)
    try:
        return con.sql(sql).pl().to_dicts()
    finally:
        con.close()


def passing(rewards: list[float]) -> int:
    return sum(1 for r in rewards if r > 0 and r >= THRESHOLD)


def test_partial_credit_profiles_selects_trains_and_exports_pass_rate(tmp_path, monkeypatch, tiny_model_dir, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, tiny_model_dir, STD_MIN)
    wh = tmp_path / "wh"
    assert pivot(["run", "--select", "*grpo_run"]) == 0, capsys.readouterr().err
    assert pivot(["run", "--select", "pivot_nemo_gym"]) == 0, capsys.readouterr().err

    # profiling: rewards strictly between 0 and 1, and n_pass counts the rewards at or above the threshold
    rewards = query(wh, "select turn_id, list(reward order by sample_index) as rewards from rollout_rewards group by 1")
    assert any(0.0 < r < 1.0 for row in rewards for r in row["rewards"])
    profiles = {p["turn_id"]: p for p in query(wh, "select * from turn_profiles")}
    for row in rewards:
        profile = profiles[row["turn_id"]]
        assert profile["n_pass"] == passing(row["rewards"]) and profile["pass_threshold"] == THRESHOLD
        assert profile["reward_mean"] == pytest.approx(sum(row["rewards"]) / len(row["rewards"]))

    # std_min: D_adv is every mixed turn whose reward std reaches min_std, logged under the rule
    adv = query(wh, "select turn_id, reward_std, reward_mean from pivots_adv")
    assert adv and all(p["reward_std"] >= 0.005 for p in adv)
    assert {p["turn_id"] for p in adv} == {t for t, p in profiles.items() if (p["reward_std"] or 0) >= 0.005}
    assert {r["rule"] for r in query(wh, "select distinct rule from pivot_selection_log")} == {"std_min"}

    # GRPO: each logged reward is the verifier's continuous reward of that completion, its pass verdict beside it
    from pivot_assets.core.config import load_config
    from pivot_assets.verifiers import VerifierSets

    verifier = VerifierSets.from_config(load_config(tmp_path / "pivot.yaml")).reward.default
    experts = {r["turn_id"]: r["expert_action"] for r in query(wh, "select turn_id, expert_action from turns")}
    tools = {r["turn_id"]: r["tools"] for r in query(
        wh, "select u.turn_id, t.tools from turns u join trajectories t using (trajectory_id)")}
    logged = query(wh, "select step, turn_id, completion, reward, passed from grpo_completions")
    assert {r["step"] for r in logged} == {1, 2} and {r["turn_id"] for r in logged} <= {p["turn_id"] for p in adv}
    for row in logged:
        score = verifier.score(experts[row["turn_id"]], row["completion"], tools=tools[row["turn_id"]])
        assert row["reward"] == score.reward and row["passed"] == (score.reward > 0 and score.reward >= THRESHOLD)
    steps = query(wh, "select step, reward_mean from grpo_steps order by step")
    by_step = {s: [r["reward"] for r in logged if r["step"] == s] for s in (1, 2)}
    assert [s["reward_mean"] for s in steps] == pytest.approx([sum(v) / len(v) for v in by_step.values()])

    # the NeMo-Gym export: pass_rate is the share of the row's own rewards that pass, not their mean
    rows = [json.loads(line) for line in (wh / "exports" / "pivots_adv.jsonl").read_text().splitlines()]
    assert len(rows) == len(adv)
    for row in rows:
        sampled = row["qwen_235b_info"]["rewards"]
        assert row["pass_rate_passed"] == passing(sampled) and row["pass_rate_total"] == len(sampled)
        assert row["pass_rate"] == pytest.approx(passing(sampled) / len(sampled))
        assert row["metadata"]["pass_threshold"] == THRESHOLD
    assert any(row["pass_rate"] != pytest.approx(row["qwen_235b_info"]["reward_mean"]) for row in rows)

    # band: the same rewards selected again; nothing generated, nothing scored
    before = {name: query(wh, f"select count(*) as n from {name}")[0]["n"] for name in ("rollouts", "rollout_rewards")}
    write_config(tmp_path, tiny_model_dir, BAND)
    capsys.readouterr()
    assert pivot(["run", "--select", "*pivot_nemo_gym"]) == 0, capsys.readouterr().err
    after = {name: query(wh, f"select count(*) as n from {name}")[0]["n"] for name in ("rollouts", "rollout_rewards")}
    assert after == before
    banded = query(wh, "select turn_id, reward_mean, reward_var from pivots_adv")
    assert banded and all(0.05 < p["reward_mean"] < 0.6 and p["reward_var"] > 0 for p in banded)
    assert {p["turn_id"] for p in banded} == {t for t, p in profiles.items()
                                             if p["reward_var"] > 0 and 0.05 < p["reward_mean"] < 0.6}
    assert {r["rule"] for r in query(wh, "select distinct rule from pivot_selection_log")} == {"band"}
