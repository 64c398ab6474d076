"""The released backbones (ModernBERT, NomicBERT, built from their public configs) in cde_st's own position-free
mode: the context is a set, padding does not leak, a zero gate gives the encoder exactly, and cached attention
equals the joint sequence with a 4-D mask."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cde_st import ContextualSentenceTransformer


@pytest.fixture(scope="module", params=["modernbert", "nomic_bert"])
def tiny_rotary_dir(request, fixture_dir, tmp_path_factory) -> str:
    """A tiny random ModernBERT / NomicBERT saved as a HF folder with the fixture tokenizer."""
    from transformers import AutoModel, AutoTokenizer

    from cde_st.released import backbone_config

    version = "v2" if request.param == "modernbert" else "v1"
    raw = json.loads((fixture_dir / version / "backbone_config.json").read_text(encoding="utf-8"))
    torch.manual_seed(0)
    model = AutoModel.from_config(backbone_config(raw))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(str(fixture_dir / version), trust_remote_code=False).save_pretrained(path)
    return str(path)


def test_rotary_backbone_own_mode(tiny_rotary_dir, inputs, tmp_path):
    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(
        tiny_rotary_dir,
        context_size=8,
        max_seq_length=64,
        output_head="mlp",
        first_stage_residual=False,
        context_attention="joint",
    )
    model.eval()
    docs = inputs["documents"]
    ctx = torch.randn(8, model.contextual_module.hidden_size, generator=torch.Generator().manual_seed(0))
    a = model.encode_document(docs, context_vectors=ctx)
    b = model.encode_document(docs, context_vectors=ctx[torch.randperm(8)])
    np.testing.assert_allclose(a, b, atol=1e-5)  # the context is a set: no positions for context rows
    assert np.abs(a - model.encode_document(docs, context_vectors=ctx[:3])).max() > 1e-4
    alone = np.stack([model.encode_document([d], context_vectors=ctx)[0] for d in docs])
    np.testing.assert_allclose(alone, a, atol=1e-5)  # padding and batch mates do not leak
    model.set_context(inputs["context_docs"])
    before = model.encode_query(inputs["queries"])
    model.save(str(tmp_path / "saved"))
    after = ContextualSentenceTransformer(str(tmp_path / "saved")).encode_query(inputs["queries"])
    assert np.abs(before - after).max() == 0


@pytest.mark.parametrize("attention", ["cached", "joint"])
def test_rotary_backbone_zero_gate_is_the_encoder(tiny_rotary_dir, inputs, attention):
    """With the context gate at zero a ModernBERT / NomicBERT contextual model is exactly its encoder (rotary text
    positions, ModernBERT's sliding window and final norm included), whatever the context."""
    from transformers import AutoModel

    model = ContextualSentenceTransformer.from_encoder(
        tiny_rotary_dir,
        context_size=8,
        max_seq_length=64,
        output_head="none",
        context_gate=True,
        context_attention=attention,
        prompts={},
    )
    model.eval()
    module = model.contextual_module
    encoder = AutoModel.from_pretrained(tiny_rotary_dir).eval()
    features = module.preprocess(inputs["documents"])
    with torch.no_grad():
        hidden = encoder(input_ids=features["input_ids"], attention_mask=features["attention_mask"]).last_hidden_state
        mask = features["attention_mask"].unsqueeze(-1).float()
        expected = (hidden * mask).sum(1) / mask.sum(1)
    ctx = torch.randn(8, module.hidden_size, generator=torch.Generator().manual_seed(0))
    for context in (ctx, ctx[:3], None):
        kwargs = {} if context is None else {"context_vectors": context}
        got = model.encode(inputs["documents"], convert_to_tensor=True, **kwargs)
        assert (got - expected).abs().max() <= 1e-5
    with torch.no_grad():
        module.gates.fill_(0.5)
    assert (
        model.encode(inputs["documents"], convert_to_tensor=True, context_vectors=ctx) - expected
    ).abs().max() > 1e-4


def test_rotary_backbone_cached_equals_uncached(tiny_rotary_dir, inputs):
    """Cached mode on rotary backbones equals the joint sequence run through the backbone with a 4-D mask in which
    context rows (unrotated) see only context rows."""
    model = ContextualSentenceTransformer.from_encoder(
        tiny_rotary_dir, context_size=8, max_seq_length=64, output_head="none", context_attention="cached", prompts={}
    )
    model.eval()
    module = model.contextual_module
    backbone, adapter = module.second_stage, module.second_adapter
    if backbone.config.model_type == "modernbert":  # the 4-D mask below has no sliding window: make all layers global
        backbone.config.layer_types = ["full_attention"] * backbone.config.num_hidden_layers
        for layer in backbone.layers:
            layer.attention_type = "full_attention"
            layer.attn.sliding_window = None
    ctx = torch.randn(8, module.hidden_size, generator=torch.Generator().manual_seed(0))
    model.set_context(ctx)
    got = model.encode(inputs["documents"], convert_to_tensor=True)
    features = module.preprocess(inputs["documents"])
    ids, mask = features["input_ids"], features["attention_mask"]
    with torch.no_grad():
        text = adapter.embed_tokens(backbone, ids, None)
        hidden = torch.cat([ctx.unsqueeze(0).expand(len(ids), -1, -1), text], dim=1)
        rows = torch.arange(8 + ids.shape[1])
        allowed = (rows[:, None] >= 8) | (rows[None, :] < 8)
        mask4d = torch.cat([mask.new_ones(len(ids), 8), mask], 1).bool()[:, None, None, :] & allowed[None, None]
        positions = torch.cat([torch.full((8,), -1), torch.arange(ids.shape[1])])
        out = adapter.encode(backbone, hidden, mask4d, positions, 8)[:, 8:]
        m = mask.unsqueeze(-1).float()
        expected = (out * m).sum(1) / m.sum(1)
    assert (got - expected).abs().max() <= 1e-5
