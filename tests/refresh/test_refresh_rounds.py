"""Refresh rounds through `pivot run`: two rounds on the embedded sample, a kill -9 in the middle of round 1's
profiling, a rerun that finishes it with nothing duplicated, the per-round table, views and budget in `pivot sql`,
and a second rerun that generates and trains nothing.

The rounds' plumbing is under test, not the model: the policy is the tiny random-weight one (tests/tiny_model.py),
and a graded, fact-blind string verifier gives its random completions mixed outcomes, so both rounds have pivots
to train on. Every run is small: 1 GRPO step per round, K=2, 8 tokens a sample.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
import pytest

from pivot_jobs.cli import main as pivot
from tests.crashes import kill_run_after_first_part

pytestmark = pytest.mark.scenario
VENV_BIN = Path(sys.executable).parent
TURNS, K = 6, 2
CONFIG = f"""
warehouse: ./wh
sample: {{n_trajectories: 6, seed: 3}}
policy: {{backend: transformers, model: MODEL, k: {K}, max_new_tokens: 8, limit_turns: {TURNS}, batch_size: 2}}
verifier:
  default: {{name: string_similarity, graded: true, facts: ignore}}
pivots: {{lambda_diff: 0.95}}
training: {{set: adv, init: reference, steps: 1, num_generations: 2, max_completion_length: 8, eval_fraction: 0.3}}
evaluation: {{k: 2, max_turns: 1, bootstrap: 100}}
refresh: {{rounds: 2, steps_per_round: 1, skip_settled_prob: 1.0, replay_fraction: 1.0, seed: 0}}
runtime: {{workers: 1, threads: 1}}
"""


def config(model_dir) -> str:
    """CONFIG with the tiny test policy as the reference policy."""
    return CONFIG.replace("MODEL", str(model_dir))
REPORT = "*refresh_report"  # the rounds and everything upstream of them (not pivot_eval or the exports' consumers)


def rollout_keys(wh: Path) -> list[tuple]:
    return duckdb.sql(f"select turn_id, policy_fp, sampling_fp, sample_index "
                      f"from read_parquet('{wh}/rollouts/part-*.parquet')").fetchall()


def sql(capsys, query: str) -> list[dict]:
    capsys.readouterr()
    assert pivot(["sql", query, "--format", "json"]) == 0, capsys.readouterr().err
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def last_metadata(asset: str) -> dict:
    import dagster as dg

    event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey(asset))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def test_two_refresh_rounds_through_pivot_run(tmp_path, monkeypatch, tiny_model_dir, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pivot.yaml").write_text(config(tiny_model_dir))
    wh = tmp_path / "wh"
    assert pivot(["run", "--select", "*refresh_round_0"]) == 0, capsys.readouterr().err
    reference_parts = len(list((wh / "rollouts").glob("part-*.parquet")))
    assert len(rollout_keys(wh)) == TURNS * K

    # kill -9 of `pivot run` (supervisor and worker) once round 1 has written its first rollouts part
    killed = kill_run_after_first_part([str(VENV_BIN / "pivot"), "run", "--select", REPORT],
                                       lambda: len(list((wh / "rollouts").glob("part-*.parquet"))) > reference_parts)
    assert killed.mid_run, "the run ended before round 1 wrote its first part"
    interrupted = len(rollout_keys(wh)) - TURNS * K
    assert 0 < interrupted < TURNS * K, "killed before or after round 1's profiling: resize the test"
    assert not (wh / "models" / "refresh_round_1" / ".pivot_key").exists()

    assert pivot(["run", "--select", REPORT]) == 0, capsys.readouterr().err
    keys = rollout_keys(wh)
    assert len(keys) == len(set(keys)), "a rerun after kill -9 duplicated rollouts"

    from pivot_assets.core.config import load_config
    from pivot_assets.training.runs import model_fingerprint

    cfg = load_config(tmp_path / "pivot.yaml")
    round0_model = model_fingerprint(str(wh / "models" / "grpo_policy"), cfg)
    rows = sql(capsys, "select round, turn_id, policy_fp, profiled_by, bucket, skipped, replayed, trained, k "
                       "from refresh_profiles order by round, turn_id")
    by_round = {r: [x for x in rows if x["round"] == r] for r in (0, 1)}
    assert len(by_round[0]) == TURNS and {x["turn_id"] for x in by_round[1]} == {x["turn_id"] for x in by_round[0]}
    assert len(rows) == 2 * TURNS  # one row per (round, turn): the kill duplicated nothing
    assert all(x["bucket"] in ("adv", "mixed", "easy", "unsolved") for x in rows)
    # round 1 profiled with round 0's checkpoint: its policy_fp is that model's fingerprint, in the rollouts too
    assert all(x["policy_fp"].startswith(round0_model + "|transformers:") for x in by_round[1])
    fresh = [x for x in by_round[1] if not x["skipped"]]
    assert fresh and all(x["profiled_by"] == x["policy_fp"] for x in fresh)
    round1_fp = by_round[1][0]["policy_fp"]
    sampled = {t for t, fp, _, _ in keys if fp == round1_fp}
    assert sampled == {x["turn_id"] for x in fresh}
    # skip_settled_prob 1: every turn settled at round 0 is carried forward with round 0's profile, not resampled
    settled = {x["turn_id"] for x in by_round[0] if x["bucket"] in ("easy", "unsolved")}
    assert {x["turn_id"] for x in by_round[1] if x["skipped"]} == settled
    assert all(x["profiled_by"] != round1_fp for x in by_round[1] if x["skipped"])
    assert len(keys) == TURNS * K + len(fresh) * K

    churn = sql(capsys, "refresh_churn")
    flow = sql(capsys, "refresh_bucket_flow")
    assert sum(f["turns"] for f in flow) == TURNS
    assert len(churn) == sum(f["turns"] for f in flow if f["from_bucket"] != f["to_bucket"])
    drift = sql(capsys, "refresh_drift")
    assert [d for d in drift if d["from_bucket"] == "(all)"][0]["turns"] == len(fresh)
    budget = {b["round"]: b for b in sql(capsys, "rollout_budget")}
    assert set(budget) == {"0", "1", "total"}
    assert budget["0"]["profiling_samples"] == TURNS * K and budget["1"]["profiling_samples"] == len(fresh) * K
    assert budget["1"]["grpo_steps"] == 1 and budget["1"]["grpo_samples"] > 0 and budget["1"]["eval_samples"] == 2
    assert budget["total"]["local_samples"] == sum(budget[r]["profiling_samples"] + budget[r]["grpo_samples"]
                                                   for r in ("0", "1"))
    assert budget["total"]["e2e_samples"] > 0 and budget["total"]["e2e_over_local"] > 0
    assert "bucket_flow" in last_metadata("refresh_report")

    # a rerun of the finished rounds: nothing sampled, nothing trained, the same rows
    marker = (wh / "models" / "refresh_round_1" / ".pivot_key").stat().st_mtime_ns
    assert pivot(["run", "--select", REPORT]) == 0, capsys.readouterr().err
    assert rollout_keys(wh) == keys
    meta = last_metadata("refresh_round_1")
    assert meta["rollouts_generated_this_run"] == 0 and meta["trained_this_run"] is False
    assert (wh / "models" / "refresh_round_1" / ".pivot_key").stat().st_mtime_ns == marker
    assert sql(capsys, "select round, turn_id, policy_fp, profiled_by, bucket, skipped, replayed, trained, k "
                       "from refresh_profiles order by round, turn_id") == rows
