"""The released weights' names mapped onto ContextualTransformer's (cde_st.released.weights): the heads, both
backbones' prefixes, NomicBERT's contrastors names and its packed query/key/value matrix, and an unknown name
refused."""

from __future__ import annotations

import pytest
import torch

from cde_st.released.hub import ReleasedCheckpointError
from cde_st.released.weights import convert_state_dict


def test_heads_and_a_bert_family_backbone_keep_their_tensors_under_the_modules_names():
    tensors = {
        "first_stage_model.embedder.embeddings.word_embeddings.weight": torch.ones(5, 2),
        "second_stage_model.backbone.encoder.layer.0.attention.self.query.weight": torch.full((2, 2), 2.0),
        "first_stage_model.mlp.0.weight": torch.full((2, 2), 3.0),
        "first_stage_model.mlp.2.bias": torch.full((2,), 4.0),
        "second_stage_model.output_projection.0.weight": torch.full((2, 2), 5.0),
        "second_stage_model.output_projection.2.bias": torch.full((2,), 6.0),
        "second_stage_model.prompt_projection.weight": torch.full((2, 2), 7.0),
    }
    converted = convert_state_dict(tensors, "modernbert")
    assert sorted(converted) == [
        "context_head.fc1.weight",
        "context_head.fc2.bias",
        "first_stage.embeddings.word_embeddings.weight",
        "head.fc1.weight",
        "head.fc2.bias",
        "second_stage.encoder.layer.0.attention.self.query.weight",
        "soft_prompt.projection.weight",
    ]
    assert converted["head.fc2.bias"] is tensors["second_stage_model.output_projection.2.bias"]  # not copied


def test_nomic_bert_names_and_the_packed_query_key_value_matrix():
    wqkv = torch.arange(12.0).reshape(6, 2)  # rows [q; k; v], two each
    tensors = {
        "first_stage_model.embedder.encoder.layers.0.attn.Wqkv.weight": wqkv,
        "first_stage_model.embedder.encoder.layers.0.attn.out_proj.weight": torch.zeros(2, 2),
        "first_stage_model.embedder.encoder.layers.0.mlp.fc11.weight": torch.zeros(3, 2),
        "first_stage_model.embedder.encoder.layers.0.mlp.fc12.weight": torch.zeros(3, 2),
        "first_stage_model.embedder.encoder.layers.0.mlp.fc2.weight": torch.zeros(2, 3),
        "first_stage_model.embedder.encoder.layers.0.norm1.weight": torch.zeros(2),
        "first_stage_model.embedder.encoder.layers.0.norm2.weight": torch.zeros(2),
        "second_stage_model.backbone.emb_ln.weight": torch.zeros(2),
    }
    converted = convert_state_dict(tensors, "nomic_bert")
    layer = "first_stage.layers.0."
    assert sorted(converted) == sorted(
        [f"{layer}self_attn.{p}_proj.weight" for p in "qkv"]
        + [f"{layer}self_attn.o_proj.weight", f"{layer}mlp.up_proj.weight", f"{layer}mlp.gate_proj.weight"]
        + [f"{layer}mlp.down_proj.weight", f"{layer}post_attention_layernorm.weight"]
        + [f"{layer}post_mlp_layernorm.weight", "second_stage.embeddings.LayerNorm.weight"]
    )
    for part, rows in zip("qkv", wqkv.chunk(3)):
        assert torch.equal(converted[f"{layer}self_attn.{part}_proj.weight"], rows)


def test_an_unknown_parameter_is_named():
    with pytest.raises(ReleasedCheckpointError, match=r"Unexpected parameters in the released weights: \['extra.w'\]"):
        convert_state_dict({"extra.w": torch.zeros(1)}, "modernbert")
