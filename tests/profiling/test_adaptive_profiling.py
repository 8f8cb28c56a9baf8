"""Adaptive profiling with the embedded policy: an adaptive profile is a prefix of the exhaustive one (same keys,
same completions), turning it off or raising k generates only the missing samples, kill -9 mid-run resumes without
duplicates, and through Dagster the profiles say why each turn stopped, pass their contracts, and a verifier change
re-scores without generating."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from pivot_jobs.cli import main as pivot
from pivot_assets.core.config import load_config
from pivot_assets.profiling.adaptive import simulate
from pivot_assets.profiling.profiler import Profiler, generation_requests, sample_seed
from pivot_assets.verifiers import DomainVerifiers
from tests.crashes import kill_run_after_first_part

pytestmark = pytest.mark.scenario
VENV_BIN = Path(sys.executable).parent
K, TURNS = 6, 6
# tool_name accepting any reply: the zero-shot model passes some turns every time and fails others every time, so
# the exact rule stops the all-pass turns at 4 of 6 samples (5 passes would exceed lambda_diff * k = 3.6)
BASE = f"""warehouse: ./wh
sample: {{n_trajectories: 3, seed: 3}}
policy: {{model: embedded, k: {K}, max_new_tokens: 8, limit_turns: {TURNS}, batch_size: 12, dtype: float32}}
verifier: {{default: {{name: tool_name, accept_any_reply: true}}}}
"""
ADAPTIVE = "profiling: {adaptive: {enabled: true, rule: exact, sets: [adv]}}\n"


@pytest.fixture(scope="module")
def ingested(tmp_path_factory, embedded_model_dir):
    """A warehouse with the embedded sample's trajectories and turns (copied by each test)."""
    root = tmp_path_factory.mktemp("ingested")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        mp.chdir(root)
        (root / "pivot.yaml").write_text(BASE)
        assert pivot(["run", "--select", "trajectories,turns"]) == 0
    return root / "wh"


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory, ingested):
    """An uninterrupted adaptive profile (in process): (its warehouse dir, generation stats)."""
    root = tmp_path_factory.mktemp("adaptive")
    shutil.copytree(ingested, root / "wh")
    return root / "wh", profiler(root, BASE + ADAPTIVE).generate()


def project(tmp_path: Path, source_wh: Path, config: str, monkeypatch) -> Path:
    """A project dir whose warehouse is a copy of `source_wh` (its tables only, no pivot.duckdb)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(source_wh, tmp_path / "wh", ignore=shutil.ignore_patterns("pivot.duckdb*"))
    (tmp_path / "pivot.yaml").write_text(config)
    return tmp_path


def profiler(root: Path, config: str) -> Profiler:
    (root / "pivot.yaml").write_text(config)
    cfg = load_config(root / "pivot.yaml")
    return Profiler.for_config(cfg, DomainVerifiers(cfg.verifier))


def samples(root: Path) -> dict[tuple[str, int], str]:
    rows = duckdb.sql(f"select turn_id, sample_index, completion from read_parquet('{root}/wh/rollouts/*.parquet')")
    out = {}
    for t, i, c in rows.fetchall():
        assert (t, i) not in out, f"duplicate sample {(t, i)}"
        out[(t, i)] = c
    return out


def exhaustive_draws(p: Profiler, k: int) -> dict[tuple[str, int], str]:
    """Every turn's samples 0..k-1 drawn directly: one backend call, one generator per (turn, index) seed."""
    backend = p.build_backend()
    plan = {t: [(i, sample_seed(p.sampling.seed, i)) for i in range(k)] for t in p.turns}
    requests = generation_requests(p.wh, p.turns)
    return {(s.turn_id, s.sample_index): s.completion for b in backend.generate(requests, p.sampling, rows=plan) for s in b}


def test_adaptive_is_a_prefix_of_exhaustive_and_a_rerun_adds_only_what_is_missing(tmp_path, adaptive_run, monkeypatch):
    root = project(tmp_path, adaptive_run[0], BASE + ADAPTIVE, monkeypatch)
    adaptive, stats = profiler(root, BASE + ADAPTIVE), adaptive_run[1]
    got = samples(root)
    per_turn = {t: sorted(i for tt, i in got if tt == t) for t in adaptive.turns}
    assert all(indices == list(range(len(indices))) for indices in per_turn.values())  # a prefix of 0..k-1
    assert any(len(i) < K for i in per_turn.values()) and any(len(i) == K for i in per_turn.values())
    assert stats["rollouts_generated"] == len(got) < TURNS * K and stats["rounds"] == K // 2
    reasons = dict(zip(*adaptive.profile().select(["turn_id", "stop_reason"]).to_pydict().values()))
    assert {reasons[t] for t, i in per_turn.items() if len(i) < K} == {"settled"}

    # the same draws as sampling every turn to k at once
    draws = exhaustive_draws(adaptive, K + 2)
    assert got == {key: draws[key] for key in got}

    # adaptive off: only the samples the early stops skipped; then k + 2: only the two new indices of every turn
    off = profiler(root, BASE)
    assert off.generate()["rollouts_generated"] == TURNS * K - len(got)
    more = profiler(root, BASE.replace(f"k: {K},", f"k: {K + 2},"))
    assert more.generate()["rollouts_generated"] == TURNS * 2
    assert samples(root) == draws
    assert more.score()["rollouts_scored"] == TURNS * (K + 2) - len(got)  # each sample scored once
    assert sorted(more.profile().column("k").to_pylist()) == [K + 2] * TURNS
    # the bench's replay (adaptive.simulate on the stored rewards) takes exactly the samples the rounds took
    rewards: dict[str, list[float]] = {}
    for t, _, r in duckdb.sql(f"select turn_id, sample_index, reward from read_parquet('{root}/wh/rollout_rewards/*.parquet') "
                              "order by turn_id, sample_index").fetchall():
        rewards.setdefault(t, []).append(r)
    options = load_config(root / "pivot.yaml").pivots
    replayed = simulate({t: r[:K] for t, r in rewards.items()}, adaptive.adaptive, K, options.lambda_diff)
    assert replayed == {t: len(i) for t, i in per_turn.items()}
    likelihoods = duckdb.sql(f"select turn_id, count(*) from read_parquet('{root}/wh/expert_likelihoods/*.parquet') "
                             "group by turn_id").fetchall()
    assert len(likelihoods) == TURNS and all(n == 1 for _, n in likelihoods)  # once per turn, on its first round


def test_kill_9_mid_adaptive_rounds_then_resume(tmp_path, ingested, adaptive_run, monkeypatch):
    config = BASE.replace("batch_size: 12", "batch_size: 2") + ADAPTIVE  # one turn's round per part
    root = project(tmp_path, ingested, config, monkeypatch)
    parts = root / "wh" / "rollouts"
    killed = kill_run_after_first_part([str(VENV_BIN / "pivot"), "run", "--select", "rollouts"],
                                       lambda: len(list(parts.glob("part-*.parquet"))) >= 3)
    assert killed.mid_run, "the run ended before its third part was seen"
    written = len(samples(root))  # the whole run was killed: what it left is what it had written at the kill
    assert 0 < written < TURNS * K, "the run had drawn every sample when it was killed: make the test input larger"
    assert pivot(["run", "--select", "rollouts"]) == 0
    assert samples(root) == samples(adaptive_run[0].parent)  # an uninterrupted run's samples, none twice


WAVES = "profiling: {adaptive: {enabled: true, rule: exact, sets: [adv], scheduler: waves, wave_samples: 4}}\n"


def test_waves_draw_the_rounds_samples_and_a_kill_9_resumes_without_duplicates(tmp_path, ingested, adaptive_run,
                                                                               monkeypatch):
    """The scheduler without rounds (engine calls of 4 samples, each scored and decided as it returns) under the
    exact rule stops every turn where the rounds do: the same keys, the same completions; killed after its third
    part, a rerun completes it with none twice."""
    uninterrupted = project(tmp_path / "whole", ingested, BASE + WAVES, monkeypatch)
    stats = profiler(uninterrupted, BASE + WAVES).generate()
    assert samples(uninterrupted) == samples(adaptive_run[0].parent)
    assert stats["waves"] > K // 2 and stats["wave_samples_mean"] <= 4 and "rounds" not in stats

    root = project(tmp_path / "killed", ingested, BASE + WAVES, monkeypatch)
    parts = root / "wh" / "rollouts"
    killed = kill_run_after_first_part([str(VENV_BIN / "pivot"), "run", "--select", "rollouts"],
                                       lambda: len(list(parts.glob("part-*.parquet"))) >= 3)
    assert killed.mid_run, "the run ended before its third part was seen"
    assert 0 < len(samples(root)) < TURNS * K
    assert pivot(["run", "--select", "rollouts"]) == 0
    assert samples(root) == samples(adaptive_run[0].parent)


def last_metadata(asset: str) -> dict:
    event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey(asset))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def test_dagster_profiles_say_why_and_a_verifier_change_never_generates(tmp_path, adaptive_run, monkeypatch, capsys):
    root = project(tmp_path, adaptive_run[0], BASE + ADAPTIVE, monkeypatch)  # its samples cached, already scored
    stages = "trajectories,turns,rollouts,rollout_rewards,turn_profiles"  # ingest: this instance's records of it
    assert pivot(["run", "--select", stages]) == 0
    assert last_metadata("rollouts")["turns_generated"] == 0
    assert last_metadata("rollout_rewards")["rollouts_scored"] == 0
    meta = last_metadata("turn_profiles")
    assert meta["stop_reason/settled"] > 0 and meta["samples"] < TURNS * K
    assert meta["turns_with_expert_logprob"] == TURNS
    assert pivot(["check"]) == 0

    # a verifier that fails every zero-shot sample: `--stale` re-scores the cached samples and generates nothing; the
    # turns that stopped early after passing are open under it (stop_reason unsettled) until `rollouts` tops them up
    (root / "pivot.yaml").write_text(BASE.replace("{name: tool_name, accept_any_reply: true}", "{name: exact}") + ADAPTIVE)
    before = len(samples(root))
    capsys.readouterr()
    assert pivot(["stale"]) == 0
    stale = {line.split()[0] for line in capsys.readouterr().out.splitlines() if " STALE " in line}
    assert "rollouts" not in stale and {"rollout_rewards", "turn_profiles"} <= stale, stale
    assert pivot(["run", "--stale"]) == 0
    assert len(samples(root)) == before
    assert last_metadata("rollout_rewards")["rollouts_scored"] == before
    opened = last_metadata("turn_profiles")["stop_reason/unsettled"]
    assert opened > 0
    assert pivot(["check"]) == 0
    assert pivot(["run", "--select", stages]) == 0
    assert len(samples(root)) == before + opened * (K - 4)
    assert "stop_reason/unsettled" not in last_metadata("turn_profiles")
