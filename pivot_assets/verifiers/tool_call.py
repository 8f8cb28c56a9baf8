"""`tool_call`: the functional verifier (PivotRL's reward for tool-use turns).

A candidate call is accepted when it is the same tool with equivalent arguments:
1. same tool name (else UNEXPECTED_TOOL);
2. arguments written as the expert wrote them (canonical JSON of the values as sent: key order, 1 vs 1.0 and
   spacing aside) -> OK at once (fast path);
3. when the tools are known, each argument as sent must be of the JSON type its schema declares (SCHEMA_INVALID:
   `"[0.8, 0.7]"` for an array), whatever the other arguments are;
4. argument-by-argument comparison (optional arguments equal to their schema default count as absent):
   MISSING_ARGUMENT / EXTRA_ARGUMENT / ARGUMENT_VALUE_DIFFERENT. Integers compare exactly, other numbers with a
   tight relative tolerance. A string constrained by an enum is the member it spells under the `strings` rule
   (exact by default: an enum member as written); arithmetic strings
   (`calculate`: "175 + 200") are parsed safely and compared by structure (arithmetic.py: a changed number is
   FACT_MISMATCH); free text (a message, a query, a description: arguments.py decides from the schema, the
   argument's name and the value's shape) must state the same facts as the expert's (facts.py; `facts: exact
   | subset | ignore`), then share enough words (`free_text_threshold`); any other string is a value that names
   one thing, compared under the `strings` rule (exact | casefold | bfcl);
5. a candidate found equivalent must also validate against the tool's JSON schema when the tools are known
   (SCHEMA_INVALID: e.g. a missing required argument, an enum value in another case). Validating last runs the
   (slow) validator only on would-be passes.
An expected call may carry `acceptable` ({argument: [accepted values]}, BFCL's possible answers; `""` in a list:
the argument may be omitted): then every passed argument must match one of its accepted values under the rules
above, every argument without `""` must be passed and nothing unlisted may be passed.
Partial credit (`credit: arguments`): a call to the expected tool whose verdict is a wrong, missing or extra
argument (MISSING_ARGUMENT, EXTRA_ARGUMENT, ARGUMENT_VALUE_DIFFERENT, FACT_MISMATCH) is paid the share of its
top-level arguments that are right: matched / (expected arguments + extra ones), with the verdict's reason and
detail kept. Any other failure (another tool, an invalid call, text for a call) stays 0; `credit: binary` (the
default) pays 0 for every failure. `pass_threshold` says which rewards count as a pass (Verifier.passes).
Parallel calls are an unordered multiset: maximum bipartite matching of equivalent calls; binary mode pays 1
only for a perfect matching, f1 mode pays the F1 of matched calls. Text vs call is 0 (SPOKE_INSTEAD_OF_CALL /
CALLED_INSTEAD_OF_SPEAK); text vs text goes to a configurable text verifier, never an automatic 1.0: by default
string_similarity at `text_threshold` with the same `facts` mode, so a reply with a wrong id, amount or date
is FACT_MISMATCH however similar its wording.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from functools import lru_cache
from typing import Any, NamedTuple

import jsonschema
from jsonschema.exceptions import SchemaError
from rapidfuzz import fuzz

from pivot_assets.core.ids import canonical_json

from .arithmetic import Expression, expression_difference, parse_expression
from .arguments import declared_type_error, is_free_text, json_type_name
from .base import Param, Reason, Score, Verifier, tools_as_list
from .canonical import (STRING_RULES, canonical_key, canonicalize, loads_canonical, n_words, normalize_string,
                        word_overlap)
from .facts import FACT_MODES, extract, text_fact_difference
from .matching import max_bipartite_matching
from .parsing import OMITTABLE, Accepted, Call, Parsed
from .registry import build_verifier, register

_MAX_CACHED_ARGS = 65536  # larger argument texts are validated uncached
_MAX_PAIRWISE = 4096  # batch comparisons beyond this are not attempted pairwise (adversarial batches)
_MAX_FREE_TEXT_CHARS = 20_000  # longer free text must be equal after normalization (as string_similarity)
CREDITS = ("binary", "arguments")
# Verdicts about argument values: with credit arguments they are paid the share of arguments that are right.
CREDITED_REASONS = frozenset({Reason.MISSING_ARGUMENT, Reason.EXTRA_ARGUMENT, Reason.ARGUMENT_VALUE_DIFFERENT,
                              Reason.FACT_MISMATCH})


class SchemaInfo(NamedTuple):
    key: str  # canonical JSON of the parameters schema
    schema: dict  # the parameters schema ({} when it is not an object)
    defaults: dict  # optional argument -> canonical JSON of its default

    @property
    def validator(self) -> Any:
        """Compiled jsonschema validator (None when the schema itself is invalid); built on first use."""
        return compiled_validator(self.key)

    @property
    def has_enum(self) -> bool:
        return '"enum"' in self.key

    @property
    def props(self) -> dict:
        props = self.schema.get("properties")
        return props if isinstance(props, dict) else {}


@lru_cache(maxsize=4096)
def schema_info(schema_key: str) -> SchemaInfo:
    """Defaults of one parameters schema, cached by its canonical JSON (the validator compiles lazily)."""
    schema = json.loads(schema_key)
    schema = schema if isinstance(schema, dict) else {}
    props = schema.get("properties")
    required = set(schema.get("required") or [])
    defaults = {}
    if isinstance(props, dict):
        for name, prop in props.items():
            if isinstance(prop, dict) and "default" in prop and name not in required:
                defaults[name] = canonical_key(canonicalize(prop["default"]))
    return SchemaInfo(schema_key, schema, defaults)


@lru_cache(maxsize=4096)
def compiled_validator(schema_key: str) -> Any:
    """jsonschema validator for a schema (checked against its metaschema once); None for a broken schema."""
    schema = json.loads(schema_key)
    if not isinstance(schema, dict):
        return None
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        return cls(schema)
    except SchemaError:
        return None  # a broken tool schema says nothing about the candidate


@lru_cache(maxsize=1024)
def _tools_index_from_text(tools_text: str) -> dict[str, str]:
    return _tools_index(tools_as_list(tools_text))


def _tool_entry(tool: Any) -> tuple[str | None, Any]:
    """(name, parameters) of an OpenAI chat tool schema or a flat Responses-style tool."""
    if not isinstance(tool, dict):
        return None, None
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    return fn.get("name"), fn.get("parameters")


def _tools_index(tools: list) -> dict[str, str]:
    index = {}
    for tool in tools:
        name, params = _tool_entry(tool)
        if isinstance(name, str) and isinstance(params, dict):
            index[name] = canonical_key(params)
    return index


# Tool lists passed as Python lists, indexed by id(). The entry keeps a reference to the list, so its id cannot
# be reused while cached; a list mutated in place after first use is not re-indexed (tools are read-only data).
_LIST_INDEX: dict[int, tuple[list, dict[str, str]]] = {}
_LIST_INDEX_MAX = 4096


def _tools_index_from_list(tools: list) -> dict[str, str]:
    hit = _LIST_INDEX.get(id(tools))
    if hit is not None and hit[0] is tools:
        return hit[1]
    if len(_LIST_INDEX) >= _LIST_INDEX_MAX:
        _LIST_INDEX.clear()
    index = _tools_index(tools)
    _LIST_INDEX[id(tools)] = (tools, index)
    return index


def find_schema(tools: Any, name: str) -> SchemaInfo | None:
    """Schema info of tool `name` from tools given as a list or JSON text; None when unknown."""
    if not tools:
        return None
    if isinstance(tools, str):
        key = _tools_index_from_text(tools).get(name)
    elif isinstance(tools, list):
        key = _tools_index_from_list(tools).get(name)
    else:
        key = None
    return schema_info(key) if key else None


def _validation_error(info: SchemaInfo, args: Any, trusted: frozenset = frozenset()) -> str | None:
    errors = info.validator.iter_errors(args)
    if trusted:
        errors = (e for e in errors if not (e.absolute_path and e.absolute_path[0] in trusted))
    error = jsonschema.exceptions.best_match(errors)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "arguments"
    return f"{where}: {error.message[:200]}"


@lru_cache(maxsize=16384)
def _validation_error_cached(schema_key: str, args_key: str, trusted: frozenset) -> str | None:
    return _validation_error(schema_info(schema_key), json.loads(args_key), trusted)


def validate_args(info: SchemaInfo, raw_args: Any, trusted: frozenset = frozenset()) -> str | None:
    """First schema violation of the arguments as sent (before JSON-in-string decoding), or None.

    trusted: arguments whose values the expected action lists literally; violations inside them are the
    data's, not the candidate's, and are not reported.
    """
    if not isinstance(raw_args, dict) or info.validator is None:
        return None
    args_key = canonical_key(raw_args)
    if len(args_key) > _MAX_CACHED_ARGS:  # do not pin megabytes in the LRU
        return _validation_error(info, raw_args, trusted)
    return _validation_error_cached(info.key, args_key, trusted)


def _short(value: Any, n: int = 60) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return repr(text if len(text) <= n else text[:n] + "...")


def _join(path: str, key: Any) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


def _sub_schema(prop: Any, key: str | int) -> Any:
    """The schema of a property (str key) or of the items (int index) under `prop`; None when not given."""
    if not isinstance(prop, dict):
        return None
    if isinstance(key, int):
        items = prop.get("items")
        return items if isinstance(items, dict) else None
    props = prop.get("properties")
    return props.get(key) if isinstance(props, dict) else None


def _required(info: SchemaInfo | None) -> frozenset:
    required = info.schema.get("required") if info is not None else None
    return frozenset(r for r in required if isinstance(r, str)) if isinstance(required, list) else frozenset()


def _value_text(value: Any, n: int = 40) -> str:
    """A value for a detail: a string quoted, anything else as JSON; cut at n characters."""
    if isinstance(value, str):
        return _short(value, n)
    text = canonical_json(value)
    return text if len(text) <= n else text[:n] + "..."


def _accepted_text(accepted: Accepted) -> str:
    shown = ", ".join(_value_text(v) for v in accepted.values[:5])
    more = f" (+{len(accepted.values) - 5} more)" if len(accepted.values) > 5 else ""
    return (shown or "none") + more + (" or omitted" if accepted.omittable else "")


def _options(listed: Any) -> tuple[list, bool]:
    """(accepted values, omittable) of one key of an accepted dict: a list of values, `""` for "may be left out"."""
    choices = listed if isinstance(listed, list) else [listed]
    values = [c for c in choices if not (isinstance(c, str) and c == OMITTABLE)]
    return values, len(values) < len(choices)


@register
class ToolCallVerifier(Verifier):
    """Functional tool-call equivalence (see module docstring)."""

    name = "tool_call"
    version = "3"
    params = {
        "mode": Param("str", "binary", choices=("binary", "f1")),
        # Facts of replies and free-text arguments: exact (equal multisets), subset (the candidate may leave
        # facts out, never add or change one) or ignore (similarity only, the version-1 behaviour).
        "facts": Param("str", "exact", choices=FACT_MODES),
        # Arithmetic strings compared as parsed expressions (False: as strings, the version-1 behaviour).
        "arithmetic": Param("bool", True),
        # Text vs text: string_similarity at text_threshold (same facts mode), unless text_verifier names
        # another verifier spec.
        "text_threshold": Param("float", 0.5, lo=0.0, hi=1.0),
        "text_verifier": Param("spec", None),
        # String values that are not free text: exact (whitespace runs and typographic quotes aside), casefold,
        # or bfcl (BFCL's standardize_string). A value constrained by the tool's enum is read as the member it
        # spells under the rule (as written when it spells none, or several), then compared and validated.
        "strings": Param("str", "exact", choices=STRING_RULES),
        "free_text_threshold": Param("float", 0.75, lo=0.0, hi=1.0),
        "free_text_min_words": Param("int", 3, lo=1),
        "free_text_metric": Param("str", "word_overlap", choices=("word_overlap", "ratio", "token_sort_ratio")),
        # Relative: |a - b| <= tolerance * max(|a|, |b|) when either number is not an integer; integers are exact.
        "float_tolerance": Param("float", 1e-9, lo=0.0, hi=1e-3),
        "validate_schema": Param("bool", True),
        "drop_schema_defaults": Param("bool", True),
        "ignore_arguments": Param("list", []),
        "unordered_lists": Param("bool", False),
        # binary: a wrong call is 0; arguments: a call to the right tool is paid its share of right arguments.
        "credit": Param("str", "binary", choices=CREDITS),
        # A sample passes (n_pass, pass_rate) when its reward is at least this (and above 0: Verifier.passes).
        "pass_threshold": Param("float", 1.0, lo=0.0, hi=1.0),
    }
    retired = {"ignore_case": "strings: casefold", "strip_punctuation": "strings: bfcl (BFCL's normalization)",
               "collapse_whitespace": "strings: exact collapses runs of whitespace"}

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        spec = self.config["text_verifier"] or {"name": "string_similarity", "threshold": self.config["text_threshold"],
                                                "facts": self.config["facts"]}
        self.text_verifier = build_verifier(spec)
        if not all(isinstance(a, str) for a in self.config["ignore_arguments"]):
            raise ValueError("verifier 'tool_call': parameter 'ignore_arguments' must list argument names")
        self._ignored = frozenset(self.config["ignore_arguments"])
        self._strings = self.config["strings"]

    def children(self) -> dict:
        return {"text_verifier": self.text_verifier}

    # -- top level --------------------------------------------------------------------------------
    def score_parsed(self, expected: Parsed, candidate: Parsed, tools: Any, state: list | None) -> Score:
        if expected.kind == "text":
            if candidate.kind == "text":
                return self.text_verifier.score_parsed(expected, candidate, tools, state)
            return Score(0.0, Reason.CALLED_INSTEAD_OF_SPEAK, f"expected a reply, got a call to {candidate.calls[0].name!r}")
        if candidate.kind == "text":
            return Score(0.0, Reason.SPOKE_INSTEAD_OF_CALL, f"expected a call to {expected.calls[0].name!r}, got a reply")
        if len(expected.calls) == 1 and len(candidate.calls) == 1:
            return self.score_call(expected.calls[0], candidate.calls[0], tools)
        return self.score_calls(expected.calls, candidate.calls, tools)

    # -- one call ---------------------------------------------------------------------------------
    def score_call(self, expected: Call, candidate: Call, tools: Any) -> Score:
        """Score one candidate call against one expected call (with partial credit under `credit: arguments`)."""
        score = self._call_verdict(expected, candidate, tools)
        if self.config["credit"] == "arguments" and score.reason in CREDITED_REASONS:
            info = find_schema(tools, expected.name) if tools else None
            return score._replace(reward=self.argument_credit(expected, candidate, info))
        return score

    def _call_verdict(self, expected: Call, candidate: Call, tools: Any) -> Score:
        """The binary verdict on one candidate call against one expected call."""
        if expected.name != candidate.name:
            return Score(0.0, Reason.UNEXPECTED_TOOL, f"expected {expected.name!r}, got {candidate.name!r}")
        if expected.acceptable is None and expected.raw_key == candidate.raw_key:
            return Score(1.0, Reason.OK, "")  # written as the expert wrote it
        info = find_schema(tools, expected.name) if tools else None
        if expected.acceptable is not None:
            return self._score_acceptable(expected.acceptable, candidate, info)
        err = self._type_error(candidate, info, candidate.args)
        if err:
            return Score(0.0, Reason.SCHEMA_INVALID, err)
        if expected.key != candidate.key:
            diff = self.compare(self._comparable(expected.args, info), self._comparable(candidate.args, info), "",
                                info.schema if info is not None else None)
            if diff is not None:
                return Score(0.0, diff[0], diff[1])
        return self._validated(info, candidate, "equivalent after normalization")

    def _type_error(self, candidate: Call, info: SchemaInfo | None, arguments: Any) -> str | None:
        """The first argument (of `arguments`) whose value as sent is not of its declared JSON type."""
        if info is None or not self.config["validate_schema"] or not isinstance(candidate.raw, dict):
            return None
        props = info.props
        for arg in sorted(arguments):
            if arg in props and arg in candidate.raw and arg not in self._ignored:
                err = declared_type_error(props[arg], candidate.raw[arg], arg)
                if err:
                    return err
        return None

    def _validated(self, info: SchemaInfo | None, candidate: Call, detail: str,
                   trusted: frozenset = frozenset()) -> Score:
        """A call found equivalent must also be one the tool accepts. Validated last, so the cheaper and more
        specific reasons above explain wrong calls, and the validator runs only on would-be passes."""
        if info is not None and self.config["validate_schema"]:
            raw = self._as_enum_members(candidate.raw, info.schema) if info.has_enum else candidate.raw
            err = validate_args(info, raw, trusted)
            if err:
                return Score(0.0, Reason.SCHEMA_INVALID, err)
        return Score(1.0, Reason.OK, detail)

    def _comparable(self, args: dict, info: SchemaInfo | None) -> dict:
        """Arguments minus ignored ones and (when the schema is known) optional ones equal to their default."""
        defaults = info.defaults if (info is not None and self.config["drop_schema_defaults"]) else {}
        if not self._ignored and not defaults:
            return args
        return {k: v for k, v in args.items()
                if k not in self._ignored and not (k in defaults and canonical_key(v) == defaults[k])}

    # -- partial credit ---------------------------------------------------------------------------
    def argument_credit(self, expected: Call, candidate: Call, info: SchemaInfo | None) -> float:
        """The share of top-level arguments the candidate got right: right ones / (the expected arguments + the
        candidate's extra ones), each compared as the verdict compares it (ignored arguments and optional ones equal
        to their schema default left out). With accepted values, an argument that may be omitted counts only when
        passed."""
        if expected.acceptable is not None:
            args = {k: v for k, v in candidate.args.items() if k not in self._ignored}
            counted = set(args) | {a for a, accepted in expected.acceptable.items()
                                   if a not in self._ignored and self._left_out_wrongly(a, accepted, info)}
            right = sum(1 for a in args if a in expected.acceptable
                        and self._accepted_argument(expected.acceptable[a], a, args[a], info))
        else:
            props = info.props if info is not None else {}
            exp, cand = self._comparable(expected.args, info), self._comparable(candidate.args, info)
            counted = set(exp) | set(cand)
            right = sum(1 for a in exp if a in cand and self.compare(exp[a], cand[a], a, props.get(a), a) is None)
        return right / len(counted) if counted else 0.0

    def _accepted_argument(self, accepted: Accepted, arg: str, value: Any, info: SchemaInfo | None) -> bool:
        """A passed argument the verdict lets through: one of its accepted values, or its schema default where it
        may be omitted (passing the default is omitting it)."""
        defaults = info.defaults if (info is not None and self.config["drop_schema_defaults"]) else {}
        if accepted.omittable and arg in defaults and canonical_key(value) == defaults[arg]:
            return True
        return self._accepts(accepted, value, arg, info.props.get(arg) if info is not None else None)

    # -- several accepted values ------------------------------------------------------------------
    def _score_acceptable(self, acceptable: dict[str, Accepted], candidate: Call, info: SchemaInfo | None) -> Score:
        """The expected call's `acceptable`: every passed argument matches one of its accepted values, every
        argument that may not be omitted is passed, nothing unlisted is passed. An optional argument equal to its
        schema default counts as omitted (drop_schema_defaults), and omitting it as passing the default."""
        args = {k: v for k, v in candidate.args.items() if k not in self._ignored}
        unlisted = sorted(set(args) - set(acceptable))
        if unlisted:
            return Score(0.0, Reason.EXTRA_ARGUMENT, f"unexpected argument {unlisted[0]!r} "
                         f"(accepted arguments: {', '.join(sorted(acceptable)) or 'none'})")
        missing = self._missing_argument(acceptable, args, info)
        if missing:
            return Score(0.0, Reason.MISSING_ARGUMENT, missing)
        defaults = info.defaults if (info is not None and self.config["drop_schema_defaults"]) else {}
        props = info.props if info is not None else {}
        raw = candidate.raw if isinstance(candidate.raw, dict) else {}
        inexact = [a for a in sorted(args) if canonical_key(raw.get(a)) not in acceptable[a].keys]
        err = self._type_error(candidate, info, inexact)
        if err:
            return Score(0.0, Reason.SCHEMA_INVALID, err)
        for arg in inexact:
            accepted = acceptable[arg]
            if accepted.omittable and arg in defaults and canonical_key(args[arg]) == defaults[arg]:
                continue
            if not self._accepts(accepted, args[arg], arg, props.get(arg)):
                return Score(0.0, Reason.ARGUMENT_VALUE_DIFFERENT,
                             f"{arg}: got {_value_text(args[arg], 60)}, accepted: {_accepted_text(accepted)}")
        if not inexact:
            return Score(1.0, Reason.OK, "accepted values")  # every value written as the data lists it
        # Values written as the data lists them are the data's: their schema violations are not the candidate's.
        return self._validated(info, candidate, "accepted after normalization", frozenset(set(args) - set(inexact)))

    def _missing_argument(self, acceptable: dict[str, Accepted], args: dict, info: SchemaInfo | None) -> str | None:
        """The first listed argument left out that may not be: its list lacks `""` (or the tool requires it),
        and its schema default, which omitting it means, is not one of its accepted values."""
        for arg, accepted in acceptable.items():
            if arg in args or arg in self._ignored:
                continue
            if self._left_out_wrongly(arg, accepted, info):
                why = "required by the tool, " if accepted.omittable else ""
                return f"missing argument {arg!r} ({why}accepted: {_accepted_text(accepted)})"
        return None

    def _left_out_wrongly(self, arg: str, accepted: Accepted, info: SchemaInfo | None) -> bool:
        """Leaving `arg` out is a miss: its list lacks `""` (or the tool requires it), and its schema default,
        which omitting it means, is not one of its accepted values."""
        required = _required(info) if self.config["validate_schema"] else frozenset()
        if accepted.omittable and arg not in required:
            return False
        defaults = info.defaults if (info is not None and self.config["drop_schema_defaults"]) else {}
        prop = info.props.get(arg) if info is not None else None
        return not (arg in defaults and self._accepts(accepted, loads_canonical(defaults[arg]), arg, prop))

    def _accepts(self, accepted: Accepted, value: Any, arg: str, prop: Any) -> bool:
        return any(self._match(option, value, arg, prop, arg) is None for option in accepted.values)

    def _match(self, option: Any, value: Any, path: str, prop: Any, name: str) -> tuple[str, str] | None:
        """One accepted value against the candidate's. A dict holds, per key, a list of accepted values (BFCL's
        dict_checker: `""` = the key may be left out), also as an item of a list."""
        if isinstance(option, dict) and isinstance(value, dict):
            for key in value:
                if key not in option:
                    return Reason.EXTRA_ARGUMENT, f"unexpected key {_join(path, key)!r}"
            for key, listed in option.items():
                values, omittable = _options(listed)
                where = _join(path, key)
                if key not in value:
                    if omittable:
                        continue
                    return Reason.MISSING_ARGUMENT, f"missing key {where!r}"
                sub = _sub_schema(prop, key)
                if not any(self._match(v, value[key], where, sub, key) is None for v in values):
                    return Reason.ARGUMENT_VALUE_DIFFERENT, (
                        f"{where}: got {_value_text(value[key], 60)}, accepted: {', '.join(map(_value_text, values))}")
            return None
        if isinstance(option, list) and isinstance(value, list) and any(isinstance(o, dict) for o in option):
            if len(option) != len(value):
                return Reason.ARGUMENT_VALUE_DIFFERENT, f"{path}: expected {len(option)} items, got {len(value)}"
            for i, (o, v) in enumerate(zip(option, value)):
                diff = self._match(o, v, _join(path, i), _sub_schema(prop, i), name)
                if diff is not None:
                    return diff
            return None
        return self.compare(option, value, path, prop, name)

    # -- values -----------------------------------------------------------------------------------
    def compare(self, exp: Any, cand: Any, path: str, prop: Any = None, name: str = "") -> tuple[str, str] | None:
        """None when equivalent, else (reason, detail) for the first difference found.

        `prop`: the value's schema when known (enums, free-text hints); `name`: the argument (or key) it is for.
        """
        if isinstance(exp, dict):
            if not isinstance(cand, dict):
                return Reason.ARGUMENT_VALUE_DIFFERENT, f"{path or 'arguments'}: expected object, got {json_type_name(cand)}"
            for key in exp:
                if key not in cand:
                    return Reason.MISSING_ARGUMENT, f"missing argument {_join(path, key)!r}"
            for key in cand:
                if key not in exp:
                    return Reason.EXTRA_ARGUMENT, f"unexpected argument {_join(path, key)!r}"
            for key in sorted(exp):
                diff = self.compare(exp[key], cand[key], _join(path, key), _sub_schema(prop, key), key)
                if diff is not None:
                    return diff
            return None
        if isinstance(exp, list):
            return self._compare_lists(exp, cand, path, prop, name)
        if isinstance(exp, str) and isinstance(cand, str):
            return self._compare_strings(exp, cand, path, prop, name)
        if _is_number(exp) and _is_number(cand):
            if numbers_equal(exp, cand, self.config["float_tolerance"]):
                return None
            return Reason.ARGUMENT_VALUE_DIFFERENT, f"{path}: expected {exp}, got {cand}"
        if type(exp) is type(cand) and exp == cand:  # booleans, null
            return None
        if json_type_name(exp) != json_type_name(cand):
            return Reason.ARGUMENT_VALUE_DIFFERENT, (
                f"{path}: expected {json_type_name(exp)} {_short(exp)}, got {json_type_name(cand)} {_short(cand)}")
        return Reason.ARGUMENT_VALUE_DIFFERENT, f"{path}: expected {_short(exp)}, got {_short(cand)}"

    def _compare_lists(self, exp: list, cand: Any, path: str, prop: Any, name: str) -> tuple[str, str] | None:
        if not isinstance(cand, list):
            return Reason.ARGUMENT_VALUE_DIFFERENT, f"{path}: expected array, got {json_type_name(cand)}"
        if len(exp) != len(cand):
            return Reason.ARGUMENT_VALUE_DIFFERENT, f"{path}: expected {len(exp)} items, got {len(cand)}"
        items = _sub_schema(prop, 0)
        first_diff = None
        for i, (e, c) in enumerate(zip(exp, cand)):
            diff = self.compare(e, c, _join(path, i), items, name)
            if diff is not None:
                first_diff = diff
                break
        if first_diff is None or not self.config["unordered_lists"] or len(exp) * len(exp) > _MAX_PAIRWISE:
            return first_diff
        pairs = max_bipartite_matching(len(exp), len(cand),
                                       lambda i, j: self.compare(exp[i], cand[j], "", items, name) is None)
        return None if len(pairs) == len(exp) else first_diff

    def _compare_strings(self, exp: str, cand: str, path: str, prop: Any, name: str) -> tuple[str, str] | None:
        if exp == cand:
            return None
        enum = prop.get("enum") if isinstance(prop, dict) else None
        if isinstance(enum, list):  # the enum lists the spellings the tool takes
            exp, cand = self._enum_member(exp, enum), self._enum_member(cand, enum)
            if exp == cand:
                return None
            if self.config["validate_schema"] and cand not in enum:
                return Reason.SCHEMA_INVALID, f"{path}: {_short(cand)} is not one of {_short(enum, 80)}"
            return Reason.ARGUMENT_VALUE_DIFFERENT, f"{path}: expected {_short(exp)}, got {_short(cand)}"
        if self.config["arithmetic"]:
            expressions = parse_expression(exp), parse_expression(cand)
            if None not in expressions:
                return _expression_verdict(*expressions, path)
        if normalize_string(exp, self._strings) == normalize_string(cand, self._strings):
            return None
        min_words = self.config["free_text_min_words"]
        if n_words(cand) >= min_words and is_free_text(name, prop, exp, n_words(exp), min_words):
            return self._compare_free_text(exp, cand, path)
        return Reason.ARGUMENT_VALUE_DIFFERENT, f"{path}: expected {_short(exp)}, got {_short(cand)}"

    def _enum_member(self, value: str, enum: list) -> str:
        """The enum member `value` spells under the string rule; the value as written when none or several do."""
        if value in enum:
            return value
        key = normalize_string(value, self._strings)
        spelled = [m for m in enum if isinstance(m, str) and normalize_string(m, self._strings) == key]
        return spelled[0] if len(spelled) == 1 else value

    def _as_enum_members(self, value: Any, prop: Any) -> Any:
        """`value` with every enum-constrained string replaced by the member it spells (what is validated)."""
        if isinstance(value, str):
            enum = prop.get("enum") if isinstance(prop, dict) else None
            return self._enum_member(value, enum) if isinstance(enum, list) else value
        if isinstance(value, dict):
            return {k: self._as_enum_members(v, _sub_schema(prop, k)) for k, v in value.items()}
        if isinstance(value, list):
            items = _sub_schema(prop, 0)
            return [self._as_enum_members(v, items) for v in value]
        return value

    def _compare_free_text(self, exp: str, cand: str, path: str) -> tuple[str, str] | None:
        """Free text: the same facts (unless facts: ignore), then similarity of the rest above the threshold."""
        if self.config["facts"] != "ignore":
            if max(len(exp), len(cand)) > _MAX_FREE_TEXT_CHARS:
                return Reason.ARGUMENT_VALUE_DIFFERENT, f"{path}: free text over {_MAX_FREE_TEXT_CHARS} chars differs"
            diff = text_fact_difference(exp, cand, self.config["facts"])
            if diff:
                return Reason.FACT_MISMATCH, f"{path}: {diff}"
            ne, nc = extract(exp).rest, extract(cand).rest
        else:
            ne, nc = normalize_string(exp, "exact"), normalize_string(cand, "exact")
        sim = self._free_text_similarity(ne, nc)
        if sim >= self.config["free_text_threshold"]:
            return None
        return Reason.ARGUMENT_VALUE_DIFFERENT, (
            f"{path}: free text similarity {sim:.2f} < {self.config['free_text_threshold']}")

    def _free_text_similarity(self, a: str, b: str) -> float:
        metric = self.config["free_text_metric"]
        if metric == "word_overlap":
            return word_overlap(a, b)
        scorer = fuzz.ratio if metric == "ratio" else fuzz.token_sort_ratio
        return scorer(a.casefold(), b.casefold()) / 100.0

    # -- parallel calls ---------------------------------------------------------------------------
    def score_calls(self, expected: tuple[Call, ...], candidate: tuple[Call, ...], tools: Any) -> Score:
        """Unordered multiset comparison of parallel calls by maximum bipartite matching (each expected call
        with its own accepted values)."""
        n_exp, n_cand = len(expected), len(candidate)
        if self.config["mode"] == "binary" and n_exp != n_cand:
            return Score(0.0, Reason.WRONG_CALL_COUNT, f"expected {n_exp} calls, got {n_cand}")
        # Identical calls pair up first in O(n); only the leftovers need pairwise comparison.
        left_exp, left_cand, exact = _pair_identical(expected, candidate)
        pair_scores: dict[tuple[int, int], Score] = {}

        def equivalent(i: int, j: int) -> bool:
            s = pair_scores.get((i, j))
            if s is None:
                s = pair_scores[(i, j)] = self.score_call(left_exp[i], left_cand[j], tools)
            return s.reward >= 1.0

        pairs = []
        if left_exp and left_cand and len(left_exp) * len(left_cand) <= _MAX_PAIRWISE:
            pairs = max_bipartite_matching(len(left_exp), len(left_cand), equivalent)
        tp = exact + len(pairs)
        if tp == n_exp == n_cand:
            return Score(1.0, Reason.OK, f"{tp} calls matched")
        reason, why = self._unmatched_reason(left_exp, left_cand, pairs, pair_scores, tools, n_exp, n_cand)
        detail = f"matched {tp} of {n_exp} expected calls ({n_cand} candidate calls); {why}"
        if self.config["mode"] == "binary" or tp == 0:
            return Score(0.0, reason, detail)
        precision, recall = tp / n_cand, tp / n_exp
        return Score(2 * precision * recall / (precision + recall), reason, detail)

    def _unmatched_reason(self, left_exp, left_cand, pairs, pair_scores, tools, n_exp, n_cand) -> tuple[str, str]:
        """Why the first unmatched expected call found no partner (its comparison with a same-name leftover)."""
        if n_exp != n_cand:
            return Reason.WRONG_CALL_COUNT, f"expected {n_exp} calls, got {n_cand}"
        used_exp = {i for i, _ in pairs}
        used_cand = {j for _, j in pairs}
        for i, call in enumerate(left_exp):
            if i in used_exp:
                continue
            for j, other in enumerate(left_cand):
                if j not in used_cand and other.name == call.name:
                    s = pair_scores.get((i, j)) or self.score_call(call, other, tools)
                    return s.reason, f"{call.name}: {s.detail}"
            return Reason.UNEXPECTED_TOOL, f"no candidate call to {call.name!r}"
        return Reason.WRONG_CALL_COUNT, "unmatched candidate calls"


def _expression_verdict(expected: Expression, candidate: Expression, path: str) -> tuple[str, str] | None:
    """Two parsed arithmetic expressions: None when equal, FACT_MISMATCH for a changed number."""
    diff = expression_difference(expected, candidate)
    if diff is None:
        return None
    number_changed, detail = diff
    return (Reason.FACT_MISMATCH if number_changed else Reason.ARGUMENT_VALUE_DIFFERENT), f"{path}: {detail}"


def numbers_equal(a: int | float, b: int | float, tolerance: float) -> bool:
    """Integers exactly (an id or an amount is a fact); otherwise |a - b| <= tolerance * max(|a|, |b|), a relative
    tolerance, so 1e-7 and 2e-7 differ as much as 1 and 2. Ints too large for a float compare exactly."""
    if a == b:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return False
    try:
        if not (math.isfinite(a) and math.isfinite(b)):  # JSON's NaN/Infinity: only equal to themselves
            return False
        return abs(a - b) <= tolerance * max(abs(a), abs(b))
    except OverflowError:
        return False


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pair_identical(expected: tuple[Call, ...], candidate: tuple[Call, ...]) -> tuple[list[Call], list[Call], int]:
    """Remove pairs written identically (name, arguments as sent); an expected call with accepted values is
    always compared. Returns (leftover expected, leftover candidate, n paired)."""
    remaining = Counter((c.name, c.raw_key) for c in candidate)
    left_exp = []
    exact = 0
    for call in expected:
        k = (call.name, call.raw_key)
        if call.acceptable is None and remaining[k] > 0:
            remaining[k] -= 1
            exact += 1
        else:
            left_exp.append(call)
    left_cand = []
    for call in candidate:
        k = (call.name, call.raw_key)
        if remaining[k] > 0:
            remaining[k] -= 1
            left_cand.append(call)
    return left_exp, left_cand, exact
