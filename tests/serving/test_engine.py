"""The engine in-process: a server context is what ``set_context`` makes in-process (the library's sample, vectors
and counts), switching contexts between batches changes nothing and reads no weight, the keys/values of several
contexts kept under a budget, a creation interleaved with embeddings, prompts, token counts, and which folders load
as contextual."""

from __future__ import annotations

import asyncio
import atexit
import gc
import warnings

import numpy as np
import pytest
import torch
from sample_texts import SHORT_DOCS, TOPIC_DOCS
from serving_helpers import MAX_SEQ_LENGTH

from cde_st import ContextualSentenceTransformer
from cde_st.context_errors import ContextTooLarge, NonFiniteEmbedding
from cde_st.modules import context_attention, context_lifecycle
from cde_st.serving.engine import Engine, load_model


@pytest.fixture
def engine(cde_dir) -> Engine:
    return Engine(ContextualSentenceTransformer(cde_dir), served_name="tiny-cde")


def test_a_context_is_what_set_context_makes(engine, cde_dir, cde_model):
    made = engine.make_context("topics", TOPIC_DOCS, None, seed=4)
    vectors, info = cde_model.contextual_module.embed_context(TOPIC_DOCS, seed=4)
    assert made.fingerprint == info.fingerprint and made.size == info.size == 8 and made.corpus_size == 12
    assert torch.allclose(made.vectors, vectors.float().cpu(), atol=1e-5)  # smaller batches: other padding
    in_batches_of_32 = Engine(ContextualSentenceTransformer(cde_dir), context_batch_size=32)
    assert torch.equal(in_batches_of_32.make_context("topics", TOPIC_DOCS, None, seed=4).vectors, vectors.cpu())
    in_batches_of_32.close()
    with pytest.raises(ContextTooLarge) as error:
        engine.make_context("big", TOPIC_DOCS, 9, seed=0)
    assert error.value.param == "size"


def test_corpus_size_counts_distinct_documents_as_the_library_does(engine, cde_model):
    corpus = TOPIC_DOCS + TOPIC_DOCS[:3] + ["   ", ""]  # repeats and blanks: the corpus is a set of documents
    made = engine.make_context("repeats", corpus, None, seed=2)
    info = cde_model.contextual_module.embed_context(corpus, seed=2)[1]
    assert made.corpus_size == info.corpus_size == len(TOPIC_DOCS)
    assert made.fingerprint == info.fingerprint


def test_switching_contexts_reads_no_weight_and_keeps_their_keys_values(cde_dir, monkeypatch):
    engine = Engine(ContextualSentenceTransformer(cde_dir), served_name="tiny-cde")
    contexts = [engine.make_context(f"c{i}", TOPIC_DOCS, None, seed=i) for i in range(3)]
    engine.embed(["warm"], "query", contexts[0])  # the engine's one weights check
    reads, computed = [], []
    original = context_lifecycle.first_stage_fingerprint
    monkeypatch.setattr(context_lifecycle, "first_stage_fingerprint", lambda *a: reads.append(1) or original(*a))
    adapter = engine.model.contextual_module.second_adapter
    states = adapter.context_states
    monkeypatch.setattr(adapter, "context_states", lambda *a: computed.append(1) or states(*a))
    first = [engine.embed(SHORT_DOCS, "query", c).embeddings for c in contexts]
    for _ in range(2):
        for context, embedded in zip(contexts, first):
            assert np.array_equal(engine.embed(SHORT_DOCS, "query", context).embeddings, embedded)
    assert reads == []  # a switch re-reads no first-stage weight
    assert len(computed) == 2  # contexts[0]'s were made by the warm-up; each other context's once, then kept
    stats = engine.cache_stats()
    assert stats.contexts == 3 and stats.evictions == 0 and stats.bytes > 0
    engine.close()


def test_a_budget_keeps_the_most_recently_used_contexts(cde_dir, monkeypatch):
    engine = Engine(ContextualSentenceTransformer(cde_dir), served_name="tiny-cde")
    contexts = [engine.make_context(f"c{i}", TOPIC_DOCS, None, seed=i) for i in range(3)]
    engine.embed(["warm"], "query", contexts[0])
    one = engine.cache_stats().bytes
    engine.close()
    engine = Engine(ContextualSentenceTransformer(cde_dir), served_name="tiny-cde", context_cache_bytes=2 * one)
    computed = []
    adapter = engine.model.contextual_module.second_adapter
    states = adapter.context_states
    monkeypatch.setattr(adapter, "context_states", lambda *a: computed.append(1) or states(*a))
    for context in contexts + contexts:  # round robin over three with room for two: every switch recomputes
        engine.embed(["a query"], "query", context)
    assert len(computed) == 6
    assert engine.cache_stats().contexts == 2 and engine.cache_stats().evictions == 4
    computed.clear()
    for context in [contexts[1], contexts[2], contexts[1]]:  # the two most recent are kept
        engine.embed(["a query"], "query", context)
    assert computed == []
    engine.close()


def test_the_null_context_is_served_without_a_warning_or_warnings_state(engine, monkeypatch, recwarn):
    touched = []
    monkeypatch.setattr(warnings, "catch_warnings", lambda *a, **k: touched.append(1))  # not thread-safe
    null = engine.embed(SHORT_DOCS, "query", None).embeddings
    monkeypatch.undo()
    assert touched == [] and not [w for w in recwarn if issubclass(w.category, UserWarning)]
    empty = torch.zeros(0, engine.dimension)  # no vectors: every slot is the null vector
    expected = engine.model.encode(SHORT_DOCS, prompt=engine.prompt_for("query"), context_vectors=empty)
    assert np.abs(null - expected).max() <= 1e-5


def test_an_engine_is_closed_explicitly_not_at_exit(cde_dir, monkeypatch):
    registered = []
    monkeypatch.setattr(atexit, "register", lambda *a, **k: registered.append(a))
    engine = Engine(ContextualSentenceTransformer(cde_dir))
    assert registered == []
    engine.close()
    assert engine.model.contextual_module.weights_check.open_blocks == 0  # the scope it held is closed


def test_non_finite_embeddings_are_never_answered(engine):
    with torch.no_grad():
        engine.model.contextual_module.null_vector.fill_(float("nan"))  # a broken model: NaN in every answer
    with pytest.raises(NonFiniteEmbedding):
        engine.embed(["a query"], "query", None)


def test_a_creation_lets_embeddings_run_between_its_batches(cde_dir, monkeypatch):
    engine = Engine(ContextualSentenceTransformer(cde_dir), served_name="tiny-cde", context_batch_size=2)
    events = []
    module = engine.model.contextual_module
    first_stage = module.embed_context_features
    monkeypatch.setattr(module, "embed_context_features", lambda f: events.append("context") or first_stage(f))

    asked = []
    waiting = lambda: asked.append(1) or 0  # noqa: E731  (queued embedding texts, which go first: none here)

    async def run():
        loop = asyncio.get_running_loop()
        creation = asyncio.ensure_future(engine.create_context("big", TOPIC_DOCS, None, 1, waiting))
        while not creation.done():
            await loop.run_in_executor(
                engine.executor, lambda: events.append("embed") or engine.embed(["q"], None, None)
            )
        return await creation

    made = asyncio.run(run())
    contexts = [i for i, event in enumerate(events) if event == "context"]
    assert len(contexts) == 4  # J = 8 documents, 2 per batch
    assert "embed" in events[contexts[0] : contexts[-1]]  # embeddings ran while the context was made
    assert len(asked) >= 3  # between two batches, the creation asks whether embeddings are waiting
    expected = engine.make_context("big", TOPIC_DOCS, None, seed=1)
    assert made.fingerprint == expected.fingerprint and torch.equal(made.vectors, expected.vectors)
    engine.close()


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


def test_a_context_let_go_frees_its_keys_values(cde_dir):
    """A context the store drops (deleted, replaced, or removed by another replica's write) takes its keys/values
    with it, instead of holding them until the budget pushes them out; a later context is never served with them."""
    engine = Engine(ContextualSentenceTransformer(cde_dir), served_name="tiny-cde")
    contexts = [engine.make_context(f"c{i}", TOPIC_DOCS, None, seed=i) for i in range(3)]
    for context in contexts:
        engine.embed(["a query"], "query", context)
    full = engine.cache_stats()
    assert full.contexts == 3
    del contexts[0]  # not the active one
    gc.collect()
    engine.embed(["a query"], "query", contexts[0])  # the next switch drops what was let go
    assert (engine.cache_stats().contexts, engine.cache_stats().bytes) == (2, full.bytes * 2 // 3)
    replacement = engine.make_context("c1", SHORT_DOCS, None, seed=9)
    expected = engine.embed(SHORT_DOCS, "query", replacement).embeddings
    contexts[0] = replacement  # c1 replaced: the old object let go
    gc.collect()
    engine.embed(["a query"], "query", contexts[1])
    assert engine.cache_stats().contexts == 2  # c2 and the replacement
    assert np.array_equal(engine.embed(SHORT_DOCS, "query", replacement).embeddings, expected)
    engine.close()
