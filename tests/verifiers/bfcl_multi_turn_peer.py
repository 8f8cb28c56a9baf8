"""BFCL's multi-turn checker as the peer of `executed_state`: steps built from BFCL multi-turn data, both verdicts.

Used by tests/verifiers/test_executed_state.py (assertions) and bench/bench_verifiers.py (`--only bfcl-multi-turn`:
the agreement table and every disagreement in bench/RESULTS_verifiers.md).

Cases. For every BFCL v4 multi-turn item of a category (ingested as the pipeline ingests it: one assistant
message per ground-truth call, its environment kept) and every step of a turn (one ground-truth call), one copy of
the turn per kind of change that applies to the step's call, every other step left as the ground truth's:
  reference         the call as the ground truth writes it
  keyword/positional  the same call with every argument by keyword, or the leading required ones by position
  trailing slash    a folder-like string argument with "/" appended
  float for int     an integer argument written as a float (1 -> 1.0)
  changed argument  one argument changed (integer +1, float x2, string with "_x" appended, boolean flipped, a
                    list's first item dropped)
  truncated text    a string argument of 3+ words cut to its first half (a tweet, a message, a file's content)
  wrong tool        another tool of the involved classes with the same arguments
The truth is bfcl-eval's `multi_turn_checker` on the conversation up to that turn (the earlier turns as the
ground truth, this turn with the changed step): valid or not. Our verdict is `executed_state` on the step: the
state is the ingested trajectory's messages before the step, with its environment.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivot_assets.core.ids import canonical_json
from pivot_assets.core.shapes import action_from_message
from pivot_assets.environments import TurnState
from pivot_assets.environments.bfcl import BFCLMultiTurn, parse_call
from pivot_assets.ingest.bfcl import BFCLError
from pivot_assets.ingest.bfcl_records import ground_truth, multi_turn_chat
from pivot_assets.ingest.formats import chat_messages

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "bfcl"
KINDS = ("reference", "keyword/positional", "trailing slash", "float for int", "changed argument",
         "truncated text", "wrong tool")
_FOLDER_ARG = re.compile(r"folder|dir|path|destination|source", re.I)


@dataclass
class Case:
    item_id: str
    turn: int
    step: int
    kind: str
    call_text: str  # the changed step as BFCL call text (what BFCL's checker executes)
    candidate: dict  # the same call as our action (arguments by name)
    expected_action: str  # the step's expert action as the turns table holds it
    state: TurnState
    tools: list
    bfcl_valid: bool | None = None
    bfcl_error: str = ""


def _render(name: str, args: list, kwargs: dict) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 if value else 1.5
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list) and value:
        return value[1:]
    return None


def variants(env: BFCLMultiTurn, world, text: str, other_tools: list[str]) -> list[tuple[str, str, dict]]:
    """(kind, BFCL call text, our arguments by name) for every kind of change that applies to one call."""
    name, args, kwargs = parse_call(text)
    named = env.bind(world, name, args, kwargs)
    out = [("reference", text, named)]
    signature_order = list(named)
    if args:
        out.append(("keyword/positional", _render(name, [], named), named))
    elif named:
        first = signature_order[0]
        out.append(("keyword/positional", _render(name, [named[first]], {k: v for k, v in named.items() if k != first}),
                    named))
    for arg, value in named.items():
        if isinstance(value, str) and _FOLDER_ARG.search(arg) and value and not value.endswith("/"):
            changed = {**named, arg: value + "/"}
            out.append(("trailing slash", _render(name, [], changed), changed))
            break
    for arg, value in named.items():
        if isinstance(value, int) and not isinstance(value, bool):
            changed = {**named, arg: float(value)}
            out.append(("float for int", _render(name, [], changed), changed))
            break
    for arg, value in named.items():
        new = _changed(value)
        if new is not None:
            changed = {**named, arg: new}
            out.append(("changed argument", _render(name, [], changed), changed))
            break
    for arg, value in named.items():
        words = value.split() if isinstance(value, str) else []
        if len(words) >= 3:
            changed = {**named, arg: " ".join(words[: len(words) // 2])}
            out.append(("truncated text", _render(name, [], changed), changed))
            break
    other = next((t for t in other_tools if t != name), None)
    if other is not None:
        out.append(("wrong tool", _render(other, [], named), named))
    return out


def build_cases(category: str = "base", limit_items: int | None = None) -> list[Case]:
    """Every step of every turn of the category's items, one case per kind of change (module docstring)."""
    source = str(DATA / f"BFCL_v4_multi_turn_{category}.json")
    items = [json.loads(line) for line in open(source, encoding="utf-8")]
    if limit_items is not None:
        items = items[:limit_items]
    env = BFCLMultiTurn()
    cases = []
    for item in items:
        try:
            chat = multi_turn_chat(item, source)
        except BFCLError:
            continue  # quarantined by ingest (a ground-truth call that fails): no trajectory to profile
        messages = chat_messages(chat["messages"])
        environment = canonical_json(chat["environment"])
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        truth = ground_truth(item["id"], source)
        world = env.fresh(chat["environment"])
        tool_names = sorted(world.owner)
        k = 0
        for t, calls in enumerate(truth):
            for s, text in enumerate(calls):
                index = assistant[k]
                k += 1
                _, action = action_from_message(messages[index])
                state = TurnState(messages[:index], environment)
                rotated = tool_names[(k * 7) % len(tool_names):] + tool_names[: (k * 7) % len(tool_names)]
                for kind, call_text, named in variants(env, world, text, rotated):
                    name = parse_call(call_text)[0]
                    cases.append(Case(item["id"], t, s, kind, call_text,
                                      {"type": "function_call", "name": name, "arguments": named},
                                      canonical_json(action), state, chat["tools"]))
    return cases


def label(cases: list[Case]) -> None:
    """Fill bfcl_valid / bfcl_error with bfcl-eval's multi_turn_checker on the conversation up to the case's turn."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    items: dict[str, dict] = {}
    counter = itertools.count()
    for case in cases:
        category = case.item_id.rsplit("_", 1)[0]  # multi_turn_base
        source = DATA / f"BFCL_v4_{category}.json"
        if case.item_id not in items:
            items.update((r["id"], r) for r in map(json.loads, open(source, encoding="utf-8")))
        item = items[case.item_id]
        truth = ground_truth(case.item_id, str(source))[: case.turn + 1]
        model = [[[call] for call in turn] for turn in truth]
        model[case.turn][case.step] = [case.call_text]
        tag = f"peer{next(counter)}"
        try:
            result = multi_turn_checker(model, truth, item, category, tag)
        finally:  # BFCL keeps each conversation's instances in its module globals, by model name: drop ours
            for key in [k for k in vars(multi_turn_utils) if k.startswith(tag + "_")]:
                del vars(multi_turn_utils)[key]
        case.bfcl_valid = bool(result["valid"])
        case.bfcl_error = "" if result["valid"] else result.get("error_type", "")


def score(cases: list[Case], verifier) -> list:
    return verifier.score_many([{"expected_action": c.expected_action, "candidate": c.candidate, "tools": c.tools,
                                 "state": c.state} for c in cases])


def agreement(cases: list[Case], scores: list) -> dict:
    """Counts by kind and the disagreements."""
    by_kind: dict[str, Counter] = {}
    disagreements = []
    for case, s in zip(cases, scores):
        ours = s.reward >= 1.0
        c = by_kind.setdefault(case.kind, Counter())
        c["n"] += 1
        c["bfcl_accepts"] += case.bfcl_valid
        c["accepts"] += ours
        c["agrees"] += ours == case.bfcl_valid
        if ours != case.bfcl_valid:
            disagreements.append((case, s))
    return {"by_kind": by_kind, "disagreements": disagreements}

