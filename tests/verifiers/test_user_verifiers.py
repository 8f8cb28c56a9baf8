"""Verifiers from the user's own code (verifiers/user_verifiers.py): `module:Class` names and entry points.

A module written next to pivot.yaml scores a `pivot run`; editing it makes exactly the scores stale, and `pivot
run --stale` re-scores the cached samples without generating. Bad names fail in one line; the built-in verifiers
keep their fingerprints; docs/verifiers.md lists every built-in parameter and its example verifier runs.
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

import pytest

from pivot_jobs.cli import main as pivot
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.verifiers import Reason, build_verifier, verifier_names
from pivot_assets.verifiers.code_version import code_hash
from pivot_assets.verifiers.registry import _CLASSES
from pivot_assets.verifiers.user_verifiers import user_code_hash

REPO = Path(__file__).resolve().parents[2]
STAGES = "trajectories,turns,rollouts,rollout_rewards,turn_profiles"
FLAT_REWARD = '''
from pivot_assets.verifiers import Reason, Score, Verifier


class FlatReward(Verifier):
    """Pays every sample the same reward: the test edits the number."""

    name = "flat_reward"

    def score_parsed(self, expected, candidate, tools, state):
        return Score({reward}, Reason.OK, "pays {reward}")
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project dir as the working directory; sys.path is restored after the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # user_verifiers appends the dir its module was found in
    return tmp_path


def unique_module() -> str:
    """A module name no other test imported (modules stay in sys.modules for the process)."""
    return f"user_rewards_{uuid.uuid4().hex[:8]}"


def verifier_spec(module: str, cls: str = "FlatReward") -> dict:
    return {"name": f"{module}:{cls}"}


@pytest.mark.scenario
def test_a_module_beside_the_config_scores_and_its_edit_rescores_without_generating(project, tiny_model_dir, capsys):
    module = unique_module()
    source = project / f"{module}.py"
    source.write_text(FLAT_REWARD.format(reward=1.0))
    (project / "pivot.yaml").write_text(
        "warehouse: ./wh\nsample: {n_trajectories: 2, seed: 0}\n"
        f"policy: {{model: {tiny_model_dir}, k: 2, max_new_tokens: 8, limit_turns: 3}}\n"
        f"verifier: {{default: {{name: '{module}:FlatReward'}}}}\n")
    wh = Warehouse(project / "wh")
    assert pivot(["run", "--select", STAGES]) == 0
    rollouts, rewards = rows(wh, "rollouts"), rows(wh, "rollout_rewards")
    assert rollouts and {r["reward"] for r in rewards if r["reason"] == Reason.OK} == {1.0}
    scored = {key(r) for r in rewards if r["reason"] == Reason.OK}
    assert scored, "no sample reached the verifier"

    source.write_text(FLAT_REWARD.format(reward=0.25))  # the user edits the verifier
    capsys.readouterr()
    assert pivot(["stale"]) == 0
    stale = {line.split()[0] for line in capsys.readouterr().out.splitlines() if " STALE " in line}
    assert stale == {"rollout_rewards", "turn_profiles"}, stale
    assert pivot(["run", "--stale"]) == 0
    assert "materialized rollout_rewards, turn_profiles" in capsys.readouterr().out

    assert rows(wh, "rollouts") == rollouts  # the same samples, none generated again
    rescored = [r for r in rows(wh, "rollout_rewards") if r["verifier_fp"] != rewards[0]["verifier_fp"]]
    assert {key(r) for r in rescored if r["reason"] == Reason.OK} == scored
    assert {(r["reward"], r["detail"]) for r in rescored if r["reason"] == Reason.OK} == {(0.25, "pays 0.25")}
    new_fp = rescored[0]["verifier_fp"]  # every turn profiled again under the new verifier's fingerprint
    assert {r["turn_id"] for r in rows(wh, "turn_profiles") if r["verifier_fp"] == new_fp} == {r["turn_id"] for r in rewards}


def rows(wh: Warehouse, table: str) -> list[dict]:
    return sorted(wh.read_arrow(table).to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))


def key(row: dict) -> tuple:
    return row["turn_id"], row["sample_index"]



def test_the_fingerprint_follows_the_module_code_not_its_comments(project):
    module = unique_module()
    source = project / f"{module}.py"
    source.write_text(FLAT_REWARD.format(reward=1.0))
    first = build_verifier(verifier_spec(module))
    source.write_text(FLAT_REWARD.format(reward=1.0) + "# a comment changes no verdict\n")
    assert build_verifier(verifier_spec(module)).fingerprint == first.fingerprint
    source.write_text(FLAT_REWARD.format(reward=0.5))
    edited = build_verifier(verifier_spec(module))
    assert edited.fingerprint != first.fingerprint
    assert edited.score(call("f"), call("f")).reward == 0.5  # the module was reloaded: its new code scores


def test_a_subclass_of_a_built_in_verifier_is_fingerprinted_with_the_built_in_code(project, monkeypatch):
    module = unique_module()
    (project / f"{module}.py").write_text(
        "from pivot_assets.verifiers.tool_call import ToolCallVerifier\n\n\n"
        "class Lenient(ToolCallVerifier):\n    name = 'lenient'\n")
    verifier = build_verifier({"name": f"{module}:Lenient", "mode": "f1"})
    assert verifier.score(call("f", a=1), call("f", a=1)).reward == 1.0
    cls = type(verifier)
    before = user_code_hash(cls)
    monkeypatch.setattr("pivot_assets.verifiers.user_verifiers.code_hash",
                        lambda m: "edited" if m.endswith(".tool_call") else code_hash(m))
    assert user_code_hash(cls) != before


def test_an_entry_point_names_a_verifier(project, monkeypatch):
    package, name = unique_module(), f"flat_{uuid.uuid4().hex[:6]}"
    site = project / "site"
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text("")
    (site / package / "rewards.py").write_text(FLAT_REWARD.format(reward=0.75))
    dist = site / f"{package}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[pivot_curation.verifiers]\n{name} = {package}.rewards:FlatReward\n")
    monkeypatch.syspath_prepend(str(site))
    verifier = build_verifier(name)
    assert verifier.score(call("f"), "anything").reward == 0.75
    # nested: a stack step named by its entry point
    assert build_verifier({"name": "stack", "steps": [{"name": name}]}).score(call("f"), "x").reward == 0.75
    with pytest.raises(ValueError, match=rf"unknown verifier 'nope' \(known: .*entry points: .*{name}"):
        build_verifier("nope")


def test_pivot_verify_scores_with_a_user_verifier(project, capsys):
    module = unique_module()
    (project / f"{module}.py").write_text(FLAT_REWARD.format(reward=0.5))
    (project / "pairs.jsonl").write_text(json.dumps({"expected_action": call("f"), "candidate": "hello"}) + "\n")
    assert pivot(["verify", "--input", "pairs.jsonl", "--verifier", f"{module}:FlatReward"]) == 0
    assert json.loads(capsys.readouterr().out) == {"reward": 0.5, "reason": "OK", "detail": "pays 0.5"}


BAD_MODULE = '''
from pivot_assets.verifiers import Verifier


class NotAVerifier:
    pass


class NoScore(Verifier):
    name = "no_score"


class NoName(Verifier):
    def score_parsed(self, expected, candidate, tools, state):
        return None
'''


@pytest.mark.parametrize("cls, expected", [
    ("Missing", "has no 'Missing'"),
    ("NotAVerifier", "NotAVerifier is not a verifier: a verifier is a subclass of pivot_assets.verifiers.Verifier"),
    ("NoScore", "NoScore implements no score_parsed"),
    ("NoName", "NoName sets no `name`"),
])
def test_a_bad_class_is_a_one_line_config_error(project, capsys, cls, expected):
    module = unique_module()
    (project / f"{module}.py").write_text(BAD_MODULE)
    error = one_line_config_error(project, capsys, f"{module}:{cls}")
    assert f"verifier '{module}:{cls}': " in error and expected in error, error


@pytest.mark.parametrize("name, source, expected", [
    ("no_such_module_here:X", None, "no module named 'no_such_module_here' on sys.path or in "),
    ("{module}:X", "def broken(:\n", "importing {module} failed: SyntaxError: "),
    ("{module}:X", "import no_such_dependency_here\n", "importing {module} failed: ModuleNotFoundError: "),
    ("{module}:", "", "write a class in a module as module:Class"),
    ("no_such_entry_point", None, "unknown verifier 'no_such_entry_point' (known: exact"),
])
def test_a_bad_name_is_a_one_line_config_error(project, capsys, name, source, expected):
    module = unique_module()
    if source is not None:
        (project / f"{module}.py").write_text(source)
    error = one_line_config_error(project, capsys, name.format(module=module))
    assert expected.format(module=module) in error, error


def one_line_config_error(project: Path, capsys, name: str) -> str:
    """What `pivot stale` says of a config whose verifier is `name`: one line, a config error."""
    (project / "pivot.yaml").write_text(f"warehouse: ./wh\nverifier: {{default: {{name: '{name}'}}}}\n")
    capsys.readouterr()
    assert pivot(["stale"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("config error: ") and "pivot.yaml: verifier.default: " in error, error
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    return error


def call(name: str, **args) -> dict:
    return {"type": "function_call", "name": name, "arguments": json.dumps(args)}


# -- docs/verifiers.md ---------------------------------------------------------------------------------------------

DOCS = (REPO / "docs" / "verifiers.md").read_text(encoding="utf-8")


def parameter_table() -> dict[str, dict[str, tuple[str, str]]]:
    """docs' table of built-in parameters: verifier -> parameter -> (type cell, default cell)."""
    table: dict[str, dict[str, tuple[str, str]]] = {}
    for line in DOCS.split("<!-- built-in parameters -->")[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(\w+)`", cells[0]) if len(cells) >= 4 else None
        if match:
            table.setdefault(match[1], {})
            if cells[1] != "none":
                table[match[1]][cells[1].strip("`")] = (cells[2], cells[3])
        elif table and not line.startswith("|"):
            break
    return table


def test_docs_list_every_built_in_parameter_with_its_type_and_default():
    table = parameter_table()
    assert set(table) == set(verifier_names())
    for name in verifier_names():
        params = _CLASSES[name].params
        assert set(table[name]) == set(params), name
        for param, p in params.items():
            default = "required" if p.required else f"`{json.dumps(p.default)}`"
            assert table[name][param] == (p.kind, default), (name, param)


def test_the_docs_example_builds_and_scores(project):
    example = re.search(r"```python\n(# my_rewards\.py.*?)```", DOCS, re.S)[1]
    module = unique_module()
    (project / f"{module}.py").write_text(example)
    verifier = build_verifier({"name": f"{module}:ShippingVerifier", "threshold": 0.5})
    expected = call("ship", order="A1", country="FR")
    assert verifier.score(expected, call("ship", order="A1", country="DE")).reward == 1.0
    assert verifier.score(expected, call("ship", order="B2", country="DE")).reason == Reason.ARGUMENT_VALUE_DIFFERENT
    assert verifier.score(expected, "I shipped it").reason == Reason.SPOKE_INSTEAD_OF_CALL


def test_built_in_fingerprints_do_not_depend_on_user_verifiers(project):
    """The user lookup lives outside every built-in's code closure (registry.py and base.py are in all of them)."""
    from pivot_assets.verifiers.code_version import module_closure

    for name in verifier_names():
        assert "user_verifiers" not in module_closure(_CLASSES[name].__module__.rsplit(".", 1)[-1])


def test_a_module_beside_a_config_named_from_elsewhere_is_found(project, monkeypatch):
    """`pivot run --config other/pivot.yaml` from another directory: the module next to that config is found."""
    from pivot_assets.core.config import load_config
    from pivot_assets.verifiers.sets import VerifierSets

    module = unique_module()
    other = project / "other"
    other.mkdir()
    (other / f"{module}.py").write_text(FLAT_REWARD.format(reward=0.25))
    (other / "pivot.yaml").write_text(json.dumps({"verifier": {"default": verifier_spec(module)}}))
    monkeypatch.chdir(project / "..")
    sets = VerifierSets.from_config(load_config(other / "pivot.yaml"))
    assert sets.profiling.for_domain("any").score(call("f"), call("f")).reward == 0.25
