"""The embedded synthetic sample: deterministic, ingests cleanly, shaped for a tiny model to learn."""

from __future__ import annotations

import json
from collections import Counter

from pivot_assets.ingest.sample_data import (
    DEFAULT_N,
    SHOP_TOOLS,
    generate_trajectories,
    write_sample,
)
from pivot_assets.ingest.turn_extraction import extract_turns
from tests.ingest.reference import ingest_to_tables


def test_deterministic():
    assert generate_trajectories(10, seed=3) == generate_trajectories(10, seed=3)
    assert generate_trajectories(10, seed=3) != generate_trajectories(10, seed=4)


def test_default_sample_ingests_without_quarantine(tmp_path):
    path = write_sample(tmp_path / "sub" / "sample.jsonl")
    assert path.read_text() == write_sample(tmp_path / "again.jsonl").read_text()
    trajectories, quarantine, counts = ingest_to_tables([{"path": str(path)}])
    assert counts == {"trajectory": DEFAULT_N, "quarantine": 0, "duplicate": 0, "read": DEFAULT_N}
    rows = trajectories.to_pylist()
    assert {r["domain"] for r in rows} == {"toy_shop"} and {r["source_format"] for r in rows} == {"openai"}
    assert {r["outcome_reward"] for r in rows} == {0.0, 1.0}
    per_traj = Counter(sum(m["role"] == "assistant" for m in r["messages"]) for r in rows)
    assert set(per_traj) <= {2, 3, 4, 5} and len(per_traj) >= 3
    turns = [t for r in rows for t in extract_turns(r)]
    assert Counter(t["action_kind"] for t in turns).keys() == {"tool_call", "message"}
    tool_names = {tool["function"]["name"] for tool in SHOP_TOOLS}
    assert {n for t in turns for n in t["tool_names"]} == tool_names  # every tool is used


def test_arguments_appear_verbatim_in_the_user_message():
    for record in generate_trajectories(40, seed=1):
        last_user = None
        for m in record["messages"]:
            if m["role"] == "user":
                last_user = m["content"]
            for call in m.get("tool_calls") or []:
                for value in json.loads(call["function"]["arguments"]).values():
                    assert str(value) in last_user, (value, last_user)
