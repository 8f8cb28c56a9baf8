"""Packed single-token GQA attention (policies/attention.py) gives repeat_kv's numbers without its copy."""

from __future__ import annotations

import types

import pytest
import torch

from pivot_assets.policies.attention import _packed


def _reference(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    g = module.num_key_value_groups
    k, v = key.repeat_interleave(g, dim=1), value.repeat_interleave(g, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=attention_mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_packed_decode_equals_repeated_kv(mask):
    torch.manual_seed(0)
    batch, kv_heads, groups, length, dim = 5, 3, 3, 37, 64
    module = types.SimpleNamespace(num_key_value_groups=groups)
    query = torch.randn(batch, kv_heads * groups, 1, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    attention_mask = None
    if mask is not None:
        keep = torch.rand(batch, 1, 1, length) > 0.3
        keep[..., -1] = True
        attention_mask = keep if mask == "bool" else torch.where(keep, 0.0, float("-inf"))
    expected, _ = _reference(module, query, key, value, attention_mask, scaling=dim ** -0.5)
    got, _ = _packed(_reference)(module, query, key, value, attention_mask, scaling=dim ** -0.5)
    assert got.shape == expected.shape == (batch, 1, kv_heads * groups, dim)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_prefill_and_per_head_masks_go_to_the_original():
    module = types.SimpleNamespace(num_key_value_groups=3)
    calls = []

    def original(*args, **kw):
        calls.append(args[1].shape)
        return None, None

    packed = _packed(original)
    packed(module, torch.randn(1, 9, 4, 8), torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8), None)
    packed(module, torch.randn(1, 9, 1, 8), torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8), torch.ones(1, 9, 1, 4))
    assert calls == [(1, 9, 4, 8), (1, 9, 1, 8)]
