"""Exports: the HF dataset loads from disk and feeds TRL's GRPOTrainer; NeMo-Gym rows round-trip
through our own Responses reader to the same states, tools and actions."""

from __future__ import annotations

import json

import polars as pl
import pytest

from pivot_assets.core.config import PivotsSection
from pivot_assets.core.ids import canonical_json, trajectory_id, turn_id
from pivot_assets.core.shapes import (
    action_from_message,
    action_tool_names,
    to_template_messages,
)
from pivot_assets.curation.exports import (
    iter_pivot_states,
    responses_items,
    save_hf,
    to_hf_dataset,
    to_nemo_gym_rows,
    write_jsonl,
)
from pivot_assets.curation.selection import select_pivots
from tests.curation.test_contracts import build_world
from tests.ingest.reference import iter_ingest

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "book", "description": "Book a flight",
                                      "parameters": {"type": "object", "properties": {"flight": {"type": "string"}, "seats": {"type": "integer"}}}}},
]


def _m(role, content=None, reasoning=None, tool_calls=None, tool_call_id=None):
    return {"role": role, "content": content, "reasoning": reasoning, "tool_calls": tool_calls, "tool_call_id": tool_call_id}


def _call(i, name, args):
    return {"id": f"call_{i}", "name": name, "arguments": canonical_json(args)}


def rich_world():
    """One trajectory with reasoning, text + calls in one message, a parallel batch, and heterogeneous arguments."""
    messages = [
        _m("system", "You are a travel agent."),
        _m("user", "Weather in Paris and Cairo, then book AF1 for 2."),
        _m("assistant", "Checking both.", reasoning="Two cities: two calls.",
           tool_calls=[_call(1, "get_weather", {"city": "Paris"}), _call(2, "get_weather", {"city": "Cairo"})]),
        _m("tool", '{"temp":18}', tool_call_id="call_1"),
        _m("tool", '{"temp":35}', tool_call_id="call_2"),
        _m("assistant", None, reasoning="Now book.", tool_calls=[_call(3, "book", {"flight": "AF1", "seats": 2})]),
        _m("tool", '{"ok":true}', tool_call_id="call_3"),
        _m("assistant", "Booked AF1 for 2. Paris 18C, Cairo 35C."),
    ]
    traj = trajectory_id(messages, TOOLS)
    trajectories = pl.DataFrame([{"trajectory_id": traj, "source": "handmade", "record": "0", "source_format": "openai_chat",
                                  "domain": "travel", "messages": messages, "tools": canonical_json(TOOLS), "outcome_reward": 1.0}])
    turns, profiles = [], []
    for t, index in enumerate(i for i, m in enumerate(messages) if m["role"] == "assistant"):
        kind, action = action_from_message(messages[index])
        tid = turn_id(traj, index)
        turns.append({"turn_id": tid, "trajectory_id": traj, "domain": "travel", "message_index": index, "turn_index": t,
                      "action_kind": kind, "expert_action": canonical_json(action), "tool_names": action_tool_names(action)})
        profiles.append({"turn_id": tid, "trajectory_id": traj, "domain": "travel", "policy_fp": "p", "verifier_fp": "v", "k": 4,
                         "reward_mean": 0.25 * (t + 1), "reward_var": 0.25 * (t + 1) * (1 - 0.25 * (t + 1)),
                         "reward_std": (0.25 * (t + 1) * (1 - 0.25 * (t + 1))) ** 0.5, "n_pass": t + 1, "n_distinct_actions": 2})
    pivots = select_pivots(pl.DataFrame(profiles), pl.DataFrame(turns), PivotsSection(lambda_diff=1.0))["pivots_mixed"]
    assert pivots.height == 3
    return pivots, trajectories


@pytest.fixture(scope="module")
def worlds():
    world = build_world()
    return [(world["pivots_mixed"], world["trajectories"]), rich_world()]


def test_hf_export_loads_from_disk_with_chat_shaped_prompts(worlds, tmp_path):
    from datasets import load_from_disk

    for n, (pivots, trajectories) in enumerate(worlds):
        out = save_hf(to_hf_dataset(pivots, trajectories), tmp_path / f"hf{n}")
        dataset = load_from_disk(str(out))
        assert len(dataset) == pivots.height
        assert {"prompt", "tools", "expert_action", "turn_id", "domain", "reward_mean", "reward_var", "k"} <= set(dataset.column_names)
        for row, (pivot, state, tools) in zip(dataset, iter_pivot_states(pivots, trajectories)):
            assert row["turn_id"] == pivot["turn_id"] and row["expert_action"] == pivot["expert_action"]
            assert json.loads(row["tools"]) == tools
            # Same messages as the profiling prompt renderer sees; absent keys come back as None, no calls as [].
            expected = to_template_messages(state)
            assert [{k: v for k, v in m.items() if v not in (None, [])} for m in row["prompt"]] == expected
    rich = load_from_disk(str(tmp_path / "hf1"))
    calls = [c for row in rich for m in row["prompt"] for c in (m["tool_calls"] or [])]
    # Heterogeneous argument objects stay exactly themselves (no merged struct with null keys).
    assert {"city": "Paris"} in [c["function"]["arguments"] for c in calls]
    assert {"flight": "AF1", "seats": 2} in [c["function"]["arguments"] for c in calls]
    assert all(c["type"] == "function" for c in calls)


def test_nemo_gym_rows_round_trip_through_the_responses_reader(worlds, tmp_path):
    for n, (pivots, trajectories) in enumerate(worlds):
        path = tmp_path / f"pivots{n}.jsonl"
        assert write_jsonl(to_nemo_gym_rows(pivots, trajectories), path) == pivots.height
        read = [row for kind, row in iter_ingest([{"path": str(path), "format": "responses"}]) if kind == "trajectory"]
        assert len(read) == pivots.height
        for back, (pivot, state, tools) in zip(read, iter_pivot_states(pivots, trajectories)):
            assert back["messages"][:-1] == state
            kind, action = action_from_message(back["messages"][-1])
            expert = json.loads(pivot["expert_action"])
            assert kind == pivot["action_kind"] and _strip_ids(action) == _strip_ids(expert)
            assert json.loads(back["tools"]) == tools
            assert back["domain"] == pivot["domain"]


def _strip_ids(action: dict) -> dict:
    if action["type"] == "function_call_batch":
        return {"type": action["type"], "calls": [_strip_ids(c) for c in action["calls"]]}
    if action["type"] == "function_call":
        return {"type": "function_call", "name": action["name"], "arguments": json.loads(action["arguments"])}
    return action


def test_nemo_gym_row_shape_matches_the_shared_example(worlds, shared_data_dir):
    example_path = shared_data_dir / "nemo-gym/resources_servers/single_step_tool_use_with_argument_comparison/data/example.jsonl"
    if not example_path.is_file():
        pytest.skip(f"{example_path} not found")
    example = json.loads(example_path.read_text().splitlines()[0])
    row = next(to_nemo_gym_rows(*worlds[1]))
    assert set(row["responses_create_params"]) <= set(example["responses_create_params"])
    assert {t["type"] for t in row["responses_create_params"]["tools"]} == {"function"}
    assert set(row["responses_create_params"]["tools"][0]) <= set(example["responses_create_params"]["tools"][0])
    assert row["agent_ref"] == {"type": "responses_api_agents", "name": "single_step_tool_use_with_argument_comparison_agent"}
    example_items = {(i.get("type"), i.get("role")) for i in example["responses_create_params"]["input"]}
    ours = {(i.get("type"), i.get("role")) for i in row["responses_create_params"]["input"]}
    assert ours - {("function_call", None), ("function_call_output", None)} <= example_items
    assert set(row["expected_action"]) <= {"type", "name", "arguments", "content", "calls"}


def test_real_nemo_gym_pivot_rows_survive_ingest_and_export(shared_data_dir, tmp_path):
    """Shared example rows -> our trajectories -> pivot of their last turn -> export -> the same input items' content."""
    source = shared_data_dir / "nemo-gym/resources_servers/single_step_tool_use_with_argument_comparison/data"
    rows = [row for kind, row in iter_ingest([{"path": str(source / "example.jsonl"), "format": "responses"}]) if kind == "trajectory"]
    # an ingest that reads nothing from the example is the regression this test is here to catch: fail, don't skip
    assert rows, f"no trajectories read from {source / 'example.jsonl'}"
    trajectories = pl.DataFrame(rows)
    pivots = pl.DataFrame([
        {"turn_id": turn_id(r["trajectory_id"], len(r["messages"]) - 1), "trajectory_id": r["trajectory_id"], "domain": r["domain"],
         "message_index": len(r["messages"]) - 1, "action_kind": action_from_message(r["messages"][-1])[0],
         "expert_action": canonical_json(action_from_message(r["messages"][-1])[1]), "selection_rank": i + 1, "pivot_set": "cand"}
        for i, r in enumerate(rows)
    ])
    originals = [json.loads(line) for line in (source / "example.jsonl").read_text().splitlines() if line.strip()]
    exported = list(to_nemo_gym_rows(pivots, trajectories))
    # one trajectory per example row, one exported row per pivot: zip alone would hide a dropped or an extra row
    assert len(rows) == len(originals) and len(exported) == len(originals)
    for ours, original in zip(exported, originals):
        assert _strip_ids(ours["expected_action"]) == _strip_ids(original["expected_action"])
        texts = [_item_text(i) for i in ours["responses_create_params"]["input"]]
        assert texts == [_item_text(i) for i in original["responses_create_params"]["input"]]


def _item_text(item: dict):
    if item["type"] == "reasoning":
        return ("reasoning", "".join(s["text"] for s in item["summary"]))
    if item["type"] == "message":
        content = item["content"]
        return (item["role"], content if isinstance(content, str) else "".join(p["text"] for p in content))
    if item["type"] == "function_call":
        return ("call", item["name"], json.loads(item["arguments"]))
    return ("output", item["output"])


def test_state_errors_are_clear(worlds):
    pivots, trajectories = worlds[1]
    with pytest.raises(ValueError, match="not in trajectories"):
        list(iter_pivot_states(pivots, trajectories.head(0)))
    with pytest.raises(ValueError, match="is not an assistant message"):
        list(iter_pivot_states(pivots.with_columns(pl.lit(1).alias("message_index")), trajectories))
    with pytest.raises(ValueError, match="unknown role"):
        responses_items([_m("robot", "hi")])


@pytest.mark.scenario
def test_hf_export_feeds_grpo_trainer_unchanged(worlds, tmp_path, tiny_model_dir):
    """load_from_disk -> GRPOTrainer(train_dataset=...) -> one optimizer step, no column edits. The dataset's plumbing
    is under test, not the model: the tiny random-weight policy (tests/tiny_model.py) stands in for it."""
    from datasets import load_from_disk
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    save_hf(to_hf_dataset(*worlds[1]), tmp_path / "hf")
    dataset = load_from_disk(str(tmp_path / "hf"))
    seen: dict[str, list] = {}

    def reward_names_the_expert_tool(prompts, completions, expert_action, tools, **kwargs):
        seen.setdefault("expert_action", []).extend(expert_action)
        seen.setdefault("prompts", []).extend(prompts)
        names = [c.get("name", "") for c in map(json.loads, expert_action)]
        return [float(bool(n) and n in c[0]["content"]) for n, c in zip(names, completions)]

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=4, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, seed=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward_names_the_expert_tool, args=args,
                          train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 1
    assert set(seen["expert_action"]) <= set(dataset["expert_action"])
    assert all(isinstance(p, list) and p[0]["role"] == "system" for p in seen["prompts"])  # conversational prompts
