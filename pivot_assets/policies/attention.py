"""Decode-step attention without copying the KV cache, on every transformers the project admits.

With grouped-query attention (SmolLM2: 9 query heads over 3 KV heads) transformers before 5.20 runs each
single-token decode step through `repeat_kv`, which copies the whole KV cache of every layer at every step:
our backend's decode then took 2.7x longer than on 5.24, which packs the query heads onto the KV heads
instead (`pack_gqa`). `install_packed_decode()` gives the older releases that packing, by wrapping the
registered `sdpa` function; where transformers packs by itself it does nothing.
"""

from __future__ import annotations

_INSTALLED = False


def _packed(original):
    def sdpa_with_packed_decode(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                                is_causal=None, **kwargs):
        groups = getattr(module, "num_key_value_groups", 1)
        if groups <= 1 or query.shape[2] != 1 or kwargs.get("position_bias") is not None \
                or (attention_mask is not None and attention_mask.shape[1] != 1):
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
        import torch

        batch, heads, _, dim = query.shape
        # one query token: its `heads` rows attend as `groups` queries of each KV head (a mask shared by the
        # heads broadcasts over them), the same sums as after repeat_kv, with no copy of the keys and values
        packed = query.reshape(batch, heads // groups, groups, dim)
        out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask,
                                                               dropout_p=dropout, scale=scaling, is_causal=False)
        return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None

    return sdpa_with_packed_decode


def install_packed_decode() -> bool:
    """Wrap transformers' `sdpa` attention with packed single-token GQA where the release lacks it; True when
    installed (now or before)."""
    global _INSTALLED
    if _INSTALLED:
        return True
    from transformers.integrations import sdpa_attention
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if hasattr(sdpa_attention, "pack_gqa"):  # transformers >= 5.2x packs by itself
        return False
    ALL_ATTENTION_FUNCTIONS["sdpa"] = _packed(ALL_ATTENTION_FUNCTIONS["sdpa"])
    _INSTALLED = True
    return True
