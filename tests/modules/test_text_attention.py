"""cde_st.modules.text_attention: how text rows read the prefix, checked against plain attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cde_st.modules.text_attention import text_attention, with_sink

BATCH, HEADS, LENGTH, PREFIX, DIM = 2, 3, 4, 5, 8


def _tensors(seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(BATCH, HEADS, LENGTH, DIM, generator=generator) for _ in range(3))
    k_pre, v_pre = (torch.randn(BATCH, HEADS, PREFIX, DIM, generator=generator) for _ in range(2))
    text_keys = torch.ones(BATCH, 1, 1, LENGTH, dtype=torch.bool)
    return q, k, v, k_pre, v_pre, text_keys


def test_without_a_gate_text_reads_prefix_and_text_in_one_softmax():
    q, k, v, k_pre, v_pre, text_keys = _tensors()
    out = text_attention(q, k, v, k_pre, v_pre, text_keys, None, 0.0)
    expected = F.scaled_dot_product_attention(q, torch.cat([k_pre, k], 2), torch.cat([v_pre, v], 2))
    assert torch.allclose(out, expected, atol=1e-6)


def test_a_gate_adds_a_separate_read_of_the_prefix_scaled_by_tanh():
    q, k, v, k_pre, v_pre, text_keys = _tensors()
    text_only = F.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(text_attention(q, k, v, k_pre, v_pre, text_keys, torch.zeros(HEADS), 0.0), text_only)
    gate = torch.tensor([0.5, -1.0, 2.0])
    out = text_attention(q, k, v, k_pre, v_pre, text_keys, gate, 0.0)
    read = F.scaled_dot_product_attention(q, k_pre, v_pre)
    assert torch.allclose(out, text_only + torch.tanh(gate).view(1, -1, 1, 1) * read, atol=1e-6)
    # one context for the whole batch (cached keys/values) reads as the same context repeated per row
    shared = text_attention(q, k, v, k_pre[:1], v_pre[:1], text_keys, gate, 0.0)
    repeated = text_attention(q, k, v, k_pre[:1].expand_as(k_pre), v_pre[:1].expand_as(v_pre), text_keys, gate, 0.0)
    assert torch.allclose(shared, repeated, atol=1e-6)


def test_a_row_that_may_read_no_prefix_key_reads_nothing_of_it():
    q, k, v, k_pre, v_pre, text_keys = _tensors()
    prefix_keys = torch.ones(BATCH, 1, 1, PREFIX, dtype=torch.bool)
    prefix_keys[1] = False
    out = text_attention(q, k, v, k_pre, v_pre, text_keys, torch.ones(HEADS), 0.0, prefix_keys)
    assert torch.allclose(out[1], F.scaled_dot_product_attention(q, k, v)[1])
    assert not torch.isnan(out).any()


def test_the_sink_is_a_zero_key_and_value_every_row_sees():
    _, _, _, k_pre, v_pre, _ = _tensors()
    prefix_keys = torch.zeros(BATCH, 1, 1, PREFIX, dtype=torch.bool)
    k_sink, v_sink, keys = with_sink(k_pre, v_pre, prefix_keys)
    assert k_sink.shape == (BATCH, HEADS, PREFIX + 1, DIM) and torch.equal(k_sink[:, :, :PREFIX], k_pre)
    assert not k_sink[:, :, PREFIX].any() and not v_sink[:, :, PREFIX].any()
    assert keys[..., PREFIX].all() and not keys[..., :PREFIX].any()
