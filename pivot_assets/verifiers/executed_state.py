"""`executed_state`: a step is right when executing it leaves the world as the expert's step does (BFCL's rule).

For a turn whose trajectory is executable (its state carries an `environment`, environments/; BFCL multi-turn
today), the world at the step is rebuilt once per turn: fresh from the trajectory's context, then every call of
the expert's earlier assistant messages executed in order. The expert's call(s) run on one copy of it and each
sample's calls, in the order written, on another copy of its own (nothing is shared between samples or turns;
how a copy is kept is the kind's: BFCL copies its instances, tau2 undoes each write from a log on one database per
process, so a copy costs what its calls touch).
The sample is right (reward 1, OK) when both of BFCL's multi-turn checks hold at the step:
  1. state: the world after the sample's calls equals the world after the expert's (BFCL's state_checker: every
     public attribute of every involved instance);
  2. results: each result of the expert's calls is among the sample's results, as an unordered multiset (BFCL's
     response_checker), where the results of calls made in earlier BFCL turns (before the last user message)
     also count, as BFCL lets a model reuse what it already asked in an earlier turn.
So call order within the step, a relative path after `cd`, an extra read-only call or any rewrite that does the
same thing pass, and a truncated text written into the world does not. A sample that does not parse, calls a
tool the world lacks, binds no arguments to it, or raises, scores 0 with the reason. Differences from BFCL's
whole-turn checker by design (the step is the unit): a call another step of the turn would make, done now, or
an order across steps, is judged at this step.

Turns without an environment (another source, or an expected reply) go to `fallback` (default `tool_call`), so
the verifier can be a domain's or the default one on mixed data. Verdicts are cached per turn and distinct
candidate, so K samples that repeat execute once.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

from pivot_assets.core.ids import canonical_json, short_hash
from pivot_assets.core.shapes import arguments_dict, as_canonical_messages
from pivot_assets.environments import CallFailed, Environment, parse_environment
from pivot_assets.environments.base import environment_versions, environments_code_hash

from .base import Param, Reason, Score, Verifier
from .canonical import canonical_key
from .parsing import Call, Parsed
from .registry import build_verifier, register

_CALL_FAILED_REASONS = {"unknown_tool": Reason.UNEXPECTED_TOOL, "missing_argument": Reason.MISSING_ARGUMENT,
                        "extra_argument": Reason.EXTRA_ARGUMENT, "bad_arguments": Reason.SCHEMA_INVALID,
                        "not_a_call": Reason.PARSE_ERROR, "raised": Reason.ARGUMENT_VALUE_DIFFERENT}
_STATE_KEYS_MAX = 4096


class _Turn:
    """One turn's rebuilt world, what earlier BFCL turns returned, and the expert's and samples' outcomes."""

    __slots__ = ("env", "world", "prior", "expected", "verdicts")

    def __init__(self, env: Environment, world: Any, prior: Counter) -> None:
        self.env, self.world, self.prior = env, world, prior
        self.expected: dict[str, tuple[Any, list[str]] | Score] = {}  # expected key -> (world, results) or failure
        self.verdicts: dict[tuple[str, str], Score] = {}


def _calls_key(calls: tuple[Call, ...]) -> str:
    return canonical_key([[c.name, c.raw_key] for c in calls])


def earlier_calls(messages: list) -> tuple[list[tuple[str, dict]], int]:
    """The calls of the assistant messages in order, and how many of them come before the last user message
    (the calls of earlier BFCL turns)."""
    calls, before_last_user = [], 0
    for m in as_canonical_messages(messages):
        if m["role"] == "user":
            before_last_user = len(calls)
        for c in m.get("tool_calls") or []:
            calls.append((c["name"], arguments_dict(c["name"], c.get("arguments"))))
    return calls, before_last_user


@register
class ExecutedStateVerifier(Verifier):
    """Replay the sample in the environment and compare the world with the expert's (module docstring)."""

    name = "executed_state"
    version = "1"
    params = {
        # Turns with no environment, and expected replies: this verifier's verdict (default: tool_call).
        "fallback": Param("spec", None),
        # Results of calls made in earlier BFCL turns count toward check 2 (BFCL's rule); False: only the sample's.
        "prior_turn_results": Param("bool", True),
        # Also compare the private state later calls read (the working directory), which BFCL checks only through
        # the later calls' results; False: public attributes only (BFCL's state_checker).
        "working_state": Param("bool", True),
        "cache_turns": Param("int", 256, lo=1, in_fingerprint=False),  # rebuilt worlds kept (LRU)
    }

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.fallback = build_verifier(self.config["fallback"] or {"name": "tool_call"})
        self._turns: OrderedDict[str, _Turn | Score] = OrderedDict()
        self._state_keys: dict[int, tuple[Any, str]] = {}

    def children(self) -> dict:
        return {"fallback": self.fallback}

    @property
    def fingerprint(self) -> str:
        """The base fingerprint plus the environments' code and the simulators' versions (verdicts depend on both)."""
        return short_hash(canonical_json({"verifier": super().fingerprint, "environments": environments_code_hash(),
                                          "simulators": environment_versions()}))

    # -- scoring ----------------------------------------------------------------------------------
    def score_parsed(self, expected: Parsed, candidate: Parsed, tools: Any, state: list | None) -> Score:
        environment = getattr(state, "environment", None)
        if environment is None or expected.kind == "text":
            return self.fallback.score_parsed(expected, candidate, tools, state)
        if candidate.kind == "text":
            return Score(0.0, Reason.SPOKE_INSTEAD_OF_CALL, f"expected a call to {expected.calls[0].name!r}, got a reply")
        turn = self._turn(state, environment)
        if isinstance(turn, Score):
            return turn
        key = (_calls_key(expected.calls), _calls_key(candidate.calls))
        verdict = turn.verdicts.get(key)
        if verdict is None:
            verdict = turn.verdicts[key] = self._judge(turn, expected, candidate, key[0])
        return verdict

    def _judge(self, turn: _Turn, expected: Parsed, candidate: Parsed, expected_key: str) -> Score:
        reference = turn.expected.get(expected_key)
        if reference is None:
            reference = turn.expected[expected_key] = self._run_expected(turn, expected)
        if isinstance(reference, Score):
            return reference
        expected_world, expected_results = reference
        world = turn.env.copy(turn.world)
        results = []
        for call in candidate.calls:
            try:
                results.append(turn.env.execute(world, call.name, call.raw).text)
            except CallFailed as exc:
                return Score(0.0, _CALL_FAILED_REASONS.get(exc.category, Reason.ARGUMENT_VALUE_DIFFERENT),
                             f"{exc.category}: {exc.detail}")
        wrong = (Reason.ARGUMENT_VALUE_DIFFERENT if {c.name for c in candidate.calls} & {c.name for c in expected.calls}
                 else Reason.UNEXPECTED_TOOL)
        diff = turn.env.differences(world, expected_world, self.config["working_state"])
        if diff is not None:
            return Score(0.0, wrong, f"state after the calls differs from the expert's: {diff}")
        available = Counter(results) + (turn.prior if self.config["prior_turn_results"] else Counter())
        missing = Counter(expected_results) - available
        if missing:
            text = next(iter(missing))
            return Score(0.0, wrong, f"the expert's result is not among the sample's: {text[:80]!r}")
        return Score(1.0, Reason.OK, "same state and results as the expert's")

    def _run_expected(self, turn: _Turn, expected: Parsed) -> tuple[Any, list[str]] | Score:
        world = turn.env.copy(turn.world)
        try:
            results = [turn.env.execute(world, c.name, c.raw).text for c in expected.calls]
        except CallFailed as exc:
            return Score(0.0, Reason.INVALID_EXPECTED, f"the expert's call does not run: {exc}")
        return world, results

    # -- the world at a turn, built once per turn -------------------------------------------------
    def _turn(self, state: list, environment: Any) -> _Turn | Score:
        key = self._state_key(state, environment)
        turn = self._turns.get(key)
        if turn is not None:
            self._turns.move_to_end(key)
            return turn
        turn = self._turns[key] = self._rebuild(state, environment)
        while len(self._turns) > self.config["cache_turns"]:
            self._turns.popitem(last=False)
        return turn

    def _state_key(self, state: list, environment: Any) -> str:
        """The turn's cache key: the environment and the earlier calls; found by identity for a state object
        seen before (profiling hands one state to all K samples of a turn)."""
        hit = self._state_keys.get(id(state))
        if hit is not None and hit[0] is state:
            return hit[1]
        try:
            calls = earlier_calls(state)
        except (ValueError, KeyError, TypeError) as exc:
            calls = ("unreadable", str(exc))
        key = short_hash(canonical_json({"environment": environment, "calls": calls}))
        if len(self._state_keys) >= _STATE_KEYS_MAX:
            self._state_keys.clear()
        self._state_keys[id(state)] = (state, key)
        return key

    def _rebuild(self, state: list, environment: Any) -> _Turn | Score:
        try:
            env, context = parse_environment(environment)
            calls, before_last_user = earlier_calls(state)
        except (ValueError, KeyError, TypeError) as exc:
            return Score(0.0, Reason.INVALID_EXPECTED, f"environment or earlier calls unreadable: {exc}")
        try:
            world, outcomes = env.rebuild(context, calls)
        except CallFailed as exc:
            if exc.category.endswith("_unavailable"):
                raise RuntimeError(f"verifier 'executed_state': {exc}") from None
            return Score(0.0, Reason.INVALID_EXPECTED, f"an earlier expert call does not run: {exc}")
        except ValueError as exc:
            return Score(0.0, Reason.INVALID_EXPECTED, str(exc))
        return _Turn(env, world, Counter(o.text for o in outcomes[:before_last_user]))
