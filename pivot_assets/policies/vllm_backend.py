"""vLLM offline backend (optional `[gpu]` extra): `vllm.LLM` with automatic prefix caching, n=K per prompt.

Prompts are rendered here by models.render_prompt with the template the transformers backend resolves for the
same model and `policy.chat_template`, and completions are decoded by the same rule (special tokens kept:
SamplingParams(skip_special_tokens=False); vLLM leaves the stop token out of the text). A group's turns are submitted in one
`generate` call in trajectory order: consecutive turns of a trajectory share their prefix, which the
engine's prefix cache prefills once. vllm is imported lazily: this module imports without it.
"""

from __future__ import annotations

import time
from typing import Iterator

from .base import GenerationRequest, Sample, SamplingConfig, new_stats, order_by_trajectory
from .models import PromptFormat, configure_tokenizer, policy_fingerprint, render_prompt, resolve_model_dir
from .thinking import apply_thinking
from .openai_backend import request_seed


def vllm_available() -> bool:
    """True when vllm imports and a CUDA device is visible."""
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


class VLLMBackend:
    """K samples per turn from a local model through vLLM's offline engine.

    group_size: turns per `generate` call (and per yield); the engine schedules them together.
    """

    def __init__(self, model: str = "embedded", dtype: str = "bfloat16", group_size: int = 512,
                 gpu_memory_utilization: float = 0.85, max_model_len: int | None = None,
                 fmt: PromptFormat = PromptFormat()):
        try:
            from vllm import LLM
        except ImportError:
            raise RuntimeError("policy.backend vllm needs vllm: pip install 'pivot-curation[gpu]'") from None
        path = resolve_model_dir(model)
        self.llm = LLM(model=str(path), dtype=dtype, enable_prefix_caching=True,
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len)
        self.tokenizer = self.llm.get_tokenizer()
        configure_tokenizer(self.tokenizer, model, fmt)
        self.fmt = fmt
        self.group_size = group_size
        self.fingerprint = policy_fingerprint(model, fmt)
        self.stats = new_stats()

    def _params(self, sampling: SamplingConfig, turn_id: str):
        from vllm import SamplingParams

        return SamplingParams(n=sampling.k, temperature=sampling.temperature, top_p=sampling.top_p,
                              max_tokens=sampling.max_new_tokens, seed=request_seed(sampling.seed, turn_id),
                              skip_special_tokens=False)

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> Iterator[list[Sample]]:
        """Yield the K samples of each group of turns (one engine call per group)."""
        ordered = order_by_trajectory(requests)
        for start in range(0, len(ordered), self.group_size):
            t0 = time.perf_counter()
            group = ordered[start : start + self.group_size]
            # token ids, not text: vLLM would tokenize text with add_special_tokens=True and give a template that
            # writes its own BOS (Llama 3) a second one; the transformers backend tokenizes without special tokens
            prompts = [{"prompt_token_ids": self.tokenizer(render_prompt(self.tokenizer, r.messages, r.tools),
                                                           add_special_tokens=False)["input_ids"]} for r in group]
            params = [self._params(sampling, r.turn_id) for r in group]
            outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
            samples = [s for req, out in zip(group, outputs) for s in self._samples(req, out)]
            self.stats["wall_s"] += time.perf_counter() - t0
            yield samples

    def _samples(self, req: GenerationRequest, out) -> list[Sample]:
        n_prompt = len(out.prompt_token_ids)
        cached = getattr(out, "num_cached_tokens", None) or 0
        self.stats["turns"] += 1
        self.stats["prompt_tokens_total"] += n_prompt
        self.stats["prefill_tokens_computed"] += n_prompt - cached
        self.stats["cache_hits"] += int(cached > 0)
        samples = []
        for i, comp in enumerate(sorted(out.outputs, key=lambda c: c.index)):
            self.stats["generated_tokens"] += len(comp.token_ids)
            samples.append(Sample(turn_id=req.turn_id, sample_index=i, completion=apply_thinking(comp.text, self.fmt.thinking),
                                  n_prompt_tokens=n_prompt, n_completion_tokens=len(comp.token_ids),
                                  finish_reason="length" if comp.finish_reason == "length" else "stop"))
        self.stats["samples"] += len(samples)
        return samples
