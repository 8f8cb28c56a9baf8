"""The backend interface of reference-policy profiling: requests in, K samples per turn out.

A backend yields the samples of a group of turns at a time (all K of each turn), so the caller can
write one Parquet part per yield: a crash loses at most the group in flight.

The expert action's likelihood: a request may carry its turn's expert message (`expert`). A backend that can
teacher-force it (capability `scores_continuation`, core/engines.EngineCapabilities) runs prompt + expert message through the model once, on the
prefill it does anyway, and yields the log-likelihood of the action's tokens beside the samples
(`SampleBatch.likelihoods`); the others ignore `expert` and yield plain lists. The transformers backend
implements it; vLLM can (prompt_logprobs on prompt + action); an OpenAI-compatible server does not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterator, Protocol, runtime_checkable

from pivot_assets.core.config import PolicySection
from pivot_assets.core.engines import EngineCapabilities  # noqa: F401 (re-exported: the protocol's other half)
from pivot_assets.core.identity import SAMPLING, fingerprint, values

FINISH_REASONS = ("stop", "length")
_POLICY_DEFAULTS = PolicySection()  # the one place sampling defaults live: the `policy:` config section


@dataclass(frozen=True)
class SamplingConfig:
    """How each turn is sampled. temperature 0 means greedy (then all K samples are identical)."""

    k: int = _POLICY_DEFAULTS.k
    temperature: float = _POLICY_DEFAULTS.temperature
    top_p: float = _POLICY_DEFAULTS.top_p
    max_new_tokens: int = _POLICY_DEFAULTS.max_new_tokens
    seed: int = _POLICY_DEFAULTS.seed

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"sampling k={self.k}: must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"sampling temperature={self.temperature}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling top_p={self.top_p}: must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling max_new_tokens={self.max_new_tokens}: must be >= 1")

    @classmethod
    def from_policy(cls, policy: PolicySection) -> "SamplingConfig":
        """The sampling part of the `policy:` section."""
        return cls(**values(policy, SAMPLING))

    @property
    def fingerprint(self) -> str:
        """Short hash of every field: rows sampled under another config never share a key."""
        return fingerprint(asdict(self))


@dataclass
class GenerationRequest:
    """One turn to profile: its canonical state (messages before the assistant message) and tools."""

    turn_id: str
    trajectory_id: str
    message_index: int
    messages: list[dict]
    tools: list = field(default_factory=list)
    expert: dict | None = None  # the turn's expert assistant message: teacher-force it (ActionLikelihood)


@dataclass
class Sample:
    """One sampled completion of a turn (the text the verifier parses: Hermes <tool_call> or plain text)."""

    turn_id: str
    sample_index: int
    completion: str
    n_prompt_tokens: int
    n_completion_tokens: int  # tokens generated, the stop token included (it is not in `completion`)
    finish_reason: str  # "stop" (EOS / <|im_end|>) | "length" (max_new_tokens reached)


@dataclass(frozen=True)
class ActionLikelihood:
    """log p(expert action | prompt) under the reference policy: the sum over the tokens of the expert's assistant
    message as the template renders it after the prompt, its end-of-turn token included, of log-softmax(logits / T)
    at the sampling temperature T (1 when greedy), without top-p. At T = 1 and top_p = 1, exp(logprob) is the
    probability that a sample is exactly the expert action: a lower bound on a verifier's pass rate that accepts it."""

    turn_id: str
    logprob: float
    n_tokens: int


class SampleBatch(list):
    """One yield of `generate`: the samples (a list), and the likelihoods of the expert actions of the requests
    that carried one (empty when the backend does not teacher-force)."""

    def __init__(self, samples=(), likelihoods: list[ActionLikelihood] | None = None):
        super().__init__(samples)
        self.likelihoods = list(likelihoods or [])


def likelihoods_of(batch: list) -> list[ActionLikelihood]:
    """The likelihoods a yield carries (a plain list from a backend that does not compute them: none)."""
    return getattr(batch, "likelihoods", [])


def new_stats() -> dict:
    """Counters every backend keeps in `.stats` (cumulative over its lifetime)."""
    return {
        "turns": 0,
        "samples": 0,
        "prompt_tokens_total": 0,  # sum over turns of the turn's prompt length (once per turn, not per sample)
        "prefill_tokens_computed": 0,  # tokens actually run through prefill (0 where a server does it)
        "generated_tokens": 0,
        "cache_hits": 0,  # turns whose prefill reused a cached prefix
        "wall_s": 0.0,
    }


@runtime_checkable
class PolicyBackend(Protocol):
    fingerprint: str
    stats: dict

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> Iterator[list[Sample]]:
        """Yield lists of samples; each list holds all K samples of each of a group of turns. A backend whose
        capabilities say `scores_continuation` yields SampleBatch with the likelihoods of the requests' `expert` actions."""
        ...


def order_by_trajectory(requests: list[GenerationRequest]) -> list[GenerationRequest]:
    """Turns of one trajectory together, in message order (trajectories keep first-seen order).

    Consecutive turns of a trajectory share their prompt prefix: this is the order that lets a
    prefix cache (ours or a server's) reuse it.
    """
    first_seen: dict[str, int] = {}
    for i, r in enumerate(requests):
        first_seen.setdefault(r.trajectory_id, i)
    return sorted(requests, key=lambda r: (first_seen[r.trajectory_id], r.message_index))
