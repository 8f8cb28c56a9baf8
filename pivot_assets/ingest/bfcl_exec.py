"""BFCL multi-turn ground-truth calls, executed by BFCL's own simulated APIs (Dagster-free).

BFCL keeps a multi-turn answer as call strings ("cd(folder='document')", "sort('final_report.pdf')"). A call is
parsed with `ast` (only literal arguments; nothing is ever evaluated), its positional arguments are named from the
method's signature, and it runs on the world of environments/bfcl.py (the one place that runs BFCL's simulated
APIs as BFCL's checker does; the `executed_state` verifier replays sampled calls on the same worlds).

A call BFCL itself would report as an error (it raises, or returns a dict with an "error" key) is a BFCLError
"bfcl_call_failed" here: the record is quarantined, never ingested with a failed call as the expert's.
"""

from __future__ import annotations

from pivot_assets.environments import CallFailed
from pivot_assets.environments.bfcl import BFCLMultiTurn, context, parse_call

from .bfcl import BFCLError


def backend():
    """bfcl-eval's executable-backend constants (class -> module, stateless classes, function doc files)."""
    from pivot_assets.environments.bfcl import backend as environment_backend

    try:
        return environment_backend()
    except CallFailed as exc:
        raise BFCLError(str(exc)) from None


class Session:
    """Fresh instances of a conversation's involved classes, ready to run its ground-truth calls in order."""

    def __init__(self, involved_classes: list[str], initial_config: dict, long_context: bool = False):
        self.environment = context(involved_classes, initial_config, long_context)  # what the trajectory keeps
        self._env = BFCLMultiTurn()
        try:
            self._world = self._env.fresh(self.environment)
        except CallFailed as exc:
            raise BFCLError(str(exc)) from None
        except ValueError as exc:
            raise BFCLError(f"bfcl_item: {str(exc).split(': ', 1)[-1]}") from None

    def call(self, text: str) -> tuple[str, dict, str]:
        """Run one call string: (function name, named arguments, result text)."""
        try:
            name, args, kwargs = parse_call(text)
        except CallFailed as exc:
            raise BFCLError(f"bfcl_call: {exc.detail}") from None
        try:
            arguments = self._env.bind(self._world, name, args, kwargs)
        except CallFailed as exc:
            if exc.category == "unknown_tool":
                raise BFCLError(f"bfcl_call: {exc.detail}") from None
            raise BFCLError(f"bfcl_call_failed: {text!r}: TypeError: {exc.detail.split(': ', 1)[-1]}") from None
        try:
            outcome = self._env.execute(self._world, name, arguments)
        except CallFailed as exc:
            raise BFCLError(f"bfcl_call_failed: {text!r}: {exc.detail.split(': ', 1)[-1]}") from None
        if outcome.error is not None:
            raise BFCLError(f"bfcl_call_failed: {text!r} returned an error: {outcome.error}")
        return name, arguments, outcome.text
