"""GRPO's policy-gradient forward with the prompt computed once per group (Dagster-free).

TRL's GRPOTrainer scores a group's completions as `num_generations` full sequences: the prompt, the same for every
completion of the group, is run forward (and backward) once per completion. On pivots the prompt is most of the
sequence (a BFCL turn: ~300 prompt tokens, the tool schemas, against ~50 generated), so most of a GRPO step's
training compute recomputes one prompt G times. `SharedPromptScorer` computes the same per-token log-probabilities
(and entropies) with the prompt run once: the backbone over the prompt (one row, its key/value cache kept with its
gradients), the cache repeated G times, then the backbone over the G completions on top of it; the position that
predicts a completion's first token is the prompt's last. Autograd sums the G branches' gradients into the one
prompt pass, so the loss and its gradient are the unshared computation's up to floating-point order (checked
against TRL's own path by tests/training/test_shared_prompt.py).

It applies to a chunk whose rows share one prompt (ids and mask) and to a text-only causal LM whose head is a plain
projection (no logit soft-capping or scaling); otherwise, and with gradient checkpointing (which disables the
cache), TRL's own computation runs. `counts` says how many chunks took which path.
"""

from __future__ import annotations

import torch

_SCALED_HEAD_KEYS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                     "logits_scaling")
_IMAGE_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
               "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def plain_head(model) -> bool:
    """Whether the model's logits are its LM head's projection, unscaled (what this module recomputes)."""
    config = model.config.get_text_config()
    return config is model.config and all(getattr(config, k, None) in (None, 1.0) for k in _SCALED_HEAD_KEYS)


def shared_prompt_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> int | None:
    """The prompt's length when every row has the same prompt (ids and mask before the last logits_to_keep
    positions) and more than one row shares it; else None."""
    prompt = input_ids.size(1) - logits_to_keep
    if input_ids.size(0) < 2 or prompt < 1:
        return None
    ids, mask = input_ids[:, :prompt], attention_mask[:, :prompt]
    same = bool((ids == ids[:1]).all()) and bool((mask == mask[:1]).all())
    return prompt if same else None


def shared_prompt_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt: int,
                        temperature: float, compute_entropy: bool, autocast) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities (and entropies) of the completion positions, [rows, completion], as TRL returns
    them; the prompt (the first `prompt` positions, the same in every row) runs once."""
    from transformers import DynamicCache

    backbone = getattr(model, model.base_model_prefix)
    rows = input_ids.size(0)
    with autocast():
        cache = DynamicCache(config=model.config)
        head = backbone(input_ids=input_ids[:1, :prompt], attention_mask=attention_mask[:1, :prompt],
                        past_key_values=cache, use_cache=True).last_hidden_state
        cache.batch_repeat_interleave(rows)
        tail = backbone(input_ids=input_ids[:, prompt:], attention_mask=attention_mask, past_key_values=cache,
                        use_cache=True).last_hidden_state
        # position i predicts token i + 1: the prompt's last position predicts each completion's first token
        hidden = torch.cat([head[:, -1:].expand(rows, -1, -1), tail[:, :-1]], dim=1)
        logits = model.get_output_embeddings()(hidden).float() / temperature
    logps_all = torch.log_softmax(logits, dim=-1)
    labels = input_ids[:, prompt:]
    keep = attention_mask[:, prompt:].bool()
    logps = torch.gather(logps_all, -1, labels.unsqueeze(-1)).squeeze(-1).masked_fill(~keep, 0.0)
    entropy = None
    if compute_entropy:
        entropy = -(logps_all.exp() * logps_all).sum(-1).masked_fill(~keep, 0.0)
    return logps, entropy


def shared_prompt_trainer(base):
    """A subclass of the GRPOTrainer class `base` whose per-token log-probabilities run each group's prompt once
    (module docstring). Its `shared_prompt_counts` = {"shared": chunks, "unshared": chunks}."""

    class SharedPromptGRPOTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.shared_prompt_counts = {"shared": 0, "unshared": 0}

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False, **kw):
            prompt = self._shareable(model, input_ids, attention_mask, logits_to_keep, batch_size,
                                     compute_aux_loss, kw)
            if prompt is None:
                self.shared_prompt_counts["unshared"] += 1
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kw)
            self.shared_prompt_counts["shared"] += 1
            logps, entropy = shared_prompt_logps(self.accelerator.unwrap_model(model), input_ids, attention_mask,
                                                 prompt, self.temperature, compute_entropy, self.accelerator.autocast)
            return logps, entropy, None

        def _shareable(self, model, input_ids, attention_mask, logits_to_keep, batch_size, aux, kw) -> int | None:
            unwrapped = self.accelerator.unwrap_model(model)
            if aux or any(kw.get(k) is not None for k in _IMAGE_KEYS) or unwrapped.is_gradient_checkpointing:
                return None
            if (batch_size or input_ids.size(0)) < input_ids.size(0) or not plain_head(unwrapped):
                return None  # TRL chunks the rows to bound memory: keep its chunking
            return shared_prompt_length(input_ids, attention_mask, logits_to_keep)

    SharedPromptGRPOTrainer.__name__ = SharedPromptGRPOTrainer.__qualname__ = f"SharedPrompt{base.__name__}"
    return SharedPromptGRPOTrainer
