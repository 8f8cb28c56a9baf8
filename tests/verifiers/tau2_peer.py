"""tau2-bench's own evaluation as the peer of `executed_state` on tau2 steps (tests and bench/bench_verifiers.py).

Cases come from tau2's tasks (the installed package's, not from this project's code): for every gold action of a
task (its `evaluation_criteria.actions`), the step is that action with the gold actions before it as the earlier
calls, and the candidate is one of KINDS. The label is computed with tau2's own code alone, as its evaluator
computes a reward: two fresh domain environments with the task's initial state (`set_state`), the earlier calls
run on both through `Environment.get_response`; the gold call on one, the candidate's calls on the other; right
when tau2's database hashes (agent and user) are equal and the gold call's result is among the candidate's results.
Kinds that write twice or read after a write check that every change a write makes to a record, nested lists and
dicts included, is seen when worlds are compared and read back.
"""

from __future__ import annotations

import copy
import importlib
import json
from dataclasses import dataclass, field
from typing import Any

KINDS = ("gold", "arguments reordered", "extra read before", "read after", "write repeated", "argument changed",
         "another tool", "read instead of write")
DOMAINS = ("airline", "retail")


@dataclass
class Case:
    domain: str
    task_id: str
    step: int
    kind: str
    earlier: list[tuple[str, dict]]
    gold: tuple[str, dict]
    calls: list[tuple[str, dict]]
    truth: bool | None = None
    detail: str = field(default="")

    def environment(self) -> dict:
        return {"kind": "tau2", "domain": self.domain, "task_id": self.task_id, "initial_state": None}

    def row(self) -> dict:
        """A `pivot verify` line: the gold call as the expected action, the candidate as its calls."""
        def action(calls):
            one = [{"type": "function_call", "name": n, "arguments": a} for n, a in calls]
            return one[0] if len(one) == 1 else {"type": "function_call_batch", "calls": one}

        return {"expected_action": action([self.gold]), "candidate": action(self.calls),
                "domain": self.domain, "environment": self.environment(),
                "earlier_calls": [[{"name": n, "arguments": a} for n, a in self.earlier]] if self.earlier else []}


def _module(domain: str):
    from loguru import logger

    logger.disable("tau2")
    return importlib.import_module(f"tau2.domains.{domain}.environment")


def tasks(domain: str) -> list:
    return [t for t in _module(domain).get_tasks(None)
            if t.evaluation_criteria is not None and t.evaluation_criteria.actions]


def _tool_types(domain: str) -> dict[str, str]:
    from tau2.environment.toolkit import get_tool_types

    return {k: v.value for k, v in get_tool_types(_module(domain).get_environment().tools).items()}


def _changed(arguments: dict) -> dict | None:
    """One argument's value changed (the first that can be): a string gets a character, a number one more, a list
    loses its last item, a bool flips."""
    out = copy.deepcopy(arguments)
    for key, value in arguments.items():
        if isinstance(value, bool):
            out[key] = not value
        elif isinstance(value, str):
            out[key] = value + "9"
        elif isinstance(value, (int, float)):
            out[key] = value + 1
        elif isinstance(value, list) and value:
            out[key] = value[:-1]
        else:
            continue
        return out
    return None


def _read_call(domain: str, arguments: dict) -> tuple[str, dict] | None:
    """A read the agent could make with what the step knows: the reservation or order, else the user."""
    if domain == "airline" and "reservation_id" in arguments:
        return "get_reservation_details", {"reservation_id": arguments["reservation_id"]}
    if domain == "retail" and "order_id" in arguments:
        return "get_order_details", {"order_id": arguments["order_id"]}
    if "user_id" in arguments:
        return "get_user_details", {"user_id": arguments["user_id"]}
    return None


def build_cases(domain: str, max_tasks: int | None = None) -> list[Case]:
    types = _tool_types(domain)
    names = sorted(types)
    cases = []
    for task in tasks(domain)[:max_tasks]:
        gold_actions = [(a.name, dict(a.arguments)) for a in task.evaluation_criteria.actions]
        for step, (name, arguments) in enumerate(gold_actions):
            earlier, gold = gold_actions[:step], (name, arguments)
            variants: list[tuple[str, list]] = [("gold", [gold]),
                                                ("arguments reordered", [(name, dict(reversed(arguments.items())))])]
            read = _read_call(domain, arguments)
            if read is not None:
                variants.append(("extra read before", [read, gold]))
                variants.append(("read after", [gold, read]))  # the read sees what the write changed
            if types[name] == "write":  # nested lists grow twice (refunds, payments), a record is added twice
                variants.append(("write repeated", [gold, gold]))
            changed = _changed(arguments)
            if changed is not None:
                variants.append(("argument changed", [(name, changed)]))
            other = next((n for n in names[names.index(name) + 1:] + names if n != name and types[n] == types[name]),
                         None)
            if other is not None:
                variants.append(("another tool", [(other, copy.deepcopy(arguments))]))
            if types[name] == "write" and read is not None:
                variants.append(("read instead of write", [read]))
            cases += [Case(domain, str(task.id), step, kind, earlier, gold, calls) for kind, calls in variants]
    return cases


def _fresh(domain: str, task_id: str, by_id: dict):
    env = _module(domain).get_environment()
    state = by_id[task_id].initial_state
    if state is not None:
        env.set_state(initialization_data=state.initialization_data,
                      initialization_actions=state.initialization_actions, message_history=[])
    return env


def _run(env, calls: list[tuple[str, Any]]) -> list[str]:
    from tau2.data_model.message import ToolCall

    return [env.get_response(ToolCall(id=f"c{i}", name=n, arguments=copy.deepcopy(a), requestor="assistant")).content
            for i, (n, a) in enumerate(calls)]


def label(cases: list[Case]) -> None:
    """Each case's truth by tau2's own code (module docstring); the gold world built once per step."""
    by_id = {d: {str(t.id): t for t in _module(d).get_tasks(None)} for d in {c.domain for c in cases}}
    gold_of: dict[tuple, tuple] = {}
    for case in cases:
        key = (case.domain, case.task_id, case.step)
        if key not in gold_of:
            env = _fresh(case.domain, case.task_id, by_id[case.domain])
            _run(env, case.earlier)
            result = _run(env, [case.gold])[0]
            gold_of[key] = ((env.get_db_hash(), env.get_user_db_hash()), result)
        (hashes, result) = gold_of[key]
        env = _fresh(case.domain, case.task_id, by_id[case.domain])
        _run(env, case.earlier)
        results = _run(env, case.calls)
        same_db = (env.get_db_hash(), env.get_user_db_hash()) == hashes
        case.truth = same_db and result in results
        case.detail = "" if case.truth else ("database differs" if not same_db else "gold result missing")


def score(cases: list[Case], verifier) -> list:
    """The verifier's scores of the cases through `pivot verify`'s own row reading (earlier_calls, environment)."""
    from pivot_assets.verifiers.verify_cli import _check_line

    rows = []
    for case in cases:
        row, err = _check_line(json.dumps(case.row()))
        assert row is not None, err
        rows.append(row)
    return verifier.score_many(rows)
