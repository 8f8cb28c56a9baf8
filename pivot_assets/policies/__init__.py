"""Dagster-free reference-policy layer.

models: the embedded SmolLM2 policy, the tool-capable chat template, prompt/action rendering, fingerprints.
base: SamplingConfig, GenerationRequest, Sample, the PolicyBackend protocol and build_backend.
Backends (imported lazily by build_backend): transformers_backend, openai_backend, vllm_backend.
Importing this package does not import torch.
"""

from .base import GenerationRequest, PolicyBackend, Sample, SamplingConfig, build_backend, sampling_from_section
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
    "GenerationRequest", "PolicyBackend", "Sample", "SamplingConfig", "build_backend", "sampling_from_section",
    "TOOL_CHAT_TEMPLATE", "embedded_gguf_path", "ensure_embedded_hf_dir", "load_model", "policy_fingerprint",
    "render_action", "render_prompt", "resolve_model_dir", "to_template_messages",
]
