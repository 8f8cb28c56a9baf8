"""Scoring streams each turn's state once: the same rewards as scoring every rollout with its own freshly built
state (the reference below), each turn's state and tools shared by its K samples, parts of whole turns."""

from __future__ import annotations

import json
import random

import duckdb
import pyarrow as pa
import pytest

from pivot_assets.core.catalog import ROLLOUTS_SCHEMA
from pivot_assets.core.ids import canonical_json
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.ingest.inputs import write_ingest, write_turns
from pivot_assets.profiling.profiler import score_rollouts
from pivot_assets.verifiers import DomainVerifiers, parse_candidate

K = 4


def synthetic_completion(action: dict, rng: random.Random) -> str:
    """The expert call, the same call with a changed argument, or a plain reply."""
    draw = rng.random()
    if action["type"] == "function_call" and draw < 0.7:
        arguments = json.loads(action["arguments"])
        if draw > 0.4 and arguments:
            arguments[next(iter(arguments))] = "something else"
        return "<tool_call>" + json.dumps({"name": action["name"], "arguments": arguments}) + "</tool_call>"
    if action["type"] == "message" and draw < 0.6:
        return action["content"]
    return "Let me check that for you."


@pytest.fixture
def warehouse(tmp_path, shared_data_dir):
    wh = Warehouse(tmp_path / "wh")
    write_ingest(wh, [{"path": str(shared_data_dir / "tau2-bench")}, {"path": str(shared_data_dir / "nemo-gym")}])
    write_turns(wh)
    turns = duckdb.sql(f"select turn_id, trajectory_id, expert_action from read_parquet('{wh.table_path('turns')}')").fetchall()
    rng = random.Random(0)
    rows = [{"turn_id": tid, "trajectory_id": trid, "policy_fp": "P", "sampling_fp": "S", "sample_index": s,
             "completion": synthetic_completion(json.loads(action), rng), "n_prompt_tokens": 1,
             "n_completion_tokens": 1, "finish_reason": "stop"}
            for tid, trid, action in turns for s in range(K)]
    rng.shuffle(rows)  # parts in any order: scoring must not depend on it
    for start in range(0, len(rows), 700):
        wh.append_part("rollouts", pa.Table.from_pylist(rows[start:start + 700], schema=ROLLOUTS_SCHEMA))
    return wh, [t[0] for t in turns]


def reference_rewards(wh: Warehouse, verifiers, turn_ids: list[str]) -> list[tuple]:
    """Every rollout scored with a state built for it alone, from the trajectory read for it alone."""
    trajectories = {r["trajectory_id"]: r for r in wh.read_arrow("trajectories").to_pylist()}
    turns = {r["turn_id"]: r for r in wh.read_arrow("turns").to_pylist()}
    out = []
    for rollout in wh.read_arrow("rollouts").to_pylist():
        if rollout["turn_id"] not in turn_ids:
            continue
        turn = turns[rollout["turn_id"]]
        trajectory = trajectories[turn["trajectory_id"]]
        item = {"domain": turn["domain"], "expected_action": turn["expert_action"], "candidate": rollout["completion"],
                "tools": trajectory["tools"], "state": trajectory["messages"][: turn["message_index"]]}
        score = verifiers.score_rows([item])[0]
        action, _ = parse_candidate(rollout["completion"])
        out.append((rollout["turn_id"], rollout["sample_index"], float(score.reward), score.reason, score.detail,
                    canonical_json(action) if action is not None else None, turn["domain"]))
    return sorted(out)


def stored_rewards(wh: Warehouse) -> list[tuple]:
    return sorted(duckdb.sql(f"select turn_id, sample_index, reward, reason, detail, action, domain "
                             f"from read_parquet('{wh.source_glob('rollout_rewards')}')").fetchall())


def test_streamed_scoring_equals_per_rollout_reference(warehouse):
    wh, turn_ids = warehouse
    verifiers = DomainVerifiers({"default": {"name": "tool_call"}})
    half = sorted(turn_ids)[: len(turn_ids) // 2]
    first = score_rollouts(wh, verifiers, "P", "S", half)
    rest = score_rollouts(wh, verifiers, "P", "S", turn_ids)  # resumes: only the other half
    again = score_rollouts(wh, verifiers, "P", "S", turn_ids)
    assert first["rollouts_scored"] == len(half) * K and first["rollouts_scored"] + rest["rollouts_scored"] == len(turn_ids) * K
    assert again["rollouts_scored"] == 0
    assert stored_rewards(wh) == reference_rewards(wh, verifiers, set(turn_ids))


class Recording(DomainVerifiers):
    """The real verifiers, recording the items they are given."""

    def __init__(self, config):
        super().__init__(config)
        self.items: list[dict] = []

    def score_rows(self, rows):
        rows = list(rows)
        self.items.extend(rows)
        return super().score_rows(rows)


def test_each_turn_state_is_built_once_and_shared(warehouse):
    wh, turn_ids = warehouse
    verifiers = Recording({"default": {"name": "tool_call"}})
    from pivot_assets.profiling import profiler

    stats = score_rollouts(wh, verifiers, "P", "S", turn_ids)
    assert stats["rollouts_scored"] == len(verifiers.items) == len(turn_ids) * K
    by_state = {id(item["state"]) for item in verifiers.items}
    by_tools = {id(item["tools"]) for item in verifiers.items}
    assert len(by_state) == len(turn_ids)  # one state object per turn, shared by its K samples
    assert len(by_tools) <= len({r["trajectory_id"] for r in wh.read_arrow("turns").to_pylist()})  # one per trajectory
    assert all(isinstance(item["tools"], list) for item in verifiers.items)  # parsed once, not JSON text per sample
    # parts hold whole turns
    for part in wh.part_files("rollout_rewards"):
        counts = duckdb.sql(f"select count(*) from read_parquet('{part}') group by turn_id").fetchall()
        assert all(n == (K,) for n in counts)
    assert profiler.SCORE_CHUNK > 0
