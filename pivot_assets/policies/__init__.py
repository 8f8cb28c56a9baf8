"""Dagster-free reference-policy layer.

models: the embedded SmolLM2 policy, the tool-capable chat template, prompt/action rendering, fingerprints.
base: SamplingConfig, GenerationRequest, Sample and the PolicyBackend protocol (the interface only).
factory: build_backend, which imports the chosen backend lazily: transformers_backend, openai_backend, vllm_backend.
Importing this package does not import torch.
"""

from .base import GenerationRequest, PolicyBackend, Sample, SamplingConfig
from .factory import build_backend
from .models import (
    TOOL_CHAT_TEMPLATE,
    embedded_gguf_path,
    ensure_embedded_hf_dir,
    load_model,
    policy_fingerprint,
    render_action,
    render_prompt,
    resolve_model_dir,
    to_template_messages,
)

__all__ = [
    "GenerationRequest", "PolicyBackend", "Sample", "SamplingConfig", "build_backend",
    "TOOL_CHAT_TEMPLATE", "embedded_gguf_path", "ensure_embedded_hf_dir", "load_model", "policy_fingerprint",
    "render_action", "render_prompt", "resolve_model_dir", "to_template_messages",
]
