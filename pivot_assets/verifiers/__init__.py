"""Versioned local verifiers (Dagster-free): the functional reward of PivotRL.

    from pivot_assets.verifiers import Score, Reason, parse_candidate, build_verifier, DomainVerifiers, verify_jsonl

Verifiers: tool_call (functional, default), exact (ablation baseline), string_similarity, tool_name, llm_judge,
stack. Each has .name, .version, .config and .fingerprint (the scoring stage's code version).
"""

from .base import Param, Reason, Score, Verifier
from .llm_judge import judge_stats
from .parsing import parse_candidate
from .registry import DomainVerifiers, build_verifier, verifier_names
from .verify_cli import verify_jsonl

__all__ = ["Score", "Reason", "Verifier", "Param", "parse_candidate", "build_verifier", "DomainVerifiers",
           "verify_jsonl", "verifier_names", "judge_stats"]
