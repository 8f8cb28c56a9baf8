"""Versioned local verifiers (Dagster-free): the functional reward of PivotRL.

    from pivot_assets.verifiers import Score, Reason, parse_candidate, build_verifier, DomainVerifiers, verify_jsonl

Verifiers: tool_call (functional, default), executed_state (replays the sample in the trajectory's environment:
BFCL multi-turn), exact (ablation baseline), string_similarity, tool_name, llm_judge, stack. Each has .name, .version, .config and .fingerprint (the scoring stage's code version: name, version,
verdict-relevant config and a hash of the verifier's code, see code_version.py). A verifier of the user's own
is named `module:Class` or by an entry point of the group `pivot_curation.verifiers` (user_verifiers.py).

Facts must match. Replies and free-text arguments are compared fact-first (facts.py): ids and codes, amounts,
numbers with units, dates, times, emails, URLs and quoted strings are extracted, normalized ($1,200.00 = 1200,
"May 17, 2024" = 2024-05-17) and must equal the expert's as a multiset (`facts: exact`, the default of
tool_call and string_similarity; `subset` lets the candidate leave facts out; `ignore` is the old
similarity-only comparison). A difference is reward 0, FACT_MISMATCH, "expected 3FRNFB, got 3FRNFD". Only
then is the rest compared by similarity, after markdown, punctuation, spacing and case are removed.
Arithmetic arguments ("175 + 200") are compared as parsed expressions (arithmetic.py, never eval).

Replies that cannot be judged locally (same facts, different wording that may or may not mean the same):
keep the local fact check as a gate and let an OpenAI-compatible judge decide the meaning. In pivot.yaml:

    verifier:
      default:
        name: tool_call                       # calls: functional comparison, as before
        text_verifier:                        # replies: facts locally, then the judge
          name: stack
          mode: all                           # every step must pass; later steps only see what passed
          steps:
            - {name: string_similarity, threshold: 0.0}   # facts only: a wrong id/amount/date never reaches the judge
            - name: llm_judge
              base_url: http://127.0.0.1:8000/v1
              model: judge-model
              api_key_env: JUDGE_API_KEY      # read at request time; never logged, cached or fingerprinted

The judge is asked only about replies whose facts already match (identical replies are short-circuited, and
verdicts are cached on disk). Nested inside tool_call the judge is asked one reply at a time; to batch the
requests (`concurrency`), put the stack at the top level of a domain instead.
"""

from . import exact, executed_state, llm_judge, stack, string_similarity, tool_call, tool_name  # noqa: F401  (register)
from .base import Param, Reason, Score, Verifier
from .domains import DomainVerifiers
from .llm_judge import judge_stats
from .parsing import parse_candidate
from .registry import build_verifier, verifier_names
from .sets import VerifierSets
from .user_verifiers import look_up_user_verifiers
from .verify_cli import verify_jsonl

__all__ = ["Score", "Reason", "Verifier", "Param", "parse_candidate", "build_verifier", "DomainVerifiers", "VerifierSets",
           "verify_jsonl", "verifier_names", "judge_stats"]

look_up_user_verifiers()  # before anything is built: `module:Class` and entry-point names resolve too
