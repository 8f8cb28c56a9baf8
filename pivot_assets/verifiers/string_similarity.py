"""`string_similarity`: normalized text compared by a rapidfuzz similarity ratio against a threshold.

For replies (mode "text") and terminal commands (mode "commands": a call's command argument is shell-tokenized
with shlex, so quoting and spacing differences vanish: `ls  -la 'a b'` == `ls -la "a b"`). Calls are compared
pairwise in order: same tool name, then the similarity of their rendered arguments (the command string in
commands mode, canonical JSON otherwise).
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from typing import Any

from rapidfuzz import fuzz

from pivot_assets.core.ids import canonical_json

from .base import Param, Reason, Score, Verifier
from .canonical import normalize_text
from .exact import kind_mismatch
from .parsing import Call, Parsed

_SCORERS = {
    "ratio": fuzz.ratio,
    "token_sort_ratio": fuzz.token_sort_ratio,
    "token_set_ratio": fuzz.token_set_ratio,
    "partial_ratio": fuzz.partial_ratio,
}
_MAX_SHLEX = 100_000  # shlex is a pure-Python character loop: very long commands are split on whitespace


@lru_cache(maxsize=65536)
def shell_normalize(command: str) -> str:
    """Shell tokens joined by single spaces (quotes resolved); unbalanced quotes fall back to whitespace split."""
    if len(command) <= _MAX_SHLEX:
        try:
            return " ".join(shlex.split(command, posix=True))
        except ValueError:
            pass
    return " ".join(command.split())


class StringSimilarityVerifier(Verifier):
    """Similarity ratio >= threshold -> 1 (or the ratio itself when graded)."""

    name = "string_similarity"
    version = "1"
    params = {
        "threshold": Param("float", 0.8, lo=0.0, hi=1.0),
        "mode": Param("str", "text", choices=("text", "commands")),
        "scorer": Param("str", "ratio", choices=tuple(_SCORERS)),
        "ignore_case": Param("bool", False),
        "graded": Param("bool", False),
        "command_keys": Param("list", ["command", "cmd", "keystrokes", "commands", "script", "code"]),
        # Edit-distance ratios are quadratic in length: longer texts must match exactly after normalization.
        "max_chars": Param("int", 20_000, lo=1),
    }

    def score_parsed(self, expected: Parsed, candidate: Parsed, tools: Any, state: list | None) -> Score:
        mismatch = kind_mismatch(expected, candidate)
        if mismatch is not None:
            return mismatch
        if expected.kind == "text":
            return self._verdict(self._render_text(expected.text), self._render_text(candidate.text),
                                 Reason.TEXT_DIFFERENT, "reply")
        if len(expected.calls) != len(candidate.calls):
            return Score(0.0, Reason.WRONG_CALL_COUNT,
                         f"expected {len(expected.calls)} calls, got {len(candidate.calls)}")
        worst = Score(1.0, Reason.OK, "")
        for e, c in zip(expected.calls, candidate.calls):
            if e.name != c.name:
                return Score(0.0, Reason.UNEXPECTED_TOOL, f"expected {e.name!r}, got {c.name!r}")
            s = self._verdict(self._render_call(e), self._render_call(c), Reason.ARGUMENT_VALUE_DIFFERENT, e.name)
            if s.reward < worst.reward:
                worst = s
            if s.reward == 0.0:
                break
        return worst

    def similarity(self, a: str, b: str) -> float:
        """Similarity in [0, 1] of two already-normalized strings."""
        if a == b:
            return 1.0
        if len(a) > self.config["max_chars"] or len(b) > self.config["max_chars"]:
            return 0.0
        return _SCORERS[self.config["scorer"]](a, b) / 100.0

    def _verdict(self, a: str, b: str, fail_reason: str, what: str) -> Score:
        sim = self.similarity(a, b)
        threshold = self.config["threshold"]
        if sim >= threshold:
            return Score(sim if self.config["graded"] else 1.0, Reason.OK, f"{what} similarity {sim:.2f}")
        too_long = max(len(a), len(b)) > self.config["max_chars"]
        why = f"longer than {self.config['max_chars']} chars and not identical" if too_long else f"similarity {sim:.2f} < {threshold}"
        return Score(sim if self.config["graded"] else 0.0, fail_reason, f"{what} {why}")

    def _render_text(self, text: str) -> str:
        text = normalize_text(text, self.config["ignore_case"])
        return shell_normalize(text) if self.config["mode"] == "commands" else text

    def _render_call(self, call: Call) -> str:
        if self.config["mode"] == "commands":
            for key in self.config["command_keys"]:
                value = call.args.get(key)
                if isinstance(value, str):
                    return shell_normalize(normalize_text(value, self.config["ignore_case"]))
                if isinstance(value, list) and all(isinstance(v, str) for v in value):
                    return shell_normalize(normalize_text(" ".join(value), self.config["ignore_case"]))
        return normalize_text(canonical_json(call.args), self.config["ignore_case"])
