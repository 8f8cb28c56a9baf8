"""A tiny Llama policy for the tests that check the pipeline's plumbing, not the model.

Two layers of width 32 with random weights, the embedded model's tokenizer and chat template: it loads in
milliseconds, samples and trains like any Hugging Face causal LM (transformers, TRL, DDP ranks), and its random
completions are scored like any other (a graded verifier still gives mixed turns). Built once per test run from
a fixed seed: its weights are the same in every run on one kind of CPU (torch's random init differs between its
AVX2/AVX-512 and its plain kernels), so tests compare identities within a run, never against pinned values. This is what
TRL's and transformers' own suites do with their tiny models; the embedded 135M model stays where a test is about
the model (its conversion, a real generation, vLLM, the demo).
"""

from __future__ import annotations

import json
from pathlib import Path

TINY_SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2}
# what the tiny model takes from the embedded one: the vocabulary and its special tokens, and the context length
_KEPT_KEYS = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings",
              "rope_theta", "rms_norm_eps")


def build_tiny_model(embedded_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny model (config, safetensors, tokenizer with the embedded chat template) into out_dir."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    source = json.loads((embedded_dir / "config.json").read_text(encoding="utf-8"))
    config = LlamaConfig(**{k: source[k] for k in _KEPT_KEYS if k in source}, **TINY_SHAPE, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(embedded_dir).save_pretrained(out_dir)
    return out_dir
