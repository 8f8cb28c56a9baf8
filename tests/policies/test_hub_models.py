"""Models named by a Hugging Face Hub id (policies/hub.py), from a Hub cache laid out on disk: nothing downloads
(HF_HUB_OFFLINE=1, tests/conftest.py).

The cache is huggingface_hub's layout: $HF_HOME/hub/models--org--name/snapshots/<commit>/ with the model's files
and refs/<revision> holding the commit a branch or tag points to. The files are the tiny random Llama's."""

import shutil
from pathlib import Path

import pytest

from pivot_jobs.cli import main as pivot
from pivot_assets.core.config import PolicySection
from pivot_assets.policies import hub
from pivot_assets.policies.models import policy_fingerprint, resolve_model_dir
from pivot_assets.profiling.profiler import policy_version

REPO_ID = "org/name"
COMMIT_A = "a1" * 20
COMMIT_B = "b2" * 20


def lay_out_snapshot(hf_home: Path, files: Path, commit: str, refs: tuple[str, ...] = ("main",),
                     repo_id: str = REPO_ID) -> Path:
    """One snapshot of repo_id in the Hub cache under hf_home, and the refs that point to it."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(files, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)  # huggingface_hub writes the bare hash, no newline
    return snapshot


def use_hf_home(monkeypatch, hf_home: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "hub"))


@pytest.fixture
def hf_home(tmp_path, monkeypatch, tiny_model_dir) -> Path:
    """A Hub cache holding org/name at COMMIT_A (refs/main) and COMMIT_B (refs/v2)."""
    home = tmp_path / "hf"
    lay_out_snapshot(home, tiny_model_dir, COMMIT_A, ("main",))
    lay_out_snapshot(home, tiny_model_dir, COMMIT_B, ("v2",))
    use_hf_home(monkeypatch, home)
    return home


def rollouts_version(model: str) -> str:
    return policy_version(PolicySection(model=model))


@pytest.mark.parametrize("spelling, expected", [
    ("org/name", hub.HubId("org/name")),
    ("Org-1/na.me_2@v2", hub.HubId("Org-1/na.me_2", "v2")),
    ("org/name@refs/pr/1", hub.HubId("org/name", "refs/pr/1")),
    ("embedded", None), ("/models/qwen", None), ("./models/qwen", None), ("a/b/c", None), ("org/name@", None),
])
def test_hub_id_syntax(spelling, expected):
    assert hub.parse_hub_id(spelling) == expected


def test_hub_id_resolves_from_the_cache_with_no_network(hf_home):
    assert hub.hub_offline()
    assert resolve_model_dir(REPO_ID) == hf_home / "hub" / "models--org--name" / "snapshots" / COMMIT_A
    assert resolve_model_dir(f"{REPO_ID}@v2").name == COMMIT_B
    assert resolve_model_dir(f"{REPO_ID}@{COMMIT_B}").name == COMMIT_B  # a commit needs no ref


def test_identity_is_the_snapshot_commit_not_the_id(hf_home):
    main, v2 = policy_fingerprint(REPO_ID), policy_fingerprint(f"{REPO_ID}@v2")
    assert main.startswith(f"hub|w:{COMMIT_A}|") and v2.startswith(f"hub|w:{COMMIT_B}|")
    assert policy_fingerprint(f"{REPO_ID}@{COMMIT_A}") == main  # one snapshot, however the id is spelled
    assert rollouts_version(f"{REPO_ID}@v2") != rollouts_version(REPO_ID)
    # `hf download` of a newer commit moves refs/main: the same id is now another policy, and rollouts are stale
    before = rollouts_version(REPO_ID)
    (hf_home / "hub" / "models--org--name" / "refs" / "main").write_text(COMMIT_B)
    assert policy_fingerprint(REPO_ID) == v2
    assert rollouts_version(REPO_ID) != before


def test_a_moved_cache_keeps_the_identity(hf_home, tmp_path, monkeypatch):
    fp, version = policy_fingerprint(REPO_ID), rollouts_version(REPO_ID)
    moved = tmp_path / "elsewhere" / "hf"
    shutil.copytree(hf_home, moved)
    shutil.rmtree(hf_home)
    use_hf_home(monkeypatch, moved)
    assert resolve_model_dir(REPO_ID).is_relative_to(moved)
    assert (policy_fingerprint(REPO_ID), rollouts_version(REPO_ID)) == (fp, version)


def test_an_unknown_id_fails_in_one_line(hf_home):
    for model, command in [("org/unknown", "hf download org/unknown"),
                           (f"{REPO_ID}@v3", f"hf download {REPO_ID} --revision v3")]:
        with pytest.raises(hub.HubModelMissing) as err:
            resolve_model_dir(model)
        message = str(err.value)
        assert len(message.splitlines()) == 1
        assert model in message and str(hf_home / "hub") in message and command in message


def test_a_local_dir_wins_over_an_id_of_the_same_spelling(hf_home, tiny_model_dir, tmp_path, monkeypatch):
    shutil.copytree(tiny_model_dir, tmp_path / "org" / "name")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir(REPO_ID) == Path(REPO_ID)
    assert policy_fingerprint(REPO_ID).startswith("local|")
    assert hub.pinned_id(REPO_ID) == REPO_ID  # its rollouts' version names the dir, not a commit


# -- through `pivot run` --------------------------------------------------------------------------------------
@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project dir with its own pivot.yaml and DAGSTER_HOME; returns a writer for the policy line."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)

    def write(model: str) -> None:
        (tmp_path / "pivot.yaml").write_text(
            "warehouse: ./wh\nsample: {n_trajectories: 2, seed: 0}\n"
            f"policy: {{model: {model}, k: 2, max_new_tokens: 8, limit_turns: 2}}\n")

    return write


@pytest.mark.scenario
def test_pivot_run_profiles_a_hub_model_from_the_cache(hf_home, project, capsys):
    project(REPO_ID)
    assert pivot(["run", "--select", "*turn_profiles"]) == 0, capsys.readouterr().err[-2000:]
    out = capsys.readouterr().out
    assert "materialized quarantine, rollout_rewards, rollouts, trajectories, turn_profiles, turns" in out
    assert pivot(["sql", "select distinct policy_fp from rollouts", "--format", "csv"]) == 0
    (policy_fp,) = capsys.readouterr().out.split()[1:]
    assert policy_fp.startswith(policy_fingerprint(REPO_ID) + "|transformers:")  # the commit, never the id
    assert pivot(["sql", "select count(*) as n from turn_profiles", "--format", "csv"]) == 0
    assert capsys.readouterr().out.split()[1:] == ["2"]


def test_pivot_run_with_an_id_not_in_the_cache_fails_before_any_asset(hf_home, project, capsys):
    import dagster as dg

    project("org/unknown")
    assert pivot(["run"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "org/unknown" in err and str(hf_home / "hub") in err and "hf download org/unknown" in err
    assert dg.DagsterInstance.get().get_runs() == []  # no run started, so nothing materialized
