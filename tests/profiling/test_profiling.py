"""Profiling: turns x K rollouts, cached, resumable after kill -9, and a verifier change re-scores everything
without generating a token. The tiny test policy samples (tests/tiny_model.py): the plumbing is under test."""

import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from pivot_jobs.cli import main as pivot
from tests.crashes import kill_run_after_first_part

pytestmark = pytest.mark.scenario
VENV_BIN = Path(sys.executable).parent
K = 2
TURNS = 6

BASE = f"""warehouse: ./wh
sample: {{n_trajectories: 3, seed: 3}}
policy: {{model: MODEL, k: {K}, max_new_tokens: 8, limit_turns: {TURNS}, batch_size: 4}}
"""


@pytest.fixture
def project(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pivot.yaml").write_text(BASE.replace("MODEL", str(tiny_model_dir)))
    return tmp_path


def base(project: Path) -> str:
    """The project's BASE config, as the fixture wrote it."""
    return (project / "pivot.yaml").read_text()


def rollout_keys(root: Path) -> list[tuple]:
    return duckdb.sql(
        f"select turn_id, policy_fp, sampling_fp, sample_index from read_parquet('{root}/wh/rollouts/part-*.parquet')"
    ).fetchall()


def last_metadata(asset: str) -> dict:
    event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey(asset))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def test_profile_cache_and_rescore(project, capsys):
    stages = "trajectories,turns,rollouts,rollout_rewards,turn_profiles"
    assert pivot(["run", "--select", stages]) == 0
    keys = rollout_keys(project)
    assert len(keys) == TURNS * K and len(set(keys)) == len(keys)
    assert last_metadata("rollouts")["turns_generated"] == TURNS
    profiles = duckdb.sql(f"select k, reward_mean, reward_var from read_parquet('{project}/wh/turn_profiles.parquet')").fetchall()
    assert len(profiles) == TURNS and all(k == K and 0 <= m <= 1 and v >= 0 for k, m, v in profiles)

    # a second run generates nothing and scores nothing
    assert pivot(["run", "--select", stages]) == 0
    assert last_metadata("rollouts")["turns_generated"] == 0
    assert last_metadata("rollout_rewards")["rollouts_scored"] == 0
    assert len(rollout_keys(project)) == TURNS * K

    # a changed verifier threshold: scoring and below are stale, generation is not
    (project / "pivot.yaml").write_text(base(project) + "verifier: {default: {name: tool_call, text_threshold: 0.2}}\n")
    capsys.readouterr()
    assert pivot(["stale"]) == 0
    stale = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert stale.get("rollout_rewards") == "STALE" and stale.get("turn_profiles") == "STALE"
    assert "rollouts" not in stale and "turns" not in stale
    assert pivot(["run", "--select", "rollouts,rollout_rewards,turn_profiles"]) == 0
    assert last_metadata("rollouts")["turns_generated"] == 0
    assert last_metadata("rollout_rewards")["rollouts_scored"] == TURNS * K
    assert len(rollout_keys(project)) == TURNS * K
    verifier_fps = duckdb.sql(
        f"select count(distinct verifier_fp) from read_parquet('{project}/wh/rollout_rewards/part-*.parquet')"
    ).fetchone()[0]
    assert verifier_fps == 2  # the old scores stay cached beside the new ones


def test_kill_9_mid_rollouts_then_resume(project):
    assert pivot(["run", "--select", "trajectories,turns"]) == 0
    # one turn per part (batch_size is a speed knob, not part of the policy identity): room to kill between parts
    (project / "pivot.yaml").write_text(base(project).replace("batch_size: 4", "batch_size: 2"))
    parts = project / "wh" / "rollouts"
    kill_run_after_first_part([str(VENV_BIN / "pivot"), "run", "--select", "rollouts"],
                              lambda: bool(list(parts.glob("part-*.parquet"))))
    written = len(rollout_keys(project)) if list(parts.glob("part-*.parquet")) else 0
    assert written < TURNS * K, "the run finished before it could be killed: make the test input larger"
    assert pivot(["run", "--select", "rollouts"]) == 0
    keys = rollout_keys(project)
    assert len(keys) == TURNS * K and len(set(keys)) == len(keys)
    assert last_metadata("rollouts")["turns_generated"] == TURNS - written // K


def test_profile_real_shared_data(tmp_path, monkeypatch, tiny_model_dir, shared_data_dir):
    """Real NeMo-Gym rollouts + a tau2 airline run (long prompts), profiled: turns x K, then cached."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)  # the project's ./pivot.yaml, not the shell's config
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pivot.yaml").write_text(
        "warehouse: ./wh\ninputs:\n"
        f"  - path: {shared_data_dir}/nemo-gym/resources_servers/xlam_fc/data/example_rollouts.jsonl\n"
        f"  - path: {shared_data_dir}/tau2-bench/airline_run1.json\n"
        f"policy: {{model: {tiny_model_dir}, k: {K}, max_new_tokens: 8, limit_turns: 4, dtype: bfloat16}}\n"
    )
    stages = "trajectories,turns,rollouts,rollout_rewards,turn_profiles"
    assert pivot(["run", "--select", stages]) == 0
    keys = rollout_keys(tmp_path)
    assert len(keys) == 4 * K and len(set(keys)) == len(keys)
    assert pivot(["run", "--select", stages]) == 0
    assert last_metadata("rollouts")["turns_generated"] == 0
    assert len(rollout_keys(tmp_path)) == 4 * K


def test_truncated_rollouts_part_is_named_then_repaired_by_the_next_run(project, capsys):
    """A part cut short (an interrupted copy): `pivot check --parts` names it and exits 1; `pivot run` sets it aside
    and regenerates exactly its rows (per-sample seeds: the same completions); the check then exits 0."""
    (project / "pivot.yaml").write_text(base(project).replace("batch_size: 4", "batch_size: 2"))  # several parts
    stages = "trajectories,turns,rollouts,rollout_rewards,turn_profiles"
    assert pivot(["run", "--select", stages]) == 0
    query = f"select turn_id, sample_index, completion from read_parquet('{project}/wh/rollouts/part-*.parquet') order by all"
    before = duckdb.sql(query).fetchall()
    parts = sorted((project / "wh" / "rollouts").glob("part-*.parquet"))
    assert len(parts) > 1
    victim = parts[1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    capsys.readouterr()

    assert pivot(["check", "--parts"]) == 1
    out = capsys.readouterr().out
    assert "rollouts: FAIL" in out and f"damaged {victim}: unreadable Parquet footer" in out

    assert pivot(["run", "--select", stages]) == 0
    assert duckdb.sql(query).fetchall() == before  # the same rows, the same completions
    assert last_metadata("rollouts")["turns_generated"] >= 1
    assert (project / "wh" / "damaged_parts" / "rollouts" / victim.name).is_file()  # kept, with its reason
    assert "unreadable Parquet footer" in (project / "wh" / "damaged_parts" / "rollouts" / f"{victim.name}.reason").read_text()
    capsys.readouterr()
    assert pivot(["check", "--parts"]) == 0
    assert "rollouts: ok" in capsys.readouterr().out


def test_prompts_past_max_prompt_tokens_are_listed_not_profiled(project, capsys):
    """policy.max_prompt_tokens: a longer turn gets no rollouts; it is listed with its reason and token count in
    skipped_turns, counted in the funnel, and shown by `pivot sql not_profiled`."""
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.policies.models import load_tokenizer, render_prompt
    from pivot_assets.profiling.profiler import generation_requests, select_turns

    assert pivot(["run", "--select", "trajectories,turns"]) == 0
    wh = Warehouse(project / "wh")
    tokenizer = load_tokenizer("embedded")
    wanted = select_turns(wh, TURNS)
    lengths = {r.turn_id: len(tokenizer(render_prompt(tokenizer, r.messages, r.tools), add_special_tokens=False)["input_ids"])
               for r in generation_requests(wh, wanted)}
    limit = sorted(lengths.values())[len(lengths) // 2]  # about half the turns fit
    too_long = {t for t, n in lengths.items() if n > limit}
    assert too_long and len(too_long) < TURNS
    (project / "pivot.yaml").write_text(base(project).replace("limit_turns:", f"max_prompt_tokens: {limit}, limit_turns:"))

    assert pivot(["run", "--select", "rollouts,rollout_rewards,turn_profiles"]) == 0
    assert {k[0] for k in rollout_keys(project)} == set(wanted) - too_long
    con = duckdb.connect(str(project / "wh" / "pivot.duckdb"), read_only=True)
    skipped = con.sql("select turn_id, reason, n_prompt_tokens, max_prompt_tokens from skipped_turns").fetchall()
    assert {r[0] for r in skipped} == too_long
    assert all(r[1] == "prompt_too_long" and r[2] == lengths[r[0]] > r[3] == limit for r in skipped)
    profiled = {r[0] for r in con.sql("select turn_id from turn_profiles").fetchall()}
    assert profiled == set(wanted) - too_long
    con.close()
    assert last_metadata("rollouts")["turns_prompt_too_long"] == len(too_long)
    assert pivot(["run", "--select", "rollouts"]) == 0  # cached: the sampled turns are not rendered again ...
    assert last_metadata("rollouts")["turns_prompt_too_long"] == len(too_long)  # ... the skipped ones stay listed
    capsys.readouterr()
    assert pivot(["sql", "not_profiled", "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 1 + len(too_long)


def test_the_default_prompt_limit_is_the_models_context_less_the_completion(embedded_model_dir):
    from pivot_assets.core.config import PolicySection
    from pivot_assets.policies.models import context_length
    from pivot_assets.profiling.prompt_guard import prompt_limit

    assert context_length("embedded") >= 2048
    assert prompt_limit(PolicySection(max_new_tokens=40), "embedded") == context_length("embedded") - 40
    assert prompt_limit(PolicySection(max_prompt_tokens=100), "embedded") == 100
    served = PolicySection(backend="openai", model="served", base_url="http://127.0.0.1:1/v1")
    assert prompt_limit(served, "served") is None  # no local tokenizer: the server rejects what does not fit
