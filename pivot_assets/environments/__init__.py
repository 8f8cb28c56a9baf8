"""Executable environments: rebuild a trajectory's world at a step, execute calls on it, compare worlds.

    from pivot_assets.environments import environment_for, TurnState, CallFailed

A trajectory from an executable source carries an `environment` (trajectories.environment: canonical JSON
{"kind": ..., ...the kind's context}); `environment_for(kind)` is the implementation (base.Environment). Ingest
executes the expert's calls with it (ingest/bfcl_exec.py) and the `executed_state` verifier replays sampled calls
on it (verifiers/executed_state.py). Kinds: bfcl_multi_turn (bfcl.py), tau2
(tau2.py: tau2-bench's airline and retail domains).
"""

from .base import CallFailed, Environment, TurnState, environment_for, environment_kinds, parse_environment
from .bfcl import BFCLMultiTurn  # noqa: F401  (registers the kind)
from .tau2 import Tau2  # noqa: F401  (registers the kind)

__all__ = ["CallFailed", "Environment", "TurnState", "environment_for", "environment_kinds", "parse_environment"]
