"""The corpus context reaches sentence-transformers' multi-process workers as vectors."""

from __future__ import annotations

import numpy as np
from corpus_helpers import DOCS

from cde_st.corpus.encoders import DocumentEncoder
from cde_st.data import document_text

TEXTS = [document_text(d["title"], d["text"]) for d in DOCS[:24]]


def test_encode_document_on_a_device_list_follows_set_context(tiny_cde):
    tiny_cde.set_context(TEXTS[:10], seed=0)
    single = tiny_cde.encode_document(TEXTS)
    np.testing.assert_allclose(tiny_cde.encode_document(TEXTS, device=["cpu", "cpu"]), single, atol=1e-6)
    tiny_cde.set_context(TEXTS[10:], seed=1)  # a later context: the next pool call uses it
    later = tiny_cde.encode_document(TEXTS)
    assert np.abs(later - single).max() > 1e-5  # the tiny model reads its context weakly, but visibly
    np.testing.assert_allclose(tiny_cde.encode_document(TEXTS, device=["cpu", "cpu"]), later, atol=1e-6)


def test_the_pool_encoder_equals_the_in_process_one_and_puts_the_context_back(tiny_cde):
    tiny_cde.set_context(TEXTS[:10])
    own = tiny_cde.contextual_module.context_vectors.clone()
    vectors = np.random.default_rng(0).normal(size=(8, 32)).astype(np.float32)
    with DocumentEncoder(tiny_cde, vectors, batch_size=4) as encoder:
        local = encoder(TEXTS)
    with DocumentEncoder(tiny_cde, vectors, devices=["cpu", "cpu"], batch_size=4) as encoder:
        pooled = encoder(TEXTS)
    np.testing.assert_allclose(pooled, local, atol=1e-6)
    np.testing.assert_allclose(local, tiny_cde.encode_document(TEXTS, context_vectors=vectors), atol=1e-6)
    assert np.array_equal(tiny_cde.contextual_module.context_vectors.numpy(), own.numpy())
