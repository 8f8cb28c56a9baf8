"""`pivot export --format nemo-gym` rows carry the profile as NVIDIA's published pivot rows do, and read the way
NeMo-RL's pivot data script and NeMo-Gym's pivot validator read them (their reading lines ported below)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.curation.test_exports_streaming import profiled_warehouse

from pivot_jobs.cli import main
from pivot_assets.core.warehouse import Warehouse

DATASET = "nemo-gym/resources_servers/single_step_tool_use_with_argument_comparison"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, shared_data_dir) -> Warehouse:
    return profiled_warehouse(tmp_path_factory.mktemp("wh"), [{"path": str(shared_data_dir / DATASET)}])


def export(warehouse: Warehouse, tmp_path: Path, pivot_set: str, *extra: str) -> tuple[int, Path]:
    config = tmp_path / "pivot.yaml"
    config.write_text(f"warehouse: {warehouse.root}\n")
    out = tmp_path / f"{pivot_set}.jsonl"
    code = main(["export", "--config", str(config), "--set", pivot_set, "--format", "nemo-gym", "--out", str(out), *extra])
    return code, out


def read_like_nemo_rl(path: Path, reward_mean_max: float | None, profile_key: str = "qwen_235b_info") -> list[dict]:
    """The rows NeMo-RL keeps: the reading and filtering lines of main() in NVIDIA-NeMo/RL
    examples/nemo_gym/prepare_conversational_tool_use_pivot_data.py (PR #3894), ported; the shuffle and the
    train/val split after them are left out."""
    required_keys = ("responses_create_params", "expected_action", "agent_ref")
    expected_action_types = ("message", "function_call", "function_call_batch")
    kept = []
    for line_number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        row = json.loads(line)
        missing_keys = [key for key in required_keys if key not in row]
        if missing_keys:
            raise ValueError(f"line {line_number}: missing required keys {missing_keys}")
        action_type = row["expected_action"].get("type")
        if action_type not in expected_action_types:
            raise ValueError(f"line {line_number}: unexpected expected_action type {action_type!r}")
        reward_mean = (row.get(profile_key) or {}).get("reward_mean")
        if reward_mean is not None and reward_mean_max is not None and reward_mean > reward_mean_max:
            continue
        kept.append(row)
    return kept


def check_like_gym_validator(row: dict) -> None:
    """The structural row checks of NVIDIA-NeMo/Gym .agents/skills/nemo-gym-pivot-datasets/scripts/
    validate_pivot_dataset.py (validate_agent_ref, validate_responses_create_params, validate_expected_action,
    the tool-name check), condensed; the action types are the skill's three (SKILL.md)."""
    for key in ("responses_create_params", "expected_action", "agent_ref"):
        assert key in row, key
    assert row["agent_ref"]["type"] == "responses_api_agents" and row["agent_ref"]["name"]
    params = row["responses_create_params"]
    assert params.get("metadata", {}) is not None and params.get("tool_choice", "auto") == "auto"
    assert isinstance(params["input"], list) and params["input"] and isinstance(params["tools"], list)
    assert isinstance(params.get("parallel_tool_calls", False), bool)
    action = row["expected_action"]
    calls = {"function_call": [action], "function_call_batch": action.get("calls"), "message": []}[action["type"]]
    if action["type"] == "function_call_batch":
        assert len(calls) >= 2  # the validator refuses a batch of one: a model emits that as a plain call
    if action["type"] == "message":
        assert isinstance(action["content"], str)
    offered = {t["name"] for t in params["tools"]}
    for call in calls:
        assert call["type"] == "function_call" and call["name"] in offered
        json.loads(call["arguments"])


def test_rows_carry_the_profile_and_nemo_rl_filters_them_into_the_adv_set(warehouse, tmp_path):
    code, path = export(warehouse, tmp_path, "mixed")
    assert code == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    adv = set(warehouse.read("pivots_adv")["turn_id"])
    assert 0 < len(adv) < len(rows)  # the filter below has something to drop
    for row in rows:
        check_like_gym_validator(row)
        profile = row["qwen_235b_info"]
        assert set(profile) == {"rewards", "reward_mean", "reward_std", "reward_var"}
        assert len(profile["rewards"]) == row["pass_rate_total"] and sum(profile["rewards"]) == row["pass_rate_passed"]
        assert row["pass_rate"] == row["pass_rate_passed"] / row["pass_rate_total"]
        assert profile["reward_var"] == pytest.approx(profile["reward_std"] ** 2)
    # NeMo-RL's `--reward-mean-max 0.6` on the mixed set keeps exactly the adv set (lambda_diff 0.6)
    kept = read_like_nemo_rl(path, reward_mean_max=0.6)
    assert {row["metadata"]["turn_id"] for row in kept} == adv
    assert len(read_like_nemo_rl(path, reward_mean_max=None)) == len(rows)


def test_the_profile_key_is_configurable(warehouse, tmp_path, capsys):
    code, path = export(warehouse, tmp_path, "adv", "--profile-key", "nano_info")
    assert code == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows and all("nano_info" in row and "qwen_235b_info" not in row for row in rows)
    kept = read_like_nemo_rl(path, reward_mean_max=0.0, profile_key="nano_info")
    assert {row["metadata"]["turn_id"] for row in kept} == {r["metadata"]["turn_id"] for r in rows
                                                             if r["nano_info"]["reward_mean"] == 0.0}


@pytest.mark.parametrize("extra, message", [
    (("--profile-key", "agent_ref"), "profile key 'agent_ref' must be a non-empty name other than"),
    (("--profile-key", " "), "must be a non-empty name"),
])
def test_a_bad_profile_key_is_a_one_line_error(warehouse, tmp_path, capsys, extra, message):
    code, path = export(warehouse, tmp_path, "adv", *extra)
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not path.exists()


def test_profile_key_goes_with_nemo_gym_only(warehouse, tmp_path, capsys):
    config = tmp_path / "pivot.yaml"
    config.write_text(f"warehouse: {warehouse.root}\n")
    code = main(["export", "--config", str(config), "--format", "hf", "--out", str(tmp_path / "hf"),
                 "--profile-key", "x_info"])
    assert code == 2 and "goes with --format nemo-gym" in capsys.readouterr().err


def test_tau2_rows_carry_the_domains_tools_and_pass_the_validators_tool_name_check(shared_data_dir, tmp_path):
    """The shared tau2 run stores no tool schemas; with the airline tools file (as configs/tau2_airline.yaml gives
    it) every exported call, batches of calls included, names a tool its row offers."""
    sample = shared_data_dir / "tau2-bench" / "airline_run1.json"
    if not sample.is_file():
        pytest.skip(f"tau2 sample absent: {sample}")
    tools = Path(__file__).resolve().parents[2] / "configs" / "tools" / "tau2_airline.json"
    wh = profiled_warehouse(tmp_path / "wh", [{"path": str(sample), "tools": str(tools)}])
    code, path = export(wh, tmp_path, "mixed")
    assert code == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == wh.read("pivots_mixed").height > 0
    for row in rows:
        check_like_gym_validator(row)
        assert len(row["responses_create_params"]["tools"]) == 14
    assert {row["expected_action"]["type"] for row in rows} >= {"function_call", "message"}
    batches = [a for a in map(json.loads, wh.read("turns")["expert_action"]) if a["type"] == "function_call_batch"]
    assert batches and all(len(a["calls"]) >= 2 for a in batches)  # the run's parallel calls, in the batch shape
