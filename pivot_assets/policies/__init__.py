"""Dagster-free reference-policy layer.

models: the embedded SmolLM2 policy, chat template resolution (policy.chat_template), the one rendering call and
  the one decoding rule, fingerprints.
thinking: `<think>` handling (policy.thinking strip, the thinking budget).
base: SamplingConfig, GenerationRequest, Sample and the PolicyBackend protocol (the interface only).
factory: build_backend, which imports the chosen backend lazily: transformers_backend, openai_backend, vllm_backend.
Importing this package does not import torch.
"""

from .base import GenerationRequest, PolicyBackend, Sample, SamplingConfig
from .factory import build_backend
from .models import (
    TOOL_CHAT_TEMPLATE,
    PromptFormat,
    decode_completion,
    embedded_gguf_path,
    ensure_embedded_hf_dir,
    load_model,
    policy_fingerprint,
    render_action,
    render_chat,
    render_prompt,
    resolve_chat_template,
    resolve_model_dir,
    to_template_messages,
)

__all__ = [
    "GenerationRequest", "PolicyBackend", "Sample", "SamplingConfig", "build_backend",
    "TOOL_CHAT_TEMPLATE", "embedded_gguf_path", "ensure_embedded_hf_dir", "load_model", "policy_fingerprint",
    "render_action", "render_prompt", "resolve_model_dir", "to_template_messages",
    "PromptFormat", "decode_completion", "render_chat", "resolve_chat_template",
]
