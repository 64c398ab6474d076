"""The configs of a released model (cde_st.released.configs): the released sizes build offline with the published
parameter counts, and a config field that would be misread, or a backbone edit that keeps the released shapes, is
refused naming the file and the field."""

from __future__ import annotations

import json

import pytest
import torch
from released_helpers import copy_release

from cde_st import ContextualSentenceTransformer, ContextualTransformer
from cde_st.released import BACKBONE_CONFIGS, ReleasedCheckpointError, module_config

# Public configs of the released backbones, model fields only (their one home: cde_st.released.BACKBONE_CONFIGS).
MODERNBERT_BASE = BACKBONE_CONFIGS["answerdotai/ModernBERT-base"]
NOMIC_BERT_2048 = BACKBONE_CONFIGS["nomic-ai/nomic-bert-2048"]


@pytest.mark.parametrize(
    ("version", "raw", "expected_millions"),
    [("v2", MODERNBERT_BASE, 305.7), ("v1", NOMIC_BERT_2048, 281.1)],
)
def test_real_size_configs_build_offline(fixture_dir, version, raw, expected_millions):
    """The released sizes (512 context slots) build on the meta device, nothing downloaded or allocated."""
    from transformers import AutoTokenizer

    from cde_st.released import backbone_config

    cde = json.loads((fixture_dir / version / "config.json").read_text(encoding="utf-8"))
    cde["transductive_corpus_size"] = 512
    config = backbone_config(raw)
    tokenizer = AutoTokenizer.from_pretrained(str(fixture_dir / version), trust_remote_code=False)
    with torch.device("meta"):
        module = ContextualTransformer(config, config, tokenizer, module_config(cde, config.model_type))
    assert module.context_size == 512
    # the reference parameters; cde_st adds one null vector (768) of its own
    reference = sum(p.numel() for n, p in module.named_parameters() if n != "null_vector")
    assert round(reference / 1e6, 1) == expected_millions


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        ({"transductive_corpus_size": 0}, r"transductive_corpus_size.*0.*>= 1"),
        ({"transductive_corpus_size": 8.7}, r"'transductive_corpus_size' = 8\.7 \(float\): expected int"),
        ({"transductive_corpus_size": None}, r"'transductive_corpus_size' = None"),
        (
            {"pool_ignore_instruction_tokens": "false"},
            r"'pool_ignore_instruction_tokens' = 'false' \(str\): expected bool",
        ),
        ({"disable_transductive_rotary_embedding": "no"}, r"'disable_transductive_rotary_embedding' = 'no'"),
        ({"max_seq_length": "long"}, r"'max_seq_length' = 'long' \(str\): expected int"),
        ({"transductive_sequence_dropout_prob": "none"}, r"'transductive_sequence_dropout_prob' = 'none'"),
    ],
)
def test_a_released_config_field_that_would_be_misread_is_refused_naming_it(fixture_dir, tmp_path, edits, expected):
    folder = copy_release(fixture_dir, tmp_path, config=edits)
    with pytest.raises(ReleasedCheckpointError, match=expected) as err:
        ContextualSentenceTransformer(str(folder))
    assert str(folder / "config.json") in str(err.value)


@pytest.mark.parametrize(
    ("version", "edits", "expected"),
    [
        ("v2", {"hidden_size": "32x"}, r"'hidden_size' = '32x' \(str\): expected int"),
        ("v2", {"num_attention_heads": 3}, r"num_attention_heads.*3.*hidden_size 32"),
        ("v2", {"local_attention": -2}, r"'local_attention' = -2"),
        ("v2", {"norm_eps": "small"}, r"'norm_eps' = 'small'"),
        ("v2", {"global_rope_theta": 0}, r"'global_rope_theta' = 0"),
        ("v1", {"n_head": "four"}, r"'n_head' = 'four'"),
        ("v1", {"layer_norm_epsilon": -1.0}, r"'layer_norm_epsilon' = -1\.0"),
    ],
)
def test_a_backbone_config_field_that_would_be_misread_is_refused_naming_the_file(
    fixture_dir, tmp_path, version, edits, expected
):
    folder = copy_release(fixture_dir, tmp_path, version=version, backbone=edits)
    with pytest.raises(ReleasedCheckpointError, match=expected) as err:
        ContextualSentenceTransformer(str(folder))
    assert "backbone_config.json" in str(err.value)


@pytest.mark.parametrize(
    ("raw", "field", "value"),
    [
        ("modernbert", "num_attention_heads", 6),
        ("modernbert", "local_attention", 256),
        ("modernbert", "global_rope_theta", 10000.0),
        ("modernbert", "norm_eps", 1e-6),
        ("nomic_bert", "n_head", 6),
        ("nomic_bert", "rotary_emb_base", 10000),
        ("nomic_bert", "layer_norm_epsilon", 1e-5),
    ],
)
def test_a_backbone_edit_that_keeps_the_released_shapes_is_refused(fixture_dir, raw, field, value):
    """The released weights fit only their embedder's architecture: a config with the released backbone's sizes but
    another head count, window, rope theta or norm eps would load (the shapes fit) and compute another model."""
    from cde_st.released import check_backbone_config

    public = dict(MODERNBERT_BASE if raw == "modernbert" else NOMIC_BERT_2048)
    embedder = "answerdotai/ModernBERT-base" if raw == "modernbert" else "nomic-ai/nomic-bert-2048"
    check_backbone_config(public, embedder, "backbone_config.json")  # the embedder's own config passes
    with pytest.raises(ReleasedCheckpointError, match=rf"backbone_config\.json.*{field}.*{value}.*{embedder}"):
        check_backbone_config({**public, field: value}, embedder, "backbone_config.json")
