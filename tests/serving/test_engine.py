"""The engine in-process: a server context is what ``set_context`` makes in-process (the library's sample, vectors
and counts), a creation interleaved with embeddings, prompts, token counts, the engine's identity and closing, and
which folders load as contextual. The forwards themselves (context switches, keys/values kept under a budget, the
null context) are tests/serving/test_forwards.py."""

from __future__ import annotations

import asyncio
import atexit

import pytest
import torch
from sample_texts import TOPIC_DOCS
from serving_helpers import MAX_SEQ_LENGTH

from cde_st import ContextualSentenceTransformer
from cde_st.context_errors import ContextTooLarge
from cde_st.model_loading import load_model
from cde_st.serving.engine import Engine


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


def test_an_engine_is_closed_explicitly_not_at_exit(cde_dir, monkeypatch):
    registered = []
    monkeypatch.setattr(atexit, "register", lambda *a, **k: registered.append(a))
    engine = Engine(ContextualSentenceTransformer(cde_dir))
    assert registered == []
    engine.close()
    assert engine.model.contextual_module.weights_check.open_blocks == 0  # the scope it held is closed


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
