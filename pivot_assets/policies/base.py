"""The backend interface of reference-policy profiling: requests in, K samples per turn out.

A backend yields the samples of a group of turns at a time (all K of each turn), so the caller can
write one Parquet part per yield: a crash loses at most the group in flight.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Iterator, Protocol, runtime_checkable

BACKENDS = ("transformers", "vllm", "openai")
FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class SamplingConfig:
    """How each turn is sampled. temperature 0 means greedy (then all K samples are identical)."""

    k: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"sampling k={self.k}: must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"sampling temperature={self.temperature}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling top_p={self.top_p}: must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling max_new_tokens={self.max_new_tokens}: must be >= 1")

    @property
    def fingerprint(self) -> str:
        """Short hash of every field: rows sampled under another config never share a key."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class GenerationRequest:
    """One turn to profile: its canonical state (messages before the assistant message) and tools."""

    turn_id: str
    trajectory_id: str
    message_index: int
    messages: list[dict]
    tools: list = field(default_factory=list)


@dataclass
class Sample:
    """One sampled completion of a turn (the text the verifier parses: Hermes <tool_call> or plain text)."""

    turn_id: str
    sample_index: int
    completion: str
    n_prompt_tokens: int
    n_completion_tokens: int  # tokens generated, the stop token included (it is not in `completion`)
    finish_reason: str  # "stop" (EOS / <|im_end|>) | "length" (max_new_tokens reached)


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
        """Yield lists of samples; each list holds all K samples of each of a group of turns."""
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


def sampling_from_section(policy: dict) -> SamplingConfig:
    """SamplingConfig from the `policy:` section of pivot.yaml (missing keys take the defaults)."""
    defaults = SamplingConfig()
    return SamplingConfig(
        k=int(policy.get("k", defaults.k)),
        temperature=float(policy.get("temperature", defaults.temperature)),
        top_p=float(policy.get("top_p", defaults.top_p)),
        max_new_tokens=int(policy.get("max_new_tokens", defaults.max_new_tokens)),
        seed=int(policy.get("seed", defaults.seed)),
    )


def build_backend(policy: dict) -> PolicyBackend:
    """The backend named by `policy.backend` (transformers | vllm | openai), configured from the section.

    Keys read: backend, model, base_url (openai), dtype, batch_size, device, threads, api_key_env,
    concurrency.
    Sampling keys (k, temperature, ...) are not the backend's: pass sampling_from_section(policy)
    to `.generate`.
    """
    backend = policy.get("backend", "transformers")
    model = policy.get("model") or "embedded"
    if backend == "transformers":
        from .transformers_backend import TransformersBackend

        return TransformersBackend(
            model=model,
            dtype=policy.get("dtype") or "float32",
            batch_size=int(policy.get("batch_size") or 32),
            device=policy.get("device") or "cpu",
            threads=policy.get("threads"),
        )
    if backend == "openai":
        from .openai_backend import OpenAIBackend

        if not policy.get("base_url"):
            raise ValueError("policy.backend openai needs policy.base_url (e.g. http://host:8000/v1)")
        return OpenAIBackend(
            base_url=policy["base_url"],
            model=model,
            api_key_env=policy.get("api_key_env") or "OPENAI_API_KEY",
            concurrency=int(policy.get("concurrency") or 8),
        )
    if backend == "vllm":
        from .vllm_backend import VLLMBackend

        return VLLMBackend(model=model, dtype=policy.get("dtype") or "bfloat16")
    raise ValueError(f"policy.backend {backend!r}: expected one of {', '.join(BACKENDS)}")
