"""BFCL as a real input through `pivot run`: single-turn items with their accepted values, multi-turn conversations
built by BFCL's own simulated APIs, and what is quarantined (no answer, a failing call) instead of dropped.

The data is a slice of bfcl-eval's own files (installed by `make setup`): the first lines of each category and
their possible answers, in a temp dir laid out as BFCL lays it out (possible_answer/ beside the data)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pivot_assets.core.ids import canonical_json
from pivot_assets.ingest import bfcl_records
from pivot_assets.ingest.turn_extraction import extract_turns
from pivot_jobs.cli import main as pivot
from tests.ingest.reference import ingest_to_tables

bfcl_eval = pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed (`make setup` installs it)")
BFCL_DATA = Path(bfcl_eval.__file__).parent / "data"
SINGLE = ("simple_python", "multiple", "parallel", "parallel_multiple",
          "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
MULTI = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
N = 3  # items per category
# two base-0 copies whose first call fails: one returns BFCL's error dict, one cannot bind its arguments
BROKEN = {"multi_turn_base_900": "cd(folder='no_such_folder')", "multi_turn_base_901": "mkdir(no_such_arg='temp')"}


def lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_slice(root: Path) -> dict:
    """The first N items of every category (irrelevance: no answers, as BFCL ships it) + the broken items."""
    (root / "possible_answer").mkdir(parents=True)
    items: dict[str, list[dict]] = {}
    for category in (*SINGLE, *MULTI, "irrelevance"):
        name = f"BFCL_v4_{category}.json"
        head = lines(BFCL_DATA / name)[:N]
        items[category] = [json.loads(line) for line in head]
        if category == "multi_turn_base":
            base0 = items[category][0]
            head += [json.dumps({**base0, "id": item_id}) for item_id in BROKEN]
        (root / name).write_text("\n".join(head) + "\n")
        if category == "irrelevance":
            continue
        ids = {json.loads(line)["id"] for line in head}
        answers = [line for line in lines(BFCL_DATA / "possible_answer" / name) if json.loads(line)["id"] in ids]
        answers += [json.dumps({"id": item_id, "ground_truth": [[call]] + [[]] * (len(items[category][0]["question"]) - 1)})
                    for item_id, call in BROKEN.items() if category == "multi_turn_base"]
        (root / "possible_answer" / name).write_text("\n".join(answers) + "\n")
    return items


def answers_of(category: str) -> dict[str, list]:
    path = BFCL_DATA / "possible_answer" / f"BFCL_v4_{category}.json"
    return {r["id"]: r["ground_truth"] for r in map(json.loads, lines(path))}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One `pivot run --select trajectories,turns` over the slice; its tables and the ingest metadata."""
    import dagster as dg

    root = tmp_path_factory.mktemp("bfcl")
    items = write_slice(root / "data")
    (root / "pivot.yaml").write_text(f"warehouse: ./wh\ninputs:\n  - path: {root / 'data'}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        mp.delenv("PIVOT_CONFIG", raising=False)
        mp.chdir(root)
        assert pivot(["run", "--select", "trajectories,turns"]) == 0
        event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey("trajectories"))
    metadata = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    wh = root / "wh"
    read = lambda table: pq.read_table(wh / f"{table}.parquet").to_pylist()  # noqa: E731
    trajectories = read("trajectories")
    return {"items": items, "metadata": metadata, "trajectories": trajectories, "quarantine": read("quarantine"),
            "turns": read("turns"), "by_conversation": {t["conversation_id"]: t for t in trajectories},
            "by_domain": _by_domain(trajectories)}


def _by_domain(trajectories: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in trajectories:
        out.setdefault(t["domain"], []).append(t)
    return out


def trajectory_of(run, item_id: str) -> dict:
    """The ingested trajectory of one BFCL item (by its file and record number)."""
    category = bfcl_records.category(item_id)
    record = next(i for i, item in enumerate(run["items"][category]) if item["id"] == item_id)
    return next(t for t in run["trajectories"]
                if t["source"].endswith(f"BFCL_v4_{category}.json") and t["record"] == record)


# ---------------------------------------------------------------------------------------------- counts


def test_counts_are_exact_and_nothing_is_skipped_silently(run):
    meta = run["metadata"]
    n_single, n_multi = N * len(SINGLE), N * len(MULTI)
    # long_context_1 executes exactly like base_1 (its long context shows in no ground-truth result): a duplicate
    assert (meta["read"], meta["ingested"], meta["quarantined"], meta["duplicates"]) == (
        n_single + n_multi + len(BROKEN) + N, n_single + n_multi - 1, len(BROKEN) + N, 1)
    assert meta["read"] == meta["ingested"] + meta["quarantined"] + meta["duplicates"]
    assert meta["by_format"] == {"bfcl": n_single, "bfcl_multi_turn": n_multi - 1}
    # the possible answers are read with their data files, and named as skipped (12 answer files)
    assert meta["skipped_files"] == len(SINGLE) + len(MULTI)
    assert all("possible_answer" in s["path"] and s["reason"].startswith("BFCL possible answers") for s in meta["skipped"])
    assert len(run["trajectories"]) == meta["ingested"] and len(run["quarantine"]) == meta["quarantined"]


def test_items_without_an_answer_and_failing_calls_are_quarantined_with_their_reason(run):
    reasons = {(Path(q["source"]).name, q["record"]): q["reason"] for q in run["quarantine"]}
    for record in range(N):
        assert reasons[("BFCL_v4_irrelevance.json", record)].startswith("bfcl_no_answer: no possible answers")
    assert reasons[("BFCL_v4_multi_turn_base.json", N)] == (
        "bfcl_call_failed: turn 0 call 0: \"cd(folder='no_such_folder')\" returned an error: "
        "cd: 'no_such_folder': No such file or directory")
    assert reasons[("BFCL_v4_multi_turn_base.json", N + 1)].startswith(
        "bfcl_call_failed: turn 0 call 0: \"mkdir(no_such_arg='temp')\": TypeError")
    assert "multi_turn_900" not in run["by_conversation"]


# ---------------------------------------------------------------------------------------------- single-turn


def test_single_turn_items_are_one_turn_with_the_accepted_values(run):
    for category in SINGLE:
        answers = answers_of(category)
        for item in run["items"][category]:
            traj = trajectory_of(run, item["id"])
            assert traj["conversation_id"] == item["id"] and traj["domain"] == f"bfcl_{category}"
            assert [m["content"] for m in traj["messages"][:-1]] == [m["content"] for m in item["question"][0]]
            assert [t["function"]["name"] for t in json.loads(traj["tools"])] == [f["name"] for f in item["function"]]
            turns = [t for t in run["turns"] if t["trajectory_id"] == traj["trajectory_id"]]
            assert len(turns) == 1
            action = json.loads(turns[0]["expert_action"])
            calls = action["calls"] if action["type"] == "function_call_batch" else [action]
            truth = answers[item["id"]]
            assert [{c["name"]: c["acceptable"]} for c in calls] == truth
            assert (action["type"] == "function_call_batch") == (len(truth) > 1)


def test_expert_action_holds_the_first_accepted_value_and_every_accepted_value(run):
    traj = trajectory_of(run, "simple_python_0")
    (turn,) = [t for t in run["turns"] if t["trajectory_id"] == traj["trajectory_id"]]
    assert turn["expert_action"] == canonical_json({
        "acceptable": {"base": [10], "height": [5], "unit": ["units", ""]},
        "arguments": canonical_json({"base": 10, "height": 5, "unit": "units"}),
        "name": "calculate_triangle_area", "type": "function_call"})
    call = traj["messages"][-1]["tool_calls"][0]
    assert json.loads(call["acceptable"]) == {"base": [10], "height": [5], "unit": ["units", ""]}


def test_the_sql_turns_equal_the_python_reference(run):
    reference = [turn for traj in run["trajectories"] for turn in extract_turns(traj)]
    assert run["turns"] == reference


# ---------------------------------------------------------------------------------------------- multi-turn


def bfcl_results(item: dict, truth: list[list[str]], model_name: str) -> list[str]:
    """The results BFCL's own executor returns for the ground truth, turn by turn (fresh instances: a unique name)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
        execute_multi_turn_func_call,
    )

    results = []
    for calls in truth:
        out, _ = execute_multi_turn_func_call(calls, item["initial_config"], item["involved_classes"], model_name,
                                              item["id"], long_context="long_context" in item["id"])
        results += out
    return results


def test_multi_turn_tool_results_are_what_bfcls_apis_return(run):
    n_calls = 0
    for category in MULTI:
        answers = answers_of(category)
        for item in run["items"][category]:
            if item["id"] == "multi_turn_long_context_1":
                continue  # the duplicate of base_1
            traj = trajectory_of(run, item["id"])
            truth = answers[item["id"]]
            calls = [m["tool_calls"][0] for m in traj["messages"] if m["role"] == "assistant"]
            results = [m["content"] for m in traj["messages"] if m["role"] == "tool"]
            assert len(calls) == len(results) == sum(len(t) for t in truth)
            assert results == bfcl_results(item, truth, f"pivot_test_{category}")
            assert [c["name"] for c in calls] == [text.split("(", 1)[0] for turn in truth for text in turn]
            assert all(c["acceptable"] is None for c in calls)
            n_calls += len(calls)
    multi_turns = [t for t in run["turns"] if t["domain"].startswith("bfcl_multi_turn")]
    assert len(multi_turns) == n_calls and all(t["action_kind"] == "tool_call" for t in multi_turns)


def test_positional_arguments_are_named_from_the_api(run):
    traj = trajectory_of(run, "multi_turn_base_0")  # its answer holds "sort('final_report.pdf')"
    sort = next(m["tool_calls"][0] for m in traj["messages"] if m["role"] == "assistant"
                and m["tool_calls"][0]["name"] == "sort")
    assert json.loads(sort["arguments"]) == {"file_name": "final_report.pdf"}


def test_the_four_categories_of_one_index_share_a_conversation(run):
    ids = {}
    for category in MULTI:
        for item in run["items"][category]:
            if item["id"] != "multi_turn_long_context_1":
                ids.setdefault(item["id"].rsplit("_", 1)[1], set()).add(trajectory_of(run, item["id"])["conversation_id"])
    assert ids == {str(i): {f"multi_turn_{i}"} for i in range(N)}
    assert len({t["domain"] for t in run["trajectories"] if t["conversation_id"] == "multi_turn_0"}) == 4


def test_miss_func_announces_the_held_back_function_where_bfcl_adds_it(run):
    item = run["items"]["multi_turn_miss_func"][0]
    ((turn, held),) = item["missed_function"].items()  # {"3": ["sort"]}
    traj = trajectory_of(run, item["id"])
    tool_names = {t["function"]["name"] for t in json.loads(traj["tools"])}
    assert not tool_names & set(held) and not tool_names & set(item["excluded_function"])
    users = [i for i, m in enumerate(traj["messages"]) if m["role"] == "user"]
    assert len(users) == len(item["question"])  # every turn opens with a user message, the added one too
    announce = traj["messages"][users[int(turn)]]
    added, prompt = announce["content"].split("\n", 1)
    assert [t["function"]["name"] for t in json.loads(added)] == held
    assert prompt == "I have updated some more functions you can choose from. What about now?"
    called = [(i, m["tool_calls"][0]["name"]) for i, m in enumerate(traj["messages"]) if m["role"] == "assistant"]
    assert all(i > users[int(turn)] for i, name in called if name in held) and any(n in held for _, n in called)
    # the turn before it asks for the missing function: BFCL expects no call there, so it has no assistant turn
    assert not [i for i, _ in called if users[int(turn) - 1] < i < users[int(turn)]]


def test_bfcl_files_are_detected_by_format_auto_and_by_name(run, tmp_path):
    data = Path(run["trajectories"][0]["source"]).parent
    forced, _, counts = ingest_to_tables([{"path": str(data / "BFCL_v4_simple_python.json"), "format": "bfcl"}])
    assert counts["trajectory"] == N
    assert forced.column("trajectory_id").to_pylist() == [trajectory_of(run, i["id"])["trajectory_id"]
                                                          for i in run["items"]["simple_python"]]
    _, quarantine, _ = ingest_to_tables([{"path": str(data / "BFCL_v4_simple_python.json"), "format": "bfcl_multi_turn"}])
    assert set(quarantine.column("reason").to_pylist()) == {
        "format_mismatch: input format is bfcl_multi_turn but the record looks like bfcl"}


def test_answers_can_be_given_explicitly(run, tmp_path):
    data = Path(run["trajectories"][0]["source"]).parent
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "BFCL_v4_parallel.json").write_text((data / "BFCL_v4_parallel.json").read_text())
    _, quarantine, counts = ingest_to_tables([{"path": str(alone)}])
    assert counts["quarantine"] == N and quarantine.column("reason").to_pylist()[0].startswith("bfcl_no_answer")
    for answers in (data / "possible_answer", data / "possible_answer" / "BFCL_v4_parallel.json"):
        rows, _, counts = ingest_to_tables([{"path": str(alone), "answers": str(answers)}])
        assert counts["trajectory"] == N


def test_acceptable_survives_a_round_trip_through_our_own_parquet(run, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pivot_assets.core.catalog import TRAJECTORY_SCHEMA

    single = [t for t in run["trajectories"] if t["domain"] == "bfcl_parallel"]
    pq.write_table(pa.Table.from_pylist(single, schema=TRAJECTORY_SCHEMA), tmp_path / "t.parquet")
    again, _, counts = ingest_to_tables([{"path": str(tmp_path / "t.parquet")}])
    assert counts["trajectory"] == len(single)
    assert again.to_pylist() == [{**t, "source": str(tmp_path / "t.parquet"), "record": i, "source_format": "openai"}
                                 for i, t in enumerate(single)]


def test_acceptable_is_never_shown_to_a_model(run, embedded_model_dir):
    from pivot_assets.curation.exports import nemo_gym_rows
    from pivot_assets.policies.models import (
        load_tokenizer,
        render_action,
        render_prompt,
    )
    from pivot_assets.training.sft import build_sft_examples, turn_example
    from pivot_assets.verifiers.llm_judge import _state_view

    tokenizer = load_tokenizer(str(embedded_model_dir))
    for item_id in ("simple_python_0", "parallel_0", run["items"]["live_multiple"][0]["id"]):
        traj = trajectory_of(run, item_id)
        tools = json.loads(traj["tools"])
        (turn,) = [t for t in run["turns"] if t["trajectory_id"] == traj["trajectory_id"]]
        action = json.loads(turn["expert_action"])
        assert "acceptable" in (action.get("calls") or [action])[0]
        texts = [render_prompt(tokenizer, traj["messages"], tools), render_action(action)]
        (full,) = build_sft_examples([traj], tokenizer, max_length=4096)
        example, _ = turn_example(tokenizer, traj["messages"], turn["message_index"], tools, max_length=4096)
        texts += [tokenizer.decode(full["input_ids"]), tokenizer.decode(example["input_ids"])]
        (row,) = nemo_gym_rows([({"expert_action": turn["expert_action"]}, traj["messages"], tools)])
        texts.append(json.dumps(row["responses_create_params"]))
        texts.append(json.dumps(_state_view(traj["messages"], 10)))  # an LLM judge's view of a state with the call
        assert row["expected_action"] == action  # a NeMo-Gym verifier may read it there
        accepted = [c["acceptable"] for c in traj["messages"][-1]["tool_calls"]]
        assert not any('"acceptable"' in text or any(a in text for a in accepted) for text in texts), item_id


def test_shared_multi_turn_data_ingests_whole(shared_data_dir):
    """The four multi-turn files of ../shared/data/bfcl: 800 items, 21 long_context items identical to their base."""
    trajectories, quarantine, counts = ingest_to_tables([{"path": str(shared_data_dir / "bfcl")}])
    assert (counts["read"], counts["trajectory"], counts["quarantine"], counts["duplicate"]) == (800, 779, 0, 21)
    assert len(set(trajectories.column("conversation_id").to_pylist())) == 200
