"""The engine in-process: a server context is what ``set_context`` makes in-process, switching contexts between
batches changes nothing, prompts, token counts, and which folders load as contextual."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sample_texts import SHORT_DOCS, TOPIC_DOCS
from serving_helpers import MAX_SEQ_LENGTH

from cde_st import ContextualSentenceTransformer
from cde_st.modules import context_attention
from cde_st.serving.engine import Engine, load_model
from cde_st.serving.errors import ApiError


@pytest.fixture
def engine(cde_dir) -> Engine:
    return Engine(ContextualSentenceTransformer(cde_dir), served_name="tiny-cde")


def test_a_context_is_what_set_context_makes(engine, cde_model):
    made = engine.make_context("topics", TOPIC_DOCS, None, seed=4)
    vectors, info = cde_model.contextual_module.embed_context(TOPIC_DOCS, seed=4)
    assert made.fingerprint == info.fingerprint and made.size == info.size == 8 and made.corpus_size == 12
    assert torch.equal(made.vectors, vectors.float().cpu())
    with pytest.raises(ApiError) as error:
        engine.make_context("big", TOPIC_DOCS, 9, seed=0)
    assert error.value.status == 400 and error.value.param == "size"


def test_switching_contexts_between_batches_changes_nothing(engine, cde_model):
    topics = engine.make_context("topics", TOPIC_DOCS, None, seed=0)
    short = engine.make_context("short", SHORT_DOCS, 5, seed=1)
    first = engine.embed(SHORT_DOCS, "query", topics).embeddings
    other = engine.embed(SHORT_DOCS, "query", short).embeddings
    none = engine.embed(SHORT_DOCS, "query", None).embeddings  # the null context
    again = engine.embed(SHORT_DOCS, "query", topics).embeddings
    assert np.array_equal(first, again)
    assert np.abs(first - other).max() > 1e-3 and np.abs(first - none).max() > 1e-3
    prompt = cde_model.prompts["query"]
    assert np.abs(first - cde_model.encode(SHORT_DOCS, prompt=prompt, context_vectors=topics.vectors)).max() <= 1e-5
    assert np.abs(other - cde_model.encode(SHORT_DOCS, prompt=prompt, context_vectors=short.vectors)).max() <= 1e-5


def test_prompts_tokens_and_truncation(engine, plain_dir):
    model = engine.model
    assert engine.prompt_for("query") == model.prompts["query"]
    assert engine.prompt_for("document") == engine.prompt_for(None) == model.prompts["document"]
    texts = ["short", " ".join(["glacier"] * 100)]
    batch = engine.embed(texts, "query", engine.model_context)
    lengths = [len(model.tokenizer(model.prompts["query"] + t)["input_ids"]) for t in texts]
    assert batch.tokens.tolist() == [lengths[0], MAX_SEQ_LENGTH] and batch.truncated.tolist() == [False, True]
    plain = Engine(plain_dir)
    assert not plain.contextual and plain.served_name == "tiny-plain" and plain.context_size is None
    assert plain.prompt_for("query") == plain.prompt_for(None) == ""  # a model without prompts gets none


def test_folders_load_as_what_they_are(cde_dir, plain_dir):
    assert isinstance(load_model(cde_dir), ContextualSentenceTransformer)
    plain = load_model(plain_dir)
    assert type(plain).__name__ == "SentenceTransformer"


def test_identity_names_the_weights_not_the_dtype(cde_dir, plain_dir):
    a = Engine(ContextualSentenceTransformer(cde_dir))
    b = Engine(ContextualSentenceTransformer(cde_dir), dtype="bfloat16")
    assert a.identity == b.identity and next(b.model.parameters()).dtype == torch.bfloat16
    changed = ContextualSentenceTransformer(cde_dir)
    with torch.no_grad():
        weight = changed.contextual_module.second_stage.encoder.layer[0].attention.self.query.weight
        weight.add_(torch.randn_like(weight) * 1e-3)  # a fine-tuned copy: every value moves a little
    assert Engine(changed).identity != a.identity
    assert Engine(plain_dir).identity != a.identity
    with pytest.raises(ValueError, match="dtype"):
        Engine(ContextualSentenceTransformer(cde_dir), dtype="int8")


def test_batches_do_not_re_read_the_weights(engine, monkeypatch):
    topics = engine.make_context("topics", TOPIC_DOCS, None, seed=0)
    engine.embed(["warm"], "query", topics)
    reads = []
    original = context_attention.second_stage_fingerprint
    monkeypatch.setattr(context_attention, "second_stage_fingerprint", lambda b: reads.append(1) or original(b))
    first = engine.embed(SHORT_DOCS, "query", topics).embeddings
    for _ in range(3):
        assert np.array_equal(engine.embed(SHORT_DOCS, "query", topics).embeddings, first)
    assert reads == []  # one weights check for the engine's life, not one per batch
    engine.close()
