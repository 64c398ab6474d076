"""The two HF encoders of a contextual model (cde_st/modules/encoders.py): kernel choice, building from a config,
two independent pretrained copies."""

from __future__ import annotations

import pytest
import torch

from cde_st.modules.encoders import build_encoder, load_pretrained_pair, own_storage, resolve_attn_implementation


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU choice is what is checked here")
def test_auto_is_sdpa_without_cuda_and_flash_is_refused_naming_what_is_missing():
    assert resolve_attn_implementation(None) == resolve_attn_implementation("auto") == "sdpa"
    assert resolve_attn_implementation("eager") == "eager"
    with pytest.raises(ImportError, match="a CUDA device"):
        resolve_attn_implementation("flash_attention_2")


def test_build_encoder_from_a_config_dict_without_a_pooler():
    config = dict(
        model_type="bert",
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    model = build_encoder(config, None)
    assert model.config.model_type == "bert" and model.config.hidden_size == 16
    assert model.pooler is None  # the BERT family is built without the pooler cde_st never uses
    assert config["model_type"] == "bert"  # the caller's dict is not consumed


def test_pretrained_pair_are_two_independent_copies(tiny_bert_dir):
    first, second, tokenizer = load_pretrained_pair(tiny_bert_dir, None)
    a, b = first.embeddings.word_embeddings.weight, second.embeddings.word_embeddings.weight
    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    with torch.no_grad():
        a.add_(1.0)
    assert not torch.equal(a, b)  # training one stage leaves the other as it was
    assert tokenizer("a text")["input_ids"]


def test_own_storage_gives_views_their_own_storage():
    packed = torch.nn.Parameter(torch.randn(6, 4))
    module = torch.nn.Module()
    module.view = torch.nn.Parameter(packed.data[:3])  # a view into a larger tensor, as a packed checkpoint loads
    assert module.view.untyped_storage().nbytes() > module.view.numel() * module.view.element_size()
    before = module.view.detach().clone()
    own_storage(module)
    assert module.view.untyped_storage().nbytes() == module.view.numel() * module.view.element_size()
    assert torch.equal(module.view, before)
