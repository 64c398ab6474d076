"""A model with a store's context: documents embedded as ``cde-st-embed`` stores them, queries as ``cde-st-search``
embeds them (normalised, the store's context whatever the model's active one), and the model's active context read
as vectors, or a clear error without one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cde_st.vector_stores.store_embedder import StoreEmbedder, model_context

TEXTS = ["rain over hills", "lava from a volcano", "bread in an oven"]
CONTEXT = np.random.default_rng(0).normal(size=(8, 32)).astype(np.float32)


def test_documents_are_what_cde_st_embed_stores(tiny_cde):
    expected = tiny_cde.encode_document(TEXTS, context_vectors=torch.as_tensor(CONTEXT))
    np.testing.assert_allclose(StoreEmbedder(tiny_cde, CONTEXT).documents(TEXTS), expected, atol=1e-5)
    normalized = StoreEmbedder(tiny_cde, CONTEXT, normalized=True).documents(TEXTS)
    np.testing.assert_allclose(normalized, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)
    empty = StoreEmbedder(tiny_cde, CONTEXT).documents([])
    assert empty.shape == (0, 32) and empty.dtype == np.float32


def test_queries_read_the_stores_context_whatever_the_model_has_active(tiny_cde):
    expected = tiny_cde.encode_query(TEXTS, context_vectors=torch.as_tensor(CONTEXT))
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    embedder = StoreEmbedder(tiny_cde, CONTEXT)
    tiny_cde.set_context(TEXTS)  # another context active
    np.testing.assert_allclose(embedder.queries(TEXTS), expected, atol=1e-5)
    tiny_cde.set_context(torch.as_tensor(CONTEXT))  # the store's context active: read as it is
    np.testing.assert_allclose(embedder.queries(TEXTS), expected, atol=1e-5)


def test_a_plain_model_needs_no_context_and_a_contextual_one_does(tiny_cde, tiny_plain_model):
    plain = StoreEmbedder(tiny_plain_model, None).queries(TEXTS)
    expected = tiny_plain_model.encode_query(TEXTS)
    np.testing.assert_allclose(plain, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)
    with pytest.raises(ValueError, match="a contextual model needs the store's context vectors"):
        StoreEmbedder(tiny_cde, None)


def test_the_models_active_context_is_read_as_vectors(tiny_cde, tiny_plain_model):
    assert model_context(tiny_plain_model) is None
    with pytest.raises(ValueError, match=r"the model has no active context: call model.set_context\(corpus\) first"):
        model_context(tiny_cde)
    tiny_cde.set_context(torch.as_tensor(CONTEXT))
    read = model_context(tiny_cde)
    assert read.dtype == np.float32 and np.array_equal(read, CONTEXT)
