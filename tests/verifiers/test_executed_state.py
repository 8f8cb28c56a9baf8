"""`executed_state`: sampled calls replayed on BFCL's own simulated APIs (real bfcl-eval execution, no mocks).

Agreement with bfcl-eval's multi_turn_checker on steps built from BFCL multi-turn data (bfcl_multi_turn_peer.py),
the verifier's rules one by one, its use in a stack and through `pivot verify`'s JSONL, and a profiled warehouse
re-scored under it, chosen in pivot.yaml, without generating.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed: executed_state runs BFCL's simulated APIs")

from pivot_assets.core.catalog import ROLLOUTS_SCHEMA  # noqa: E402
from pivot_assets.core.config import load_config  # noqa: E402
from pivot_assets.core.ids import canonical_json  # noqa: E402
from pivot_assets.core.warehouse import Warehouse  # noqa: E402
from pivot_assets.ingest.inputs import write_ingest, write_turns  # noqa: E402
from pivot_assets.profiling.profiler import score_rollouts  # noqa: E402
from pivot_assets.verifiers import DomainVerifiers, Reason, VerifierSets, build_verifier, verify_jsonl  # noqa: E402

from . import bfcl_multi_turn_peer as peer  # noqa: E402

pytestmark = pytest.mark.skipif(not peer.DATA.is_dir(), reason=f"BFCL data not found at {peer.DATA}")

# Where the step verdict differs from BFCL's whole-turn verdict by design (bench/RESULTS_verifiers.md):
BY_DESIGN = {
    "float for int": "JSON has one number type: 1.0 is read as 1 (BFCL runs Python, where tail(lines=1.0) fails)",
    "raises": "a call that raises scores 0; BFCL records the error and accepts when the expert's result was "
              "already returned in an earlier turn",
}


@pytest.fixture(scope="module")
def cases():
    built = peer.build_cases("base", limit_items=60)
    peer.label(built)
    return built


def _by_design(case, score) -> str | None:
    if case.kind == "float for int":
        return "float for int"
    if score.detail.split(":", 1)[0] in ("missing_argument", "extra_argument", "raised", "unknown_tool"):
        return "raises"
    return None


def test_step_verdicts_agree_with_bfcls_multi_turn_checker(cases):
    scores = peer.score(cases, build_verifier("executed_state"))
    result = peer.agreement(cases, scores)
    unexplained = [(c.item_id, c.turn, c.step, c.kind, c.call_text, s) for c, s in result["disagreements"]
                   if _by_design(c, s) is None]
    assert not unexplained, unexplained[:5]
    judged_alike = [(c, s) for c, s in zip(cases, scores) if c.kind != "float for int"]
    agree = sum((s.reward >= 1.0) == c.bfcl_valid for c, s in judged_alike)
    assert agree / len(judged_alike) >= 0.99
    kinds = result["by_kind"]
    assert kinds["reference"]["agrees"] == kinds["reference"]["n"] > 100
    assert kinds["truncated text"]["n"] > 0 and kinds["truncated text"]["agrees"] == kinds["truncated text"]["n"]
    assert kinds["trailing slash"]["accepts"] > 0  # a rewrite that does the same passes where tool_call cannot


def test_tool_call_disagrees_where_executing_decides(cases):
    scores = peer.score(cases, build_verifier("tool_call"))
    result = peer.agreement(cases, scores)
    assert result["by_kind"]["trailing slash"]["accepts"] == 0 < result["by_kind"]["trailing slash"]["bfcl_accepts"]


def _case(cases, kind: str, tool: str | None = None):
    return next(c for c in cases if c.kind == kind and (tool is None or c.candidate["name"] == tool))


def test_rules_one_by_one(cases):
    verifier = build_verifier("executed_state")
    ref = _case(cases, "reference", "post_tweet")

    def score(candidate):
        return verifier.score(ref.expected_action, candidate, ref.tools, ref.state)

    assert score(ref.candidate) == (1.0, Reason.OK, "same state and results as the expert's")
    truncated = {**ref.candidate, "arguments": {**ref.candidate["arguments"], "content": "Excited for the"}}
    s = score(truncated)
    assert (s.reward, s.reason) == (0.0, Reason.ARGUMENT_VALUE_DIFFERENT) and "TwitterAPI.tweets" in s.detail
    assert score("I posted it.").reason == Reason.SPOKE_INSTEAD_OF_CALL
    s = score({"type": "function_call", "name": "no_such_tool", "arguments": {}})
    assert (s.reward, s.reason) == (0.0, Reason.UNEXPECTED_TOOL)
    s = score({**ref.candidate, "arguments": {**ref.candidate["arguments"], "colour": "red"}})
    assert (s.reward, s.reason) == (0.0, Reason.EXTRA_ARGUMENT)
    assert score("<tool_call>{not json").reason in (Reason.PARSE_ERROR, Reason.TRUNCATED)
    # the same call twice posts two tweets: the state differs
    twice = {"type": "function_call_batch", "calls": [ref.candidate, ref.candidate]}
    assert score(twice).reward == 0.0
    # each sample runs on its own copy: after a wrong one, the right one still passes
    assert score(ref.candidate).reward == 1.0


def test_an_extra_read_only_call_and_another_order_pass(cases):
    verifier = build_verifier("executed_state")
    ref = _case(cases, "reference", "mv")
    extra = {"type": "function_call_batch", "calls": [{"type": "function_call", "name": "pwd", "arguments": {}},
                                                       ref.candidate]}
    assert verifier.score(ref.expected_action, extra, ref.tools, ref.state).reward == 1.0
    assert build_verifier("tool_call").score(ref.expected_action, extra, ref.tools, ref.state).reward == 0.0


def test_each_turns_world_is_built_once_for_its_samples(cases):
    verifier = build_verifier("executed_state")
    ref = _case(cases, "reference", "mv")
    samples = [ref.candidate, "no call", {**ref.candidate, "arguments": {"source": "x", "destination": "y"}}] * 3
    verifier.score_many([{"expected_action": ref.expected_action, "candidate": c, "tools": ref.tools,
                          "state": ref.state} for c in samples])
    assert len(verifier._turns) == 1
    turn = next(iter(verifier._turns.values()))
    assert len(turn.verdicts) == 2  # distinct calls executed once each (the reply never reaches the world)


def test_turns_without_an_environment_go_to_the_fallback(cases):
    ref = _case(cases, "reference", "mv")
    plain = list(ref.state)  # no environment: not executable
    executed = build_verifier({"name": "executed_state", "fallback": {"name": "exact"}})
    assert executed.score(ref.expected_action, ref.candidate, ref.tools, plain) == \
        build_verifier("exact").score(ref.expected_action, ref.candidate, ref.tools, plain)


def test_fingerprint_is_its_own_and_follows_its_parameters():
    a, b = build_verifier("executed_state"), build_verifier({"name": "executed_state", "working_state": False})
    assert len({a.fingerprint, b.fingerprint, build_verifier("tool_call").fingerprint}) == 3
    assert a.fingerprint == build_verifier({"name": "executed_state", "cache_turns": 8}).fingerprint


def test_in_a_stack(cases):
    ref = _case(cases, "reference", "post_tweet")
    stack = build_verifier({"name": "stack", "mode": "all", "steps": [{"name": "tool_name"}, {"name": "executed_state"}]})
    truncated = {**ref.candidate, "arguments": {**ref.candidate["arguments"], "content": "Excited"}}
    items = [{"expected_action": ref.expected_action, "candidate": c, "tools": ref.tools, "state": ref.state}
             for c in (ref.candidate, truncated)]
    assert [s.reward for s in stack.score_many(items)] == [1.0, 0.0]
    assert [s.reward for s in (stack.score(**{k: it[k] for k in ("candidate", "tools", "state")},
                                           expected_action=it["expected_action"]) for it in items)] == [1.0, 0.0]


def test_pivot_verify_takes_executable_cases():
    environment = {"kind": "bfcl_multi_turn", "involved_classes": ["GorillaFileSystem"], "long_context": False,
                   "initial_config": {"GorillaFileSystem": {"root": {"alex": {"type": "directory", "contents": {
                       "docs": {"type": "directory", "contents": {"a.txt": {"type": "file", "content": "hi"}}}}}}}}}
    expected = {"type": "function_call", "name": "cat", "arguments": {"file_name": "a.txt"}}
    lines = [
        {"expected_action": expected, "candidate": expected, "environment": environment,
         "earlier_calls": [["cd('docs')"]]},
        {"expected_action": expected, "candidate": {**expected, "arguments": {"file_name": "b.txt"}},
         "environment": environment, "earlier_calls": [[{"name": "cd", "arguments": {"folder": "docs"}}]]},
        {"expected_action": expected, "candidate": expected, "environment": environment, "earlier_calls": [["cd(1"]]},
    ]
    out = io.StringIO()
    stats = verify_jsonl([json.dumps(x) for x in lines], out, DomainVerifiers(), verifier_name="executed_state")
    rows = [json.loads(x) for x in out.getvalue().splitlines()]
    assert rows[0]["reward"] == 1.0 and rows[1]["reward"] == 0.0
    assert "earlier call" in rows[2]["error"] and stats["errors"] == 1


# -- re-scoring a profiled warehouse ---------------------------------------------------------------


def _bfcl_slice(root: Path, n: int = 3) -> Path:
    name = "BFCL_v4_multi_turn_base.json"
    (root / "possible_answer").mkdir(parents=True)
    items = (peer.DATA / name).read_text().splitlines()[:n]
    ids = {json.loads(x)["id"] for x in items}
    answers = [x for x in (peer.DATA / "possible_answer" / name).read_text().splitlines() if json.loads(x)["id"] in ids]
    (root / name).write_text("\n".join(items) + "\n")
    (root / "possible_answer" / name).write_text("\n".join(answers) + "\n")
    shutil.copytree(peer.DATA / "multi_turn_func_doc", root / "multi_turn_func_doc")
    return root / name


def _completions(action: dict) -> list[str]:
    """The expert call, its first string argument cut short, a reply, and a folder argument with a trailing slash
    (the expert call again where it has none)."""
    arguments = json.loads(action["arguments"])
    cut, slash = dict(arguments), dict(arguments)
    for key, value in arguments.items():
        if isinstance(value, str):
            cut[key] = value[: max(1, len(value) // 2)]
            break
    if action["name"] == "cd" and not arguments.get("folder", "/").endswith("/"):
        slash["folder"] = arguments["folder"] + "/"
    calls = ["<tool_call>" + json.dumps({"name": action["name"], "arguments": a}) + "</tool_call>"
             for a in (arguments, cut, slash)]
    return [calls[0], calls[1], "Done.", calls[2]]


def test_choosing_it_in_pivot_yaml_rescores_a_profiled_warehouse_without_generating(tmp_path):
    data = _bfcl_slice(tmp_path / "bfcl")
    wh = Warehouse(tmp_path / "wh")
    write_ingest(wh, [{"path": str(data), "format": "bfcl_multi_turn"}])
    write_turns(wh)
    assert duckdb.sql(f"select count(*) from read_parquet('{wh.table_path('trajectories')}') "
                      "where environment is not null").fetchone()[0] == 3
    turns = duckdb.sql(f"select turn_id, trajectory_id, expert_action from read_parquet('{wh.table_path('turns')}')"
                       ).fetchall()
    rows = [{"turn_id": tid, "trajectory_id": trid, "policy_fp": "P", "sampling_fp": "S", "sample_index": i,
             "completion": text, "n_prompt_tokens": 1, "n_completion_tokens": 1, "finish_reason": "stop"}
            for tid, trid, action in turns for i, text in enumerate(_completions(json.loads(action)))]
    wh.append_part("rollouts", pa.Table.from_pylist(rows, schema=ROLLOUTS_SCHEMA))
    rollouts_before = sorted(map(str, wh.part_files("rollouts")))
    turn_ids = [t[0] for t in turns]

    yaml_path = tmp_path / "pivot.yaml"
    verdicts = {}
    for name in ("tool_call", "executed_state"):
        yaml_path.write_text(f"verifier:\n  default:\n    name: {name}\n")
        verifiers = VerifierSets.from_config(load_config(yaml_path)).profiling
        stats = score_rollouts(wh, verifiers, "P", "S", turn_ids)
        assert stats["rollouts_scored"] == len(rows)
        assert score_rollouts(wh, verifiers, "P", "S", turn_ids)["rollouts_scored"] == 0  # cached: nothing left
        verdicts[name] = dict(((t, i), (r, reason)) for t, i, r, reason in duckdb.sql(
            f"select turn_id, sample_index, reward, reason from read_parquet('{wh.source_glob('rollout_rewards')}') "
            f"where verifier_fp = '{verifiers.fingerprint}'").fetchall())
    assert sorted(map(str, wh.part_files("rollouts"))) == rollouts_before  # no sample generated or rewritten
    executed = verdicts["executed_state"]
    assert all(executed[(t, 0)] == (1.0, Reason.OK) for t in turn_ids)  # the expert's call, replayed
    assert all(executed[(t, 2)][1] == Reason.SPOKE_INSTEAD_OF_CALL for t in turn_ids)
    # a trailing slash on a folder does what the expert's cd does: executed_state passes it, tool_call cannot
    slashed = [(t, 3) for t, _, action in turns if json.loads(action)["name"] == "cd"
               and not json.loads(json.loads(action)["arguments"]).get("folder", "/").endswith("/")]
    assert slashed and all(executed[k] == (1.0, Reason.OK) for k in slashed)
    assert all(verdicts["tool_call"][k][0] == 0.0 for k in slashed)
    assert canonical_json(sorted(executed)) == canonical_json(sorted(verdicts["tool_call"]))


def test_as_grpos_reward_with_the_exported_environment(cases):
    from pivot_assets.training.grpo import make_verifier_reward

    ref = _case(cases, "reference", "post_tweet")
    truncated = {**ref.candidate, "arguments": {**ref.candidate["arguments"], "content": "Excited"}}
    texts = ["<tool_call>" + json.dumps({"name": c["name"], "arguments": c["arguments"]}) + "</tool_call>"
             for c in (ref.candidate, truncated)]
    reward = make_verifier_reward(DomainVerifiers({"default": {"name": "executed_state"}}))
    column = lambda value: [value] * 2  # noqa: E731  (a dataset column, one value per completion)
    got = reward(prompts=column("p"), completions=texts, expert_action=column(ref.expected_action),
                 tools=column(json.dumps(ref.tools)), domain=column("bfcl_multi_turn_base"),
                 state=column(json.dumps(list(ref.state))), environment=column(ref.state.environment))
    assert got == [1.0, 0.0]
    assert [r["reason"] for r in reward.completions_log] == [Reason.OK, Reason.ARGUMENT_VALUE_DIFFERENT]
