"""Verifier interface: Score, Reason categories, parameter checking and fingerprints (Dagster-free).

A verifier maps (expected action, candidate completion, tools, state) to a Score: a reward in [0, 1] plus a
reason category that says why. Its fingerprint (hash of name, version, the verdict-relevant config and the
code of the verifier's modules, see code_version.py) is the code version of the scoring stage: changing any
of them makes every stored reward stale.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, NamedTuple

from pivot_assets.core.ids import canonical_json, short_hash

from .code_version import code_hash
from .parsing import Parsed, is_truncation, prepare_candidate, prepare_expected


class Reason:
    """Reason categories (plain strings so they store as-is in Parquet and group in SQL)."""

    OK = "OK"
    PARSE_ERROR = "PARSE_ERROR"  # candidate text could not be turned into an action
    INVALID_EXPECTED = "INVALID_EXPECTED"  # the expert action itself is malformed (a data bug, not the sample's)
    UNEXPECTED_TOOL = "UNEXPECTED_TOOL"
    MISSING_ARGUMENT = "MISSING_ARGUMENT"
    EXTRA_ARGUMENT = "EXTRA_ARGUMENT"
    ARGUMENT_VALUE_DIFFERENT = "ARGUMENT_VALUE_DIFFERENT"
    SCHEMA_INVALID = "SCHEMA_INVALID"
    SPOKE_INSTEAD_OF_CALL = "SPOKE_INSTEAD_OF_CALL"
    CALLED_INSTEAD_OF_SPEAK = "CALLED_INSTEAD_OF_SPEAK"
    TEXT_DIFFERENT = "TEXT_DIFFERENT"
    FACT_MISMATCH = "FACT_MISMATCH"  # a reply or free-text argument states another id, amount, date, number...
    WRONG_CALL_COUNT = "WRONG_CALL_COUNT"
    JUDGE_REJECTED = "JUDGE_REJECTED"  # the judge answered: not equivalent
    JUDGE_ERROR = "JUDGE_ERROR"  # the judge could not be asked or gave no usable verdict
    # the sample ran out of tokens (a <think> never closed, a tool call cut off): reward 0 like a wrong answer,
    # but counted apart, so a turn that is hard only because of max_new_tokens shows as such (sql/pivot_funnel.sql)
    TRUNCATED = "TRUNCATED"

    ALL: ClassVar[tuple[str, ...]]


Reason.ALL = tuple(v for k, v in vars(Reason).items() if k.isupper() and isinstance(v, str))


class Score(NamedTuple):
    """One verdict: reward in [0, 1], a Reason category, and a short human-readable detail."""

    reward: float
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class Param:
    """One declared verifier parameter.

    kind: "float" | "int" | "bool" | "str" | "dict" | "list" | "spec" | "specs".
    in_fingerprint=False marks operational settings (timeouts, cache paths, env var names) that never
    change a verdict, so editing them does not re-score the warehouse.
    """

    kind: str
    default: Any = None
    choices: tuple = ()
    lo: float | None = None
    hi: float | None = None
    required: bool = False
    in_fingerprint: bool = True


_KIND_CHECKS = {
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "dict": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "spec": lambda v: isinstance(v, dict) and isinstance(v.get("name"), str),
    "specs": lambda v: isinstance(v, list) and all(isinstance(s, dict) and isinstance(s.get("name"), str) for s in v),
}


def check_config(verifier_name: str, params: dict[str, Param], config: dict, retired: dict | None = None) -> dict:
    """Validated config with defaults filled in; raises ValueError naming the first bad parameter.

    retired: parameters a later version replaced -> what to write instead.
    """
    for key in config:
        if retired and key in retired:
            raise ValueError(f"verifier {verifier_name!r}: parameter {key!r} was replaced: {retired[key]}")
        if key not in params:
            known = ", ".join(sorted(params)) or "none"
            raise ValueError(f"verifier {verifier_name!r}: unknown parameter {key!r} (known: {known})")
    out = {}
    for key, p in params.items():
        if key not in config:
            if p.required:
                raise ValueError(f"verifier {verifier_name!r}: missing required parameter {key!r}")
            out[key] = copy.deepcopy(p.default)  # mutable defaults ([], {}) are never shared
            continue
        value = config[key]
        if value is None and not p.required and p.default is None:
            out[key] = None
            continue
        if not _KIND_CHECKS[p.kind](value):
            raise ValueError(f"verifier {verifier_name!r}: parameter {key!r} must be {p.kind}, got {value!r:.80}")
        if p.choices and value not in p.choices:
            raise ValueError(f"verifier {verifier_name!r}: parameter {key!r} must be one of {list(p.choices)}, got {value!r}")
        if (p.lo is not None and value < p.lo) or (p.hi is not None and value > p.hi):
            raise ValueError(f"verifier {verifier_name!r}: parameter {key!r}={value} outside [{p.lo}, {p.hi}]")
        out[key] = float(value) if p.kind == "float" else value
    return out


class Verifier:
    """Base class. Subclasses set name/version/params and implement `score_parsed`."""

    name: ClassVar[str] = ""
    version: ClassVar[str] = "1"
    params: ClassVar[dict[str, Param]] = {}
    retired: ClassVar[dict[str, str]] = {}  # parameter a later version replaced -> what to write instead

    def __init__(self, **config: Any) -> None:
        self.config: dict = check_config(self.name, self.params, config, self.retired)

    # -- identity ---------------------------------------------------------------------------------
    def children(self) -> dict[str, "Verifier | list[Verifier]"]:
        """Nested verifiers (stack steps, text verifier): fingerprinted by their own fingerprints."""
        return {}

    @property
    def fingerprint(self) -> str:
        """Stable short hash of name + version + verdict-relevant config + code (nested verifiers by fingerprint)."""
        cfg = {k: v for k, v in self.config.items() if self.params[k].in_fingerprint}
        for key, child in self.children().items():
            cfg[key] = [c.fingerprint for c in child] if isinstance(child, list) else child.fingerprint
        return short_hash(canonical_json({"name": self.name, "version": self.version, "config": cfg,
                                          "code": code_hash(type(self).__module__)}))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fingerprint={self.fingerprint}, config={self.config})"

    # -- passing ----------------------------------------------------------------------------------
    @property
    def pass_threshold(self) -> float:
        """A sample passes (turn_profiles.n_pass, the exports' pass_rate) when its reward is above 0 and at least
        this: the verifier's `pass_threshold` parameter where it has one, else 1.0 (a 0/1 reward passes at 1)."""
        return float(self.config.get("pass_threshold", 1.0))

    def passes(self, reward: float) -> bool:
        return passes(reward, self.pass_threshold)

    # -- scoring ----------------------------------------------------------------------------------
    def score(self, expected_action: dict | str, candidate: Any, tools: list | str | None = None,
              state: list | None = None) -> Score:
        """Score one candidate (raw completion text or an action/message dict) against the expert action."""
        expected, err = prepare_expected(expected_action)
        if expected is None:
            return Score(0.0, Reason.INVALID_EXPECTED, err or "")
        parsed, err = prepare_candidate(candidate)
        if parsed is None:
            reason = Reason.TRUNCATED if is_truncation(err) else Reason.PARSE_ERROR
            return Score(0.0, reason, (err or "").encode("utf-8", "replace").decode("utf-8"))
        try:
            score = self.score_parsed(expected, parsed, tools, state)
        except RecursionError:
            # Adversarial nesting deeper than the interpreter allows: a bad sample, not a crash.
            return Score(0.0, Reason.ARGUMENT_VALUE_DIFFERENT, "arguments nested too deeply to compare")
        if score.detail and not score.detail.isascii():
            # Details quote sample text; lone surrogates would break UTF-8 stores (Parquet, JSONL).
            score = score._replace(detail=score.detail.encode("utf-8", "replace").decode("utf-8"))
        return score

    def score_many(self, items: Iterable[dict]) -> list[Score]:
        """Score a batch of {expected_action, candidate, tools?, state?} dicts, in order."""
        return [self.score(it.get("expected_action"), it.get("candidate"), it.get("tools"), it.get("state"))
                for it in items]

    def score_parsed(self, expected: Parsed, candidate: Parsed, tools: Any, state: list | None) -> Score:
        raise NotImplementedError


def tools_as_list(tools: list | str | None) -> list:
    """Tools given as a list, a JSON string or None -> list (malformed JSON -> empty: schemas just unknown)."""
    if tools is None:
        return []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            return []
    return tools if isinstance(tools, list) else []


def passes(reward: float, pass_threshold: float) -> bool:
    """Whether a sample with this reward passes: above 0 (a 0 never passes, whatever the threshold) and at least the
    threshold. profiling/profiler.py counts n_pass by the same rule in SQL."""
    return reward > 0.0 and reward >= pass_threshold
