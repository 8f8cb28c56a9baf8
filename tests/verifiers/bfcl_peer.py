"""BFCL's own AST checker as the peer of `tool_call`: cases built from BFCL's single-turn data, both verdicts.

Used by tests/verifiers/test_bfcl_peer.py (assertions) and bench/bench_verifiers.py (the table by kind of
change in bench/RESULTS_verifiers.md).

The peer is `ast_checker` from bfcl-eval (installed --no-deps by `make setup`). Its module imports
`bfcl_eval.constants.model_config`, which imports every model SDK, only to read
`MODEL_CONFIG_MAPPING[model].underscore_to_dot` (whether `.` in function names becomes `_` for the model under
test). A stand-in module that answers False for the model name used here is put in sys.modules before the
import: names stay as BFCL's documents write them, as our candidates do. Nothing of ours is replaced.

Cases. Every item of BFCL v4 simple_python, multiple, parallel and parallel_multiple (1,000 items) gives its
reference calls (the first accepted value of each argument, `ingest.bfcl.expected_action`) and one copy per
kind of change that applies to it:
  accepted by BFCL's rules: the reference itself, argument order, call order, another listed value, an omitted
    optional (its list holds ""), an int for a float, case, punctuation (BFCL's `,./-_*^` and spaces);
  rejected by BFCL's rules: a wrong value (integers +1, floats x2 or x1.1, a string's last word replaced,
    booleans flipped, one item of a list or key of a dict changed), a float for an integer (3 -> 3.0), a wrong
    function, a missing argument, an extra argument, a wrong type (a number as a string, an array or object as
    JSON text, a string inside an array, a boolean as a string), a missing call, a duplicated call.
The kind says what was changed; the truth is BFCL's verdict on the copy, not the kind.

A disagreement is explained when a documented policy of `tool_call` accounts for it (POLICIES); the test
asserts that none is unexplained.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import sys
import types
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pivot_assets.ingest.bfcl import OMITTABLE, bfcl_tools, expected_action
from pivot_assets.verifiers import build_verifier
from pivot_assets.verifiers.arguments import is_free_text
from pivot_assets.verifiers.canonical import n_words

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
PEER_MODEL = "pivot-curation-peer"
ACCEPTED_KINDS = ("reference", "argument order", "call order", "another listed value", "omitted optional",
                  "int for float", "case", "punctuation")
REJECTED_KINDS = ("wrong value", "float for int", "wrong function", "missing argument", "extra argument",
                  "wrong type", "missing call", "duplicated call")
KINDS = ACCEPTED_KINDS + REJECTED_KINDS
class _Omitted:
    def __repr__(self) -> str:
        return "OMITTED"


OMITTED = _Omitted()  # the changed argument was left out

# The documented policy differences between tool_call and BFCL's checker (docs/verifiers.md).
POLICIES = {
    "integer written as 3.0": "JSON Schema counts 3.0 as an integer (JSON has one number type); BFCL wants an int",
    "case or punctuation under strings: exact": "strings: exact keeps case and punctuation; BFCL drops them",
    "punctuation under strings: casefold": "strings: casefold keeps punctuation; BFCL drops it",
    "enum spelling": "a value the tool's enum constrains must spell exactly one member under the strings rule",
    "free text": "a free-text argument (a message body) is compared by facts and word overlap, not as a string",
    "schema default": "an optional argument equal to its schema default counts as omitted, and omitting it as "
                      "passing the default",
    "BFCL's greedy call matching": "BFCL pairs parallel calls greedily; tool_call finds a maximum matching",
    "BFCL rejects its own answer": "the item's first accepted answer fails BFCL's own checker (an answer that "
                                   "lists an argument the function does not declare); the data is taken as given",
}


# ---------------------------------------------------------------------------------------------------
# the peer


@dataclass
class _ModelConfig:
    underscore_to_dot: bool = False  # the one field ast_checker reads


@lru_cache(maxsize=1)
def bfcl_checker():
    """(ast_checker, Language.PYTHON), with a stand-in for bfcl_eval.constants.model_config (see docstring)."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stand_in = types.ModuleType(name)
        stand_in.__doc__ = "Stand-in: ast_checker reads only MODEL_CONFIG_MAPPING[model].underscore_to_dot."
        stand_in.MODEL_CONFIG_MAPPING = {}
        sys.modules[name] = stand_in
    sys.modules[name].MODEL_CONFIG_MAPPING.setdefault(PEER_MODEL, _ModelConfig())
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker, Language.PYTHON


def data_dir() -> Path:
    import bfcl_eval

    return Path(bfcl_eval.__file__).parent / "data"


def bfcl_verdict(item: "Item", calls: list[tuple[str, dict]]) -> dict:
    ast_checker, python = bfcl_checker()
    model_output = [{name: copy.deepcopy(args)} for name, args in calls]
    return ast_checker(item.functions, model_output, item.ground_truth, python, item.category, PEER_MODEL)


# ---------------------------------------------------------------------------------------------------
# items and cases


@dataclass
class Item:
    id: str
    category: str
    functions: list  # BFCL function docs
    ground_truth: list  # [{function name: {argument: [accepted values]}}]
    tools: list  # the same functions as JSON Schema tools (ingest.bfcl)
    expected: dict  # the expected action with `acceptable` (ingest.bfcl)

    def props(self, name: str) -> dict:
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return tool["function"]["parameters"].get("properties") or {}
        return {}

    def doc_type(self, name: str, arg: str) -> str | None:
        for fn in self.functions:
            if fn["name"] == name:
                return (fn["parameters"].get("properties") or {}).get(arg, {}).get("type")
        return None


@dataclass
class Case:
    item: Item
    kind: str
    calls: list  # [(name, arguments)] of the candidate, in order
    changed: tuple | None = None  # (call index, argument, new value or OMITTED)
    bfcl: dict = field(default_factory=dict)  # BFCL's verdict {"valid", "error", "error_type"}

    @property
    def candidate(self) -> str:
        """The candidate as a model writes it: one Hermes <tool_call> block per call, JSON arguments."""
        return "".join("<tool_call>" + json.dumps({"name": n, "arguments": a}) + "</tool_call>" for n, a in self.calls)


def load_items(categories=CATEGORIES) -> list[Item]:
    items = []
    for category in categories:
        answers = {}
        for line in open(data_dir() / "possible_answer" / f"BFCL_v4_{category}.json", encoding="utf-8"):
            row = json.loads(line)
            answers[row["id"]] = row["ground_truth"]
        for line in open(data_dir() / f"BFCL_v4_{category}.json", encoding="utf-8"):
            row = json.loads(line)
            items.append(Item(row["id"], category, row["function"], answers[row["id"]], bfcl_tools(row["function"]),
                              expected_action(answers[row["id"]])))
    return items


def _first(options: list) -> Any:
    """The first accepted value; in a dict (also inside a list), each key's first accepted value, recursively."""
    first = options[0]
    return OMITTED if first == OMITTABLE else _reduced(first)


def _reduced(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _first(v) if isinstance(v, list) and v else v for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not OMITTED}
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return [_reduced(v) for v in value]
    return copy.deepcopy(value)


def reference_calls(item: Item) -> list[tuple[str, dict]]:
    """The first accepted value of every argument of every ground-truth call (in a dict, of every key)."""
    calls = []
    for entry in item.ground_truth:
        (name, accepted), = entry.items()
        args = {arg: _first(options) for arg, options in accepted.items()}
        calls.append((name, {k: v for k, v in args.items() if v is not OMITTED}))
    return calls


def _accepted(item: Item, i: int) -> dict:
    (_, accepted), = item.ground_truth[i].items()
    return accepted


def _arg_choices(item: Item, calls, want) -> list[tuple[int, str]]:
    """(call index, argument) pairs of the reference calls for which want(item, name, arg, value, accepted)."""
    out = []
    for i, (name, args) in enumerate(calls):
        accepted = _accepted(item, i)
        for arg in sorted(accepted):
            if want(item, name, arg, args.get(arg, OMITTED), accepted[arg]):
                out.append((i, arg))
    return out


def _with(calls, i: int, arg: str, value) -> list:
    out = copy.deepcopy(calls)
    name, args = out[i]
    if value is OMITTED:
        args.pop(arg, None)
    else:
        args[arg] = value
    return out


_REPLACEMENT_WORDS = ("Norway", "marble")


def _wrong(value: Any, rng: random.Random) -> Any:
    """Another value of the same type: the kinds of change a reward must not pay for."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * rng.choice((2.0, 1.1)) if value else 1.0
    if isinstance(value, str):
        words = value.split(" ")
        new = next(w for w in _REPLACEMENT_WORDS if w != words[-1])
        return " ".join(words[:-1] + [new]) if len(words) > 1 else new
    if isinstance(value, list) and value:
        j = rng.randrange(len(value))
        return value[:j] + [_wrong(value[j], rng)] + value[j + 1:]
    if isinstance(value, dict) and value:
        key = rng.choice(sorted(value))
        return {**value, key: _wrong(value[key], rng)}
    return None


def _wrong_type(value: Any) -> Any:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)  # JSON text for an array or object
    if isinstance(value, str):
        return [value]
    return None


def _punctuated(s: str) -> str:
    """The same string with BFCL's dropped characters (spaces and `,./-_*^`) changed."""
    if ", " in s:
        return s.replace(",", "")
    if "-" in s:
        return s.replace("-", " ")
    if " " in s:
        return s.replace(" ", "_", 1)
    return s + "."


def _holds_dict(value: Any) -> bool:
    return isinstance(value, dict) or (isinstance(value, list) and any(_holds_dict(v) for v in value))


def make_case(item: Item, kind: str, seed: int = 0) -> Case | None:
    """One copy of the item's reference calls with one change of this kind; None when the kind does not apply."""
    rng = random.Random(f"{seed}:{item.id}:{kind}")
    ref = reference_calls(item)

    def pick(want):
        choices = _arg_choices(item, ref, want)
        return rng.choice(choices) if choices else None

    if kind == "reference":
        return Case(item, kind, ref)
    if kind == "argument order":
        multi = [i for i, (_, a) in enumerate(ref) if len(a) > 1]
        if not multi:
            return None
        out = copy.deepcopy(ref)
        i = rng.choice(multi)
        out[i] = (out[i][0], dict(reversed(list(out[i][1].items()))))
        return Case(item, kind, out)
    if kind == "call order":
        return Case(item, kind, ref[::-1]) if len(ref) > 1 else None
    if kind == "missing call":
        if len(ref) < 2:
            return None
        j = rng.randrange(len(ref))
        return Case(item, kind, ref[:j] + ref[j + 1:])
    if kind == "duplicated call":
        j = rng.randrange(len(ref))
        return Case(item, kind, ref + [copy.deepcopy(ref[j])])
    if kind == "wrong function":
        j = rng.randrange(len(ref))
        others = sorted({f["name"] for f in item.functions} - {ref[j][0]})
        out = copy.deepcopy(ref)
        out[j] = (rng.choice(others) if others else ref[j][0] + "_v2", out[j][1])
        return Case(item, kind, out)
    if kind == "extra argument":
        j = rng.randrange(len(ref))
        return Case(item, kind, _with(ref, j, "extra_option", True), (j, "extra_option", True))

    def changed(i_arg, value):
        i, arg = i_arg
        return Case(item, kind, _with(ref, i, arg, value), (i, arg, value))

    args_of = lambda i_arg: ref[i_arg[0]][1]  # noqa: E731
    if kind == "another listed value":  # a dict among the values lists values per key: a pattern, not a value
        got = pick(lambda it, n, a, v, acc: v is not OMITTED and any(
            x != OMITTABLE and x != v and not _holds_dict(x) for x in acc))
        if got is None:
            return None
        value = args_of(got)[got[1]]
        return changed(got, rng.choice([x for x in _accepted(item, got[0])[got[1]]
                                        if x != OMITTABLE and x != value and not _holds_dict(x)]))
    if kind == "omitted optional":
        got = pick(lambda it, n, a, v, acc: v is not OMITTED and OMITTABLE in acc)
        return changed(got, OMITTED) if got else None
    if kind == "missing argument":
        got = pick(lambda it, n, a, v, acc: v is not OMITTED and OMITTABLE not in acc)
        return changed(got, OMITTED) if got else None
    if kind == "int for float":
        got = pick(lambda it, n, a, v, acc: it.doc_type(n, a) == "float" and isinstance(v, float) and v.is_integer())
        return changed(got, int(args_of(got)[got[1]])) if got else None
    if kind == "float for int":
        got = pick(lambda it, n, a, v, acc: it.doc_type(n, a) == "integer" and type(v) is int)
        return changed(got, float(args_of(got)[got[1]])) if got else None
    if kind == "case":
        got = pick(lambda it, n, a, v, acc: isinstance(v, str) and v.upper() != v)
        return changed(got, args_of(got)[got[1]].upper()) if got else None
    if kind == "punctuation":
        got = pick(lambda it, n, a, v, acc: isinstance(v, str) and v)
        return changed(got, _punctuated(args_of(got)[got[1]])) if got else None
    if kind == "wrong value":
        got = pick(lambda it, n, a, v, acc: v is not OMITTED and _wrong(v, random.Random(0)) not in (None, v))
        return changed(got, _wrong(args_of(got)[got[1]], rng)) if got else None
    if kind == "wrong type":
        got = pick(lambda it, n, a, v, acc: v is not OMITTED and _wrong_type(v) is not None)
        return changed(got, _wrong_type(args_of(got)[got[1]])) if got else None
    raise ValueError(f"unknown kind of change {kind!r}")


def make_cases(items: list[Item], seed: int = 0) -> list[Case]:
    cases = []
    for item in items:
        for kind in KINDS:
            case = make_case(item, kind, seed)
            if case is not None:
                case.bfcl = bfcl_verdict(item, case.calls)
                cases.append(case)
    return cases


# ---------------------------------------------------------------------------------------------------
# the comparison


def without_acceptable(action: dict) -> dict:
    """The expected action as one reference call per call (what a single demonstration gives)."""
    strip = lambda c: {k: v for k, v in c.items() if k != "acceptable"}  # noqa: E731
    if action["type"] == "function_call_batch":
        return {**action, "calls": [strip(c) for c in action["calls"]]}
    return strip(action)


def score_cases(cases: list[Case], spec: dict, use_acceptable: bool = True) -> list:
    verifier = build_verifier(spec)
    return [verifier.score(c.item.expected if use_acceptable else without_acceptable(c.item.expected),
                           c.candidate, c.item.tools) for c in cases]


def _greedy_only(case: Case) -> bool:
    """BFCL rejected a parallel candidate only because it pairs calls greedily: some order of the same calls passes."""
    if "parallel" not in case.item.category or "cannot_find_match" not in case.bfcl.get("error_type", ""):
        return False
    if len(case.calls) > 6:
        return False
    return any(bfcl_verdict(case.item, list(p))["valid"] for p in itertools.permutations(case.calls))


def policy_of(case: Case, accepted: bool, strings: str) -> str | None:
    """The documented policy that explains our verdict differing from BFCL's on this case, or None."""
    if case.changed is not None:
        i, arg, value = case.changed
        name = case.calls[i][0] if i < len(case.calls) else None
        prop = case.item.props(name).get(arg, {}) if name else {}
        acc = _accepted(case.item, i).get(arg, [])
        if accepted and isinstance(value, float) and value.is_integer() and prop.get("type") == "integer":
            return "integer written as 3.0"
        if not accepted and case.kind in ("case", "punctuation"):
            if strings == "exact":
                return "case or punctuation under strings: exact"
            if strings == "casefold" and case.kind == "punctuation":
                return "punctuation under strings: casefold"
            if "enum" in prop:
                return "enum spelling"
        if accepted and case.kind == "wrong value" and isinstance(value, str):
            reference = reference_calls(case.item)[i][1].get(arg)
            if isinstance(reference, str) and is_free_text(arg, prop, reference, n_words(reference), 3):
                return "free text"
        if accepted and "default" in prop:
            default = prop["default"]
            if value is OMITTED and default in acc:
                return "schema default"
            if value is not OMITTED and value == default and OMITTABLE in acc:
                return "schema default"
    if accepted and _greedy_only(case):
        return "BFCL's greedy call matching"
    if accepted and not reference_accepted(case.item):
        return "BFCL rejects its own answer"
    return None


def reference_accepted(item: Item) -> bool:
    return bool(bfcl_verdict(item, reference_calls(item))["valid"])


@dataclass
class Comparison:
    label: str
    strings: str
    scores: list
    agree: int = 0
    false_accepts: list = field(default_factory=list)  # (case, score) BFCL rejects, we accept, unexplained
    false_rejects: list = field(default_factory=list)
    explained: Counter = field(default_factory=Counter)  # policy -> disagreements it explains

    @property
    def agreement(self) -> float:
        return self.agree / len(self.scores) if self.scores else float("nan")


def compare(cases: list[Case], label: str, spec: dict, use_acceptable: bool = True) -> Comparison:
    scores = score_cases(cases, spec, use_acceptable)
    out = Comparison(label, spec.get("strings", "exact"), scores)
    for case, score in zip(cases, scores):
        ours, theirs = score.reward == 1.0, bool(case.bfcl["valid"])
        if ours == theirs:
            out.agree += 1
            continue
        policy = policy_of(case, ours, out.strings)
        if policy is not None:
            out.explained[policy] += 1
        elif ours:
            out.false_accepts.append((case, score))
        else:
            out.false_rejects.append((case, score))
    return out


def describe(case: Case, score) -> str:
    return (f"{case.item.id} [{case.kind}] changed={case.changed!r:.120} ours={score.reason} {score.detail[:160]!r} "
            f"bfcl={case.bfcl.get('valid')} {str(case.bfcl.get('error'))[:160]!r}")


def by_kind_table(cases: list[Case], comparisons: list[Comparison]) -> list[str]:
    """Markdown rows: per kind of change, BFCL's accepts and each comparison's accepts and agreement."""
    head = "| kind of change | n | BFCL accepts | " + " | ".join(
        f"{c.label}: accepts | {c.label}: agrees" for c in comparisons) + " |"
    lines = [head, "|---|---:|---:|" + "---:|---:|" * len(comparisons)]
    index = defaultdict(list)
    for i, case in enumerate(cases):
        index[case.kind].append(i)
    for kind in KINDS:
        idx = index.get(kind, [])
        if not idx:
            continue
        bfcl = sum(bool(cases[i].bfcl["valid"]) for i in idx)
        cells = []
        for comp in comparisons:
            acc = sum(comp.scores[i].reward == 1.0 for i in idx)
            agree = sum((comp.scores[i].reward == 1.0) == bool(cases[i].bfcl["valid"]) for i in idx)
            cells.append(f"{acc} | {agree}")
        lines.append(f"| {kind} | {len(idx)} | {bfcl} | " + " | ".join(cells) + " |")
    total = len(cases)
    cells = [f"{sum(s.reward == 1.0 for s in c.scores)} | {c.agree} ({c.agreement:.2%})" for c in comparisons]
    lines.append(f"| **all** | {total} | {sum(bool(c.bfcl['valid']) for c in cases)} | " + " | ".join(cells) + " |")
    return lines
