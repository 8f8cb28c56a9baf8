"""`stack`: an ordered list of verifiers (e.g. schema check -> similarity -> judge) with all/any semantics.

mode all: every step must pass (reward >= pass_threshold); the first failing step's Score is the verdict
(its reason and detail, prefixed by the step name), later steps are not run (the judge is asked only about
samples the cheap steps let through). All pass -> OK with the lowest step reward.
mode any: the first passing step's reward wins (later steps not run); none passes -> the first step's Score.
"""

from __future__ import annotations

from typing import Any, Iterable

from .base import Param, Reason, Score, Verifier
from .parsing import Parsed, prepare_candidate, prepare_expected
from .registry import build_verifier, register


@register
class StackVerifier(Verifier):
    """Ordered verifier steps combined with all/any."""

    name = "stack"
    version = "1"
    params = {
        "steps": Param("specs", required=True),
        "mode": Param("str", "all", choices=("all", "any")),
        "pass_threshold": Param("float", 1.0, lo=0.0, hi=1.0),
    }

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        if not self.config["steps"]:
            raise ValueError("verifier 'stack': 'steps' must list at least one verifier")
        self.steps = [build_verifier(spec) for spec in self.config["steps"]]

    def children(self) -> dict:
        return {"steps": self.steps}

    def _passes(self, s: Score) -> bool:
        return s.reward >= self.config["pass_threshold"] and s.reason == Reason.OK

    def _combine(self, step_scores: list[tuple[Verifier, Score]]) -> Score:
        """Verdict from the step scores computed so far (in step order)."""
        if self.config["mode"] == "all":
            for step, s in step_scores:
                if not self._passes(s):
                    return Score(s.reward, s.reason, f"{step.name}: {s.detail}")
            return Score(min(s.reward for _, s in step_scores), Reason.OK, "all steps passed")
        for step, s in step_scores:
            if self._passes(s):
                return Score(s.reward, Reason.OK, f"{step.name}: {s.detail}")
        step, s = step_scores[0]
        return Score(s.reward, s.reason, f"{step.name}: {s.detail}")

    def score_parsed(self, expected: Parsed, candidate: Parsed, tools: Any, state: list | None) -> Score:
        done: list[tuple[Verifier, Score]] = []
        for step in self.steps:
            s = step.score_parsed(expected, candidate, tools, state)
            done.append((step, s))
            if self._passes(s) != (self.config["mode"] == "all"):
                break
        return self._combine(done)

    def score_many(self, items: Iterable[dict]) -> list[Score]:
        """Step by step over the whole batch, so each step (a judge especially) sees one batch call."""
        items = list(items)
        done: list[list[tuple[Verifier, Score]]] = [[] for _ in items]
        final: list[Score | None] = [None] * len(items)
        for i, it in enumerate(items):  # parse errors are decided once, before any step
            if prepare_expected(it.get("expected_action"))[0] is None or prepare_candidate(it.get("candidate"))[0] is None:
                final[i] = self.steps[0].score(it.get("expected_action"), it.get("candidate"))
        open_idx = [i for i in range(len(items)) if final[i] is None]
        for step in self.steps:
            if not open_idx:
                break
            scores = step.score_many([items[i] for i in open_idx])
            still_open = []
            for i, s in zip(open_idx, scores):
                done[i].append((step, s))
                if self._passes(s) == (self.config["mode"] == "all"):
                    still_open.append(i)
            open_idx = still_open
        return [f if f is not None else self._combine(d) for f, d in zip(final, done)]
