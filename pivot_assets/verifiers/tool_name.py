"""`tool_name`: operation type only (the paper's SWE verifier).

A call is accepted when its tool (or the tool's category in the alias table, e.g. {str_replace_editor: edit,
sed: edit, grep: search}) matches the expert's; arguments are ignored. Parallel calls compare as a multiset of
categories. A reply where a reply is expected is compared as text: by `text_verifier` when given, else by
string_similarity at threshold 0.5 with facts exact (the default text comparison of tool_call), so a reply
that states a wrong id or amount is not the "same operation". `accept_any_reply: true` restores the old
flat 1.0 for any reply against any reply (the paper's SWE setting, where replies are not graded).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .base import Param, Reason, Score, Verifier
from .exact import kind_mismatch
from .parsing import Parsed
from .registry import build_verifier, register

DEFAULT_TEXT_VERIFIER = {"name": "string_similarity", "threshold": 0.5}


@register
class ToolNameVerifier(Verifier):
    """Same operation type (tool name or its alias category)."""

    name = "tool_name"
    version = "2"
    params = {
        "aliases": Param("dict", {}),
        "text_verifier": Param("spec", None),
        "accept_any_reply": Param("bool", False),
    }

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        bad = [k for k, v in self.config["aliases"].items() if not isinstance(v, str)]
        if bad:
            raise ValueError(f"verifier 'tool_name': alias {bad[0]!r} must map to a category string")
        spec = self.config["text_verifier"]
        if spec and self.config["accept_any_reply"]:
            raise ValueError("verifier 'tool_name': give either 'text_verifier' or 'accept_any_reply', not both")
        self.text_verifier = None if self.config["accept_any_reply"] else build_verifier(spec or DEFAULT_TEXT_VERIFIER)

    def children(self) -> dict:
        return {"text_verifier": self.text_verifier} if self.text_verifier else {}

    def category(self, tool: str) -> str:
        return self.config["aliases"].get(tool, tool)

    def score_parsed(self, expected: Parsed, candidate: Parsed, tools: Any, state: list | None) -> Score:
        mismatch = kind_mismatch(expected, candidate)
        if mismatch is not None:
            return mismatch
        if expected.kind == "text":
            if self.text_verifier is not None:
                return self.text_verifier.score_parsed(expected, candidate, tools, state)
            return Score(1.0, Reason.OK, "both are replies (accept_any_reply)")
        exp = Counter(self.category(c.name) for c in expected.calls)
        cand = Counter(self.category(c.name) for c in candidate.calls)
        if exp == cand:
            return Score(1.0, Reason.OK, "")
        if len(expected.calls) != len(candidate.calls):
            return Score(0.0, Reason.WRONG_CALL_COUNT,
                         f"expected {len(expected.calls)} calls, got {len(candidate.calls)}")
        missing = sorted((exp - cand).elements())
        got = sorted((cand - exp).elements())
        return Score(0.0, Reason.UNEXPECTED_TOOL, f"expected {missing}, got {got}")
