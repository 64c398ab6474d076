"""How a text row reads the prefix in cde_st's own attention variants (:meth:`BackboneAdapter.encode_split
<cde_st.modules.backbone.BackboneAdapter.encode_split>`): one softmax over [prefix ; text] keys, or a text-only
softmax plus a gated read of the prefix (zero-init attention adapters), optionally with a sink key. Plain tensor
operations on queries, keys and values, the same for every backbone family.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["text_attention", "with_sink"]


def with_sink(k_pre, v_pre, prefix_keys):
    """Prefix keys/values (B or 1, H, P, hd) with one more row of zeros: its score q.0 is 0 whatever the query and
    its value adds nothing, so the read's weights on the real rows sum to less than one when few of them match.
    ``prefix_keys`` (B, 1, 1, P) or None gets the sink as always visible."""
    zeros = k_pre.new_zeros(*k_pre.shape[:2], 1, k_pre.shape[3])
    k_sink, v_sink = torch.cat([k_pre, zeros], dim=2), torch.cat([v_pre, zeros.to(v_pre.dtype)], dim=2)
    if prefix_keys is not None:
        prefix_keys = torch.cat([prefix_keys, prefix_keys.new_ones(*prefix_keys.shape[:3], 1)], dim=-1)
    return k_sink, v_sink, prefix_keys


def text_attention(q, k, v, k_pre, v_pre, text_keys, gate, dropout_p, prefix_keys=None, sink=False):
    """Attention of text queries over [prefix ; text] keys. (B, H, L, hd) each; prefix (B, H, P, hd); ``text_keys``
    (B, 1, 1 or L, L) says which text keys each query may see (padding, sliding window); ``prefix_keys``
    (B, 1, 1, P) or None (all) which prefix keys.

    Without a gate: one softmax over prefix and text keys. With a gate (H,): a text-only softmax plus tanh(gate)
    times a prefix-only softmax (zero-init attention adapters); a row that may read no prefix key reads nothing.
    ``sink``: that prefix softmax gets one more key of score 0 and value 0 (:func:`with_sink`)."""
    if gate is None:
        if k_pre.shape[0] != q.shape[0]:
            k_pre, v_pre = (t.expand(q.shape[0], -1, -1, -1) for t in (k_pre, v_pre))
        keys, values = torch.cat([k_pre, k], dim=2), torch.cat([v_pre, v], dim=2)
        if prefix_keys is None:
            prefix_keys = text_keys.new_ones(*text_keys.shape[:3], k_pre.shape[2])
        mask = torch.cat([prefix_keys.expand(-1, -1, text_keys.shape[2], -1), text_keys], dim=-1)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout_p)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=text_keys, dropout_p=dropout_p)
    if k_pre.shape[2] == 0:
        return out
    if sink:
        k_pre, v_pre, prefix_keys = with_sink(k_pre, v_pre, prefix_keys)
    if prefix_keys is not None:
        # Per-row visibility: a row with no visible key gets an all-visible mask (no NaN, in either pass) and a
        # zero read.
        reads_any = prefix_keys.any(dim=-1, keepdim=True)  # (B, 1, 1, 1)
        if k_pre.shape[0] != q.shape[0]:
            k_pre, v_pre = (t.expand(q.shape[0], -1, -1, -1) for t in (k_pre, v_pre))
        read = F.scaled_dot_product_attention(q, k_pre, v_pre, attn_mask=prefix_keys | ~reads_any, dropout_p=dropout_p)
        read = torch.where(reads_any, read, torch.zeros_like(read))
    elif k_pre.shape[0] == 1 and q.shape[0] > 1:
        # One context for the whole batch (cached): fold the batch into the query axis instead of copying the
        # context's keys/values B times.
        batch, heads, length, head_dim = q.shape
        folded = q.transpose(0, 1).reshape(1, heads, batch * length, head_dim)
        read = F.scaled_dot_product_attention(folded, k_pre, v_pre, dropout_p=dropout_p)
        read = read.view(heads, batch, length, head_dim).transpose(0, 1)
    else:
        read = F.scaled_dot_product_attention(q, k_pre, v_pre, dropout_p=dropout_p)
    return out + torch.tanh(gate).view(1, -1, 1, 1).to(out.dtype) * read
