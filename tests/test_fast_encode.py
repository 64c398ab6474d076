"""encode_fast gives what encode_query / encode_document / encode give (float32, <= 1e-6), for a plain
sentence-transformers model and for contextual models (joint and cached context), whatever the batches."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from cde_st import encode_fast
from cde_st.fast_encode import _pack_chunk

TOL = 1e-6


def ragged_texts() -> list[str]:
    """Ragged lengths (0 to ~80 tokens with the tiny tokenizer's characters, so some truncate at 64), repeats, an
    empty text."""
    words = ["what", "causes", "rain", "cells", "protein", "zebra", "mutation"]
    texts = [" ".join(words[(i * 3 + k) % len(words)] for k in range((i * 7) % 23)) for i in range(37)]
    return texts + ["", texts[5], "x", texts[5], "protein " * 30]


@pytest.fixture(scope="module")
def plain_model(tiny_bert_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    torch.manual_seed(0)
    transformer = Transformer(tiny_bert_dir, max_seq_length=64)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), "mean"), Normalize()]
    return SentenceTransformer(modules=modules, prompts={"query": "query: ", "document": "passage: "}).eval()


def contextual(tiny_bert_dir, **config):
    from cde_st import ContextualSentenceTransformer

    torch.manual_seed(0)
    config = dict(max_seq_length=64, output_head="mlp", first_stage_residual=False, **config)
    model = ContextualSentenceTransformer.from_encoder(tiny_bert_dir, context_size=8, **config).eval()
    if model.contextual_module.gates is not None:
        with torch.no_grad():
            model.contextual_module.gates.fill_(0.5)  # read the context, as after training
    model.set_context(ragged_texts(), seed=0)
    return model


@pytest.fixture(scope="module")
def joint_model(tiny_bert_dir):
    return contextual(tiny_bert_dir, context_attention="joint")


@pytest.fixture(scope="module")
def cached_model(tiny_bert_dir):
    return contextual(tiny_bert_dir, context_attention="cached", context_gate=True, context_layers=[-1])


def reference(model, kind: str, texts, **kwargs):
    method = {"query": model.encode_query, "document": model.encode_document, "text": model.encode}[kind]
    return method(texts, **kwargs)


@pytest.mark.parametrize("name", ["plain_model", "joint_model", "cached_model"])
@pytest.mark.parametrize("kind", ["query", "document", "text"])
def test_equals_encode_for_every_model_and_kind(request, name, kind):
    model = request.getfixturevalue(name)
    texts = ragged_texts()
    expected = reference(model, kind, texts, batch_size=8)
    for options in (
        dict(batch_size=8),
        dict(batch_size=64, batch_tokens=150, chunk_size=11),  # several chunks: the background thread
        dict(batch_size=1),
    ):
        got = encode_fast(model, texts, kind, **options)
        assert got.dtype == expected.dtype and got.shape == expected.shape == (len(texts), 32)
        assert np.abs(got - expected).max() <= TOL, options
    # repeats give the same row wherever they are: the order is the input's
    assert np.abs(got[5] - got[38]).max() <= TOL and np.abs(got[5] - got[40]).max() <= TOL


def test_prompts_are_those_of_each_method(plain_model):
    texts = ragged_texts()[:9]
    no_prompt = plain_model.encode(texts, prompt="")
    queries = encode_fast(plain_model, texts, "query")
    assert np.abs(queries - plain_model.encode(texts, prompt="query: ")).max() <= TOL
    assert np.abs(queries - no_prompt).max() > 1e-3  # the prompt changed the embeddings
    explicit = encode_fast(plain_model, texts, "query", prompt="custom: ")
    assert np.abs(explicit - plain_model.encode_query(texts, prompt="custom: ")).max() <= TOL
    named = encode_fast(plain_model, texts, "text", prompt_name="document")
    assert np.abs(named - plain_model.encode(texts, prompt="passage: ")).max() <= TOL
    with pytest.raises(ValueError, match="not found"):
        encode_fast(plain_model, texts, prompt_name="nope")


def test_contextual_text_kind_uses_the_default_document_prompt(joint_model):
    texts = ragged_texts()[:9]
    assert joint_model.default_prompt_name == "document"
    got = encode_fast(joint_model, texts, "text")
    assert np.abs(got - joint_model.encode_document(texts)).max() <= TOL


def test_output_types_empty_and_single(cached_model):
    texts = ragged_texts()
    tensor = encode_fast(cached_model, texts, "query", convert_to_tensor=True, batch_size=7)
    expected = cached_model.encode_query(texts, convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.device == expected.device
    assert (tensor - expected).abs().max() <= TOL
    rows = encode_fast(cached_model, texts, "query", convert_to_numpy=False)
    assert isinstance(rows, list) and len(rows) == len(texts) and isinstance(rows[0], torch.Tensor)
    assert (torch.stack(rows) - expected).abs().max() <= TOL
    single = encode_fast(cached_model, "what causes rain", "query")
    assert single.shape == (32,) and np.abs(single - cached_model.encode_query("what causes rain")).max() <= TOL
    for kwargs in (dict(), dict(convert_to_tensor=True), dict(convert_to_numpy=False)):
        got, want = encode_fast(cached_model, [], **kwargs), cached_model.encode_document([], **kwargs)
        assert type(got) is type(want) and len(got) == len(want) == 0


def test_normalise_truncate_and_quantise_as_encode(joint_model):
    texts = ragged_texts()
    for kwargs in (dict(normalize_embeddings=True), dict(truncate_dim=8), dict(precision="int8")):
        got, want = (
            encode_fast(joint_model, texts, batch_size=5, **kwargs),
            joint_model.encode_document(texts, **kwargs),
        )
        assert got.dtype == want.dtype and got.shape == want.shape
        # int8 buckets come from the whole set: equal up to a rounding of one bucket at most
        assert np.abs(got.astype(np.float64) - want).max() <= (1 if kwargs.get("precision") else TOL)


def test_context_of_the_call_and_its_alias(joint_model):
    texts = ragged_texts()[:12]
    vectors = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    want = joint_model.encode_query(texts, context_vectors=vectors)
    assert np.abs(encode_fast(joint_model, texts, "query", context_vectors=vectors) - want).max() <= TOL
    assert np.abs(encode_fast(joint_model, texts, "query", dataset_embeddings=vectors) - want).max() <= TOL
    assert np.abs(want - joint_model.encode_query(texts)).max() > 1e-4  # the given context was read
    with pytest.raises(ValueError, match="does not use"):
        encode_fast(joint_model, texts, context_vector=vectors)
    with pytest.raises(TypeError, match="task"):
        encode_fast(joint_model, texts, task="query")
    with pytest.raises(ValueError, match="kind"):
        encode_fast(joint_model, texts, kind="queries")


def test_a_changed_first_stage_is_re_embedded_once_per_call(tiny_bert_dir):
    model = contextual(tiny_bert_dir, context_attention="cached", context_gate=True)
    texts = ragged_texts()[:10]
    before = encode_fast(model, texts)
    with torch.no_grad():
        model.contextual_module.first_stage.embeddings.word_embeddings.weight.mul_(1.5)
    after = encode_fast(model, texts, batch_size=3)
    assert np.abs(after - before).max() > 1e-4  # the context was re-embedded with the new weights
    assert np.abs(after - model.encode_document(texts)).max() <= TOL


def test_batches_are_the_tokenizer_output_of_their_rows(plain_model):
    texts = ragged_texts()
    tokenizer = plain_model[0].tokenizer
    for side in ("right", "left"):
        tokenizer.padding_side = side
        try:
            options = dict(kwargs={"task": "query"}, batch_size=6, batch_tokens=90, pin_memory=False)
            chunk = _pack_chunk(plain_model, texts, 100, "query: ", options)
            seen = []
            for positions, features in chunk.batches():
                rows = [texts[i - 100] for i in positions.tolist()]
                alone = plain_model.preprocess(rows, prompt="query: ", task="query")
                assert features.keys() == alone.keys()
                for key, value in alone.items():
                    if isinstance(value, torch.Tensor):
                        assert torch.equal(features[key], value), (side, key)
                    else:
                        assert features[key] == value
                assert features["input_ids"].numel() <= max(90, features["input_ids"].shape[1])
                seen += positions.tolist()
            assert sorted(seen) == list(range(100, 100 + len(texts)))
        finally:
            tokenizer.padding_side = "right"


def test_batch_boundaries_at_the_budget_give_the_same_embeddings(plain_model):
    texts = ["aaa bbb"] * 6 + ["a"] * 5  # two lengths, so a budget of a multiple of the longer fills batches exactly
    length = int(plain_model.preprocess(texts[:1], prompt="passage: ")["attention_mask"].sum())
    expected = plain_model.encode_document(texts)
    for budget in (length, 2 * length, 2 * length - 1, 3 * length + 1):
        got = encode_fast(plain_model, texts, batch_size=100, batch_tokens=budget)
        assert np.abs(got - expected).max() <= TOL, budget


def test_features_that_cannot_be_cut_go_through_encode(plain_model, caplog, monkeypatch):
    texts = ["what causes rain", "x", "cells", "what causes rain"]  # all far shorter than 64 tokens
    padded = {"text": {"padding": "max_length", "max_length": 64}}
    with caplog.at_level(logging.INFO, logger="cde_st.fast_encode"):
        got = encode_fast(plain_model, texts, "query", processing_kwargs=padded)
    assert "padded past their longest row" in caplog.text
    assert np.abs(got - plain_model.encode_query(texts, processing_kwargs=padded)).max() <= TOL
    monkeypatch.setattr(plain_model[0], "can_flatten_inputs", True, raising=False)
    calls = []
    monkeypatch.setattr(plain_model, "encode", lambda *a, **k: calls.append(k) or "encoded")
    assert encode_fast(plain_model, texts, "query") == "encoded" and calls[0]["prompt"] == "query: "
    assert calls[0]["task"] == "query"


def test_embeddings_are_those_of_the_former_forward_loop(cached_model):
    """encode_fast runs the server's forward loop (cde_st.modules.forward_loop): its embeddings are bit for bit those
    of the loop it had of its own, kept here as it was (one chunk, so the batches are those of ``_pack_chunk``)."""
    texts = ragged_texts()
    options = dict(kwargs={"task": "document"}, batch_size=4, batch_tokens=64, pin_memory=False)
    prompt = cached_model.prompts["document"]
    got = encode_fast(cached_model, texts, "document", batch_size=4, batch_tokens=64, convert_to_tensor=True)
    expected = torch.empty_like(got)
    with torch.inference_mode():
        for positions, features in _pack_chunk(cached_model, texts, 0, prompt, options).batches():
            expected.index_copy_(0, positions, cached_model(features, task="document")["sentence_embedding"])
    assert float((got - expected).abs().max()) == 0.0
