"""conversation_id: the source-conversation group key every adapter fills (rule in ingest/formats.py)."""

from __future__ import annotations

import json
import random

from pivot_assets.core.ids import canonical_json, short_hash
from tests.ingest.reference import ingest_to_tables

from .test_streaming import _chat, assert_same_as_reference, streamed, write_lines

SYSTEM = {"role": "system", "content": "You book flights."}
USER = {"role": "user", "content": "Fly me to Rome."}
USER2 = {"role": "user", "content": "Then to Oslo."}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "book", "arguments": '{"to": "Rome"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "booked"}
REPLY = {"role": "assistant", "content": "Booked."}


def ids_of(tmp_path, records, name="c.jsonl") -> list[str]:
    rows, _, _ = streamed([{"path": str(write_lines(tmp_path / name, records))}])
    return [r["conversation_id"] for r in rows]


def test_rule_opening_ids_explicit_and_fallback(tmp_path):
    opening = [SYSTEM, USER]
    canonical_opening = [
        {"content": "You book flights.", "reasoning": None, "role": "system", "tool_call_id": None, "tool_calls": None},
        {"content": "Fly me to Rome.", "reasoning": None, "role": "user", "tool_call_id": None, "tool_calls": None}]
    plain, with_task, explicit, starts_with_assistant = ids_of(tmp_path, [
        _chat(*opening, CALL, RESULT, REPLY),
        _chat(*opening, CALL, RESULT, REPLY, USER2, REPLY, task_id=7),
        _chat(*opening, REPLY, conversation_id="conv-42"),
        _chat({"role": "assistant", "content": "Hello!"}, USER, REPLY),
    ])
    assert plain == short_hash(canonical_json({"ids": [], "opening": canonical_opening}))
    assert with_task == short_hash(canonical_json({"ids": [["task_id", "7"]], "opening": canonical_opening}))
    assert explicit == "conv-42"
    rows, _, _ = ingest_to_tables([{"path": str(tmp_path / "c.jsonl")}])
    assert starts_with_assistant == rows.column("trajectory_id").to_pylist()[3]  # nothing better: its own id


def test_continuations_of_one_conversation_share_it_and_others_do_not(tmp_path):
    short = _chat(SYSTEM, USER, CALL, RESULT, REPLY)
    longer = _chat(SYSTEM, USER, CALL, RESULT, REPLY, USER2, REPLY)
    other = _chat(SYSTEM, USER2, REPLY)
    a, b, c = ids_of(tmp_path, [short, longer, other])
    assert a == b != c


def test_nemo_gym_pivot_rows_cut_from_one_conversation_share_it(tmp_path, shared_data_dir):
    """Each shared single-step pivot row, plus an earlier pivot cut from the same conversation (its input up to
    its first function call, that call as the expected action): the two share the id, other rows do not."""
    path = shared_data_dir / "nemo-gym/resources_servers/single_step_tool_use_with_argument_comparison/data/example.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for record in records:
        rows.append(record)
        items = record["responses_create_params"]["input"]
        first_call = next((i for i, item in enumerate(items) if item.get("type") == "function_call"), None)
        if first_call is not None:
            call, cut = items[first_call], first_call
            while cut and (items[cut - 1].get("type") == "reasoning" or items[cut - 1].get("role") == "assistant"):
                cut -= 1  # the whole model call that made the function call is the pivot's action
            rows.append({**record, "responses_create_params": {**record["responses_create_params"], "input": items[:cut]},
                         "expected_action": {"type": "function_call", "name": call["name"], "arguments": call["arguments"]}})
    ids = ids_of(tmp_path, rows, "pivots.jsonl")
    assert len(ids) == len(rows) and len(rows) > len(records)
    original_ids = []
    position = 0
    for record in records:
        has_cut = any(item.get("type") == "function_call" for item in record["responses_create_params"]["input"])
        if has_cut:
            assert ids[position] == ids[position + 1]  # two pivots of one conversation
        original_ids.append(ids[position])
        position += 2 if has_cut else 1
    assert len(set(original_ids)) == len(records)  # different conversations differ
    assert_same_as_reference([{"path": str(tmp_path / "pivots.jsonl")}])


def test_tau2_trials_of_a_task_share_it(shared_data_dir):
    results = json.loads((shared_data_dir / "tau2-bench" / "airline_run1.json").read_text())
    rows, _, _ = ingest_to_tables([{"path": str(shared_data_dir / "tau2-bench")}])
    task_of = {n: sim["task_id"] for n, sim in enumerate(results["simulations"])}
    by_task: dict[str, set] = {}
    for record, cid in zip(rows.column("record").to_pylist(), rows.column("conversation_id").to_pylist()):
        by_task.setdefault(task_of[record], set()).add(cid)
    assert all(len(ids) == 1 for ids in by_task.values())
    assert len({next(iter(ids)) for ids in by_task.values()}) == len(by_task)


def test_every_format_fills_it_on_the_shared_data(shared_data_dir):
    for name in ("nemo-gym", "tau2-bench", "bfcl"):
        rows, _, _ = ingest_to_tables([{"path": str(shared_data_dir / name)}])
        assert all(isinstance(c, str) and c for c in rows.column("conversation_id").to_pylist()), name


def test_random_records_agree_between_sql_and_python(tmp_path):
    """A seeded mix of chat records (ids, openings, rewards, domains) through both adapters."""
    rng = random.Random(7)
    records = []
    for n in range(300):
        head = [SYSTEM] if rng.random() < 0.7 else []
        if rng.random() < 0.8:
            head.append({"role": rng.choice(["user", "human"]), "content": rng.choice(["hi", "Fly me.", "é\u00e9\n"])})
        body = [CALL, RESULT, REPLY] if rng.random() < 0.6 else [REPLY]
        extra = {k: v for k, v in (("task_id", rng.choice([None, 3, "t-3", "", True, 2.5])),
                                  ("session_id", rng.choice([None, "s", 0])),
                                  ("_ng_task_index", rng.choice([None, 1])),
                                  ("conversation_id", rng.choice([None, None, "c", ""])),
                                  ("reward", rng.choice([None, 0, 1.0, True, 0.5])),
                                  ("metadata", rng.choice([None, {"domain": "m"}, {"domain": ""}, "x"]))) if v is not None}
        records.append(_chat(*head, *body, **extra))
    assert_same_as_reference([{"path": str(write_lines(tmp_path / "mix.jsonl", records))}])
