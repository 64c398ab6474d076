"""Embedding a shard's texts as ``encode_document`` does, with the corpus context as vectors, the caller's context
put back, the document prompt found as sentence-transformers finds it, and a context refused where it does not
belong."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from corpus_helpers import TEXTS

from cde_st.corpus.encoders import DocumentEncoder, document_prompt

TEXTS = TEXTS[:24]


def test_the_encoder_embeds_with_the_context_given_and_puts_the_callers_back(tiny_cde):
    # A pool of workers embeds as this process does: test_job embeds a corpus with two workers and without.
    tiny_cde.set_context(TEXTS[:10])
    own = tiny_cde.contextual_module.context_vectors.clone()
    vectors = np.random.default_rng(0).normal(size=(8, 32)).astype(np.float32)
    with DocumentEncoder(tiny_cde, vectors, batch_size=4) as encoder:
        local = encoder(TEXTS)
        assert encoder.encode_shards([TEXTS[:5], TEXTS[5:]])[1].shape == (len(TEXTS) - 5, 32)
    np.testing.assert_allclose(local, tiny_cde.encode_document(TEXTS, context_vectors=vectors), atol=1e-6)
    assert np.abs(local - tiny_cde.encode_document(TEXTS)).max() > 1e-5  # the model's own context gives others
    assert np.array_equal(tiny_cde.contextual_module.context_vectors.numpy(), own.numpy())


@pytest.mark.parametrize(
    ("prompts", "default", "expected"),
    [
        ({"query": "q: ", "corpus": "c: ", "passage": "p: "}, None, "p: "),  # passage before corpus
        ({"corpus": "c: ", "document": "d: "}, None, "d: "),
        ({"query": "q: ", "title": "t: "}, "title", "t: "),  # no document prompt: the default one
        ({"query": "q: "}, None, ""),
        (None, None, ""),
    ],
)
def test_the_document_prompt_is_the_one_encode_document_applies(prompts, default, expected):
    assert document_prompt(SimpleNamespace(prompts=prompts, default_prompt_name=default)) == expected


def test_a_context_is_required_by_a_contextual_model_and_refused_by_a_plain_one(tiny_cde, tiny_plain):
    with pytest.raises(ValueError, match="a contextual model needs a context to embed a corpus with"):
        DocumentEncoder(tiny_cde, None)
    with pytest.raises(ValueError, match="SentenceTransformer is not a contextual model; it takes no context"):
        DocumentEncoder(tiny_plain, np.zeros((2, 32), np.float32))
    with DocumentEncoder(tiny_plain, None, normalize=True) as encoder:
        embedded = encoder(TEXTS[:3])
    assert embedded.dtype == np.float32 and np.allclose(np.linalg.norm(embedded, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(embedded, tiny_plain.encode_document(TEXTS[:3], normalize_embeddings=True), atol=1e-6)
