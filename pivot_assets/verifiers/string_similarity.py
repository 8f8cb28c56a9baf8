"""`string_similarity`: facts first, then normalized text compared by a rapidfuzz ratio against a threshold.

For replies (mode "text") and terminal commands (mode "commands": a call's command argument is shell-tokenized
with shlex, so quoting and spacing differences vanish: `ls  -la 'a b'` == `ls -la "a b"`). Calls are compared
pairwise in order: same tool name, then the similarity of their rendered arguments (the command string in
commands mode, canonical JSON otherwise).

Facts (facts.py: ids, amounts, numbers with units, dates, times, emails, URLs, quoted strings, all-caps codes)
are checked before any similarity: `facts: exact` (default) wants the candidate's facts to equal the expert's
as a multiset, `subset` lets the candidate leave facts out but never state one the expert did not, `ignore`
is the old similarity-only comparison. A difference is reward 0, FACT_MISMATCH, with the first differing fact
in the detail ("reply: expected $45, got $450"). In fact-aware mode the similarity is then computed on the
text without its facts, case-folded, with markdown and punctuation removed, so surface variants (emphasis,
spacing, punctuation, the case of ordinary words) score 1: for replies on the text, for calls on the
canonical JSON of the arguments with every string value so reduced (an arithmetic string is one fact, see
arithmetic.py). Commands (mode commands) keep their punctuation and case: facts, then the shell-normalized
command string as before.

Graded (`graded: true`): the reward is the similarity itself (0 for a fact mismatch, another tool or a wrong call
count), and a sample passes (Verifier.passes: n_pass, pass_rate) when it reaches `threshold`, its OK verdict;
ungraded rewards are 0 or 1 and pass at 1.
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
from .facts import (FACT_MODES, TextFacts, extract, fact_difference, surface_json, text_fact_difference,
                    value_facts_of_key)
from .parsing import Call, Parsed
from .registry import register

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


@register
class StringSimilarityVerifier(Verifier):
    """Similarity ratio >= threshold -> 1 (or the ratio itself when graded)."""

    name = "string_similarity"
    version = "2"
    params = {
        "facts": Param("str", "exact", choices=FACT_MODES),
        "threshold": Param("float", 0.8, lo=0.0, hi=1.0),
        "mode": Param("str", "text", choices=("text", "commands")),
        "scorer": Param("str", "ratio", choices=tuple(_SCORERS)),
        "ignore_case": Param("bool", False),
        "graded": Param("bool", False),
        "command_keys": Param("list", ["command", "cmd", "keystrokes", "commands", "script", "code"]),
        # Edit-distance ratios are quadratic in length: longer texts must match exactly after normalization.
        "max_chars": Param("int", 20_000, lo=1),
    }

    @property
    def pass_threshold(self) -> float:
        """Graded: `threshold` (the OK verdict); else 1.0."""
        return self.config["threshold"] if self.config["graded"] else 1.0

    def score_parsed(self, expected: Parsed, candidate: Parsed, tools: Any, state: list | None) -> Score:
        mismatch = kind_mismatch(expected, candidate)
        if mismatch is not None:
            return mismatch
        if expected.kind == "text":
            return self.score_text(expected.text, candidate.text)
        if len(expected.calls) != len(candidate.calls):
            return Score(0.0, Reason.WRONG_CALL_COUNT,
                         f"expected {len(expected.calls)} calls, got {len(candidate.calls)}")
        worst = Score(1.0, Reason.OK, "")
        for e, c in zip(expected.calls, candidate.calls):
            if e.name != c.name:
                return Score(0.0, Reason.UNEXPECTED_TOOL, f"expected {e.name!r}, got {c.name!r}")
            s = self._call_verdict(e, c)
            if s.reward < worst.reward:
                worst = s
            if s.reward == 0.0:
                break
        return worst

    def _call_verdict(self, expected: Call, candidate: Call) -> Score:
        """Two calls to the same tool: facts of the arguments (or command), then similarity of the rendering."""
        a, b = self._render_call(expected), self._render_call(candidate)
        if a == b or not self._facts_decide(a, b):
            return self._verdict(a, b, Reason.ARGUMENT_VALUE_DIFFERENT, expected.name)
        diff = self._fact_difference(self._call_facts(expected, a), self._call_facts(candidate, b))
        if diff:
            return Score(0.0, Reason.FACT_MISMATCH, f"{expected.name}: {diff}")
        if not self._is_command_call(expected):
            # As for replies: the values without their facts, case, punctuation and markdown are compared.
            a, b = surface_json(expected.key), surface_json(candidate.key)
        return self._verdict(a, b, Reason.ARGUMENT_VALUE_DIFFERENT, expected.name)

    def _facts_decide(self, a: str, b: str) -> bool:
        """Facts are checked unless turned off, or a text is too long to be anything but identical."""
        return self.config["facts"] != "ignore" and max(len(a), len(b)) <= self.config["max_chars"]

    def score_text(self, expected: str, candidate: str) -> Score:
        """Reply against reply: identical after normalization, else facts, then similarity."""
        a, b = self._render_text(expected), self._render_text(candidate)
        if a == b or not self._facts_decide(a, b):
            return self._verdict(a, b, Reason.TEXT_DIFFERENT, "reply")
        if self.config["mode"] == "commands":  # commands keep their punctuation: facts only, then the old ratio
            diff = self._fact_difference(extract(a), extract(b))
            return Score(0.0, Reason.FACT_MISMATCH, f"reply: {diff}") if diff else self._verdict(
                a, b, Reason.TEXT_DIFFERENT, "reply")
        diff = text_fact_difference(expected, candidate, self.config["facts"])
        if diff:
            return Score(0.0, Reason.FACT_MISMATCH, f"reply: {diff}")
        return self._verdict(extract(expected).rest, extract(candidate).rest, Reason.TEXT_DIFFERENT, "reply")

    def _fact_difference(self, expected: TextFacts, candidate: TextFacts) -> str | None:
        return fact_difference(expected, candidate, self.config["facts"])

    def _call_facts(self, call: Call, rendered: str) -> TextFacts:
        """Facts of the command string (commands mode) or of the argument values."""
        if self._is_command_call(call):
            return extract(rendered)
        return value_facts_of_key(call.key)

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

    def _command(self, call: Call) -> str | None:
        """The call's command text (first of command_keys holding a string or a list of strings), or None."""
        for key in self.config["command_keys"]:
            value = call.args.get(key)
            if isinstance(value, str):
                return value
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return " ".join(value)
        return None

    def _is_command_call(self, call: Call) -> bool:
        return self.config["mode"] == "commands" and self._command(call) is not None

    def _render_call(self, call: Call) -> str:
        command = self._command(call) if self.config["mode"] == "commands" else None
        if command is not None:
            return shell_normalize(normalize_text(command, self.config["ignore_case"]))
        return normalize_text(canonical_json(call.args), self.config["ignore_case"])
