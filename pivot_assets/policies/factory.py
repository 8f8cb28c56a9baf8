"""Builds the backend a `policy:` section names (transformers | vllm | openai); backends are imported lazily,
so choosing one never imports another's heavy dependencies, and no backend imports this module back."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError

from pivot_assets.core.config import PolicySection
from pivot_assets.core.engines import BACKENDS, ENGINES, capabilities  # noqa: F401 (the engines' table, re-exported)
from pivot_assets.core.hardware import policy_precision, resolve_threads

from .base import PolicyBackend
from .models import PromptFormat


def policy_section(policy: PolicySection | Mapping) -> PolicySection:
    """A typed `policy:` section from the section itself or a plain mapping of its keys."""
    if isinstance(policy, PolicySection):
        return policy
    try:
        return PolicySection.model_validate(dict(policy))
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"policy.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


PROMPT_CACHE_GB = 2.0  # prompts kept across calls for a caller that samples turns again (keep_prompts)


def build_backend(policy: PolicySection | Mapping, *, model: str | None = None,
                  threads: int | str | None = "auto", keep_prompts: bool = False) -> PolicyBackend:
    """The backend named by `policy.backend`, configured from the section.

    `model` overrides `policy.model` (the resolved model dir of `policy.model: sft`). The dtype is
    resolved here from `policy.dtype` for the backend's device (auto: bf16 only where native). Sampling
    keys (k, temperature, ...) are not the backend's: pass SamplingConfig.from_policy(section) to `.generate`.
    `threads` (runtime.threads): the CPU threads of an engine that runs in its own process (vLLM's engine core).
    `keep_prompts`: the caller samples the same turns again (adaptive rounds): an engine without a prefix cache of
    its own keeps their prompts' KV across calls (the transformers backend, within PROMPT_CACHE_GB).
    """
    policy = policy_section(policy)
    model = model or policy.model
    fmt = PromptFormat.from_policy(policy)
    if policy.thinking_budget is not None and not capabilities(policy.backend).bounded_thinking:
        raise ValueError(f"policy.thinking_budget is implemented by the transformers backend, not {policy.backend}: "
                         "bound thoughts with max_new_tokens or thinking: off there")
    if policy.backend == "transformers":
        from .transformers_backend import TransformersBackend

        return TransformersBackend(model=model, dtype=policy_precision(policy).dtype,
                                   batch_size=policy.batch_size, device=policy.device, fmt=fmt,
                                   thinking_budget=policy.thinking_budget,
                                   prompt_cache_gb=PROMPT_CACHE_GB if keep_prompts else 0.0)
    if policy.backend == "openai":
        from .openai_backend import OpenAIBackend

        if not policy.base_url:
            raise ValueError("policy.backend openai needs policy.base_url (e.g. http://host:8000/v1)")
        return OpenAIBackend(base_url=policy.base_url, model=model,
                             api_key_env=policy.api_key_env or "OPENAI_API_KEY", concurrency=policy.concurrency,
                             thinking=policy.thinking)
    if policy.backend == "vllm":
        from .vllm_backend import VLLMBackend

        return VLLMBackend(model=model, dtype=policy_precision(policy).dtype, device=policy.device,
                           batch_size=policy.batch_size, threads=resolve_threads(threads), fmt=fmt,
                           engine_args=policy.engine_args)
    raise ValueError(f"policy.backend {policy.backend!r}: expected one of {', '.join(BACKENDS)}")


class EngineSlot:
    """One engine at a time for checkpoints scored in turn (evaluation): the next checkpoint's weights are loaded
    into the running engine where the engine can (capability `reloads_weights`) and the checkpoint has the same
    architecture and tokenizer; otherwise the engine is closed and a new one built. On vLLM's CPU build a start
    took 90 s and a reload under a second (bench/RESULTS_engine_reload.md). `starts` and `reloads` count them."""

    def __init__(self, policy: PolicySection | Mapping, *, threads: int | str | None = "auto"):
        self.policy = policy_section(policy)
        self.threads = threads
        self.engine: PolicyBackend | None = None
        self.model: str | None = None
        self.starts = self.reloads = 0

    def engine_for(self, model: str) -> PolicyBackend:
        """The engine sampling `model`: the current one, the current one with `model`'s weights, or a new one."""
        if self.engine is not None and self.model == model:
            return self.engine
        if self.engine is not None and capabilities(self.policy.backend).reloads_weights \
                and self.engine.load_model(model):
            self.reloads += 1
        else:
            self.close()
            self.engine = build_backend(self.policy, model=model, threads=self.threads)
            self.starts += 1
        self.model = model
        return self.engine

    def close(self) -> None:
        """Stop the engine now: one in its own processes would hold its core until collected."""
        if self.engine is not None and hasattr(self.engine, "close"):
            self.engine.close()
        self.engine = self.model = None

    def __enter__(self) -> "EngineSlot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
