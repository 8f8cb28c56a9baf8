"""`exact`: the strict baseline for the ablation (the paper's exact-match reward).

Same tool names in the same order with identical canonical arguments (key order, number formatting and JSON
whitespace do not count as differences); text identical after whitespace normalization.
"""

from __future__ import annotations

from typing import Any

from .base import Reason, Score, Verifier
from .canonical import normalize_text
from .parsing import Parsed
from .registry import register


def kind_mismatch(expected: Parsed, candidate: Parsed) -> Score | None:
    """The shared text-vs-call verdicts (0 either way), or None when the kinds agree."""
    if expected.kind == candidate.kind:
        return None
    if expected.kind == "text":
        return Score(0.0, Reason.CALLED_INSTEAD_OF_SPEAK, f"expected a reply, got a call to {candidate.calls[0].name!r}")
    return Score(0.0, Reason.SPOKE_INSTEAD_OF_CALL, f"expected a call to {expected.calls[0].name!r}, got a reply")


@register
class ExactVerifier(Verifier):
    """Exact match after canonical JSON / whitespace normalization."""

    name = "exact"
    version = "1"
    params = {}

    def score_parsed(self, expected: Parsed, candidate: Parsed, tools: Any, state: list | None) -> Score:
        mismatch = kind_mismatch(expected, candidate)
        if mismatch is not None:
            return mismatch
        if expected.kind == "text":
            if normalize_text(expected.text) == normalize_text(candidate.text):
                return Score(1.0, Reason.OK, "")
            return Score(0.0, Reason.TEXT_DIFFERENT, "reply text differs")
        if len(expected.calls) != len(candidate.calls):
            return Score(0.0, Reason.WRONG_CALL_COUNT,
                         f"expected {len(expected.calls)} calls, got {len(candidate.calls)}")
        for i, (e, c) in enumerate(zip(expected.calls, candidate.calls)):
            if e.name != c.name:
                return Score(0.0, Reason.UNEXPECTED_TOOL, f"call {i}: expected {e.name!r}, got {c.name!r}")
            if e.key != c.key:
                return Score(0.0, Reason.ARGUMENT_VALUE_DIFFERENT, f"call {i} ({e.name}): arguments differ")
        return Score(1.0, Reason.OK, "")
