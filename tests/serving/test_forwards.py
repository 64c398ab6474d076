"""The served model's forwards, driven with tokenised requests: one row per text in request order, equal to
``encode`` with the context given, cut into forwards by the batch limits, with token counts and truncation flags;
switching contexts between batches changes nothing and reads no weight, the keys/values of several contexts kept
under a budget and freed with their context, the null context served without warnings, non-finite embeddings never
answered, and a plain model run without a context."""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from sample_texts import SHORT_DOCS, TOPIC_DOCS
from serving_helpers import MAX_SEQ_LENGTH

from cde_st.context_errors import NonFiniteEmbedding
from cde_st.modules import context_attention, context_lifecycle
from cde_st.serving.forwards import Forwards
from cde_st.serving.tokens import RequestTokenizer


@dataclass(eq=False)
class Context:
    """What the forwards read of a stored context (kept by identity, as the store's are)."""

    vectors: torch.Tensor
    fingerprint: str


class Served:
    """A model of its own (tests change its state and weights), its forwards and a tokenizer for query requests."""

    def __init__(self, cde_dir: str, **limits) -> None:
        from cde_st import ContextualSentenceTransformer

        self.model = ContextualSentenceTransformer(cde_dir).eval()
        self.forwards = Forwards(self.model, **limits)
        self.prompt = self.model.prompts["query"]
        self.tokenizer = RequestTokenizer(self.model, MAX_SEQ_LENGTH, [self.prompt])

    def embed(self, texts: list[str], context: Context | None) -> np.ndarray:
        return self.forwards.embed_tokens([self.tokenizer.tokenize(texts, self.prompt)], context).embeddings

    def context(self, documents: list[str], seed: int, rows: int | None = None) -> Context:
        vectors, info = self.model.contextual_module.embed_context(documents, seed=seed)
        return Context(vectors.float().cpu()[:rows], f"{info.fingerprint}:{rows}")


@pytest.fixture
def served(cde_dir):
    made = []

    def make(**limits) -> Served:
        made.append(Served(cde_dir, **limits))
        return made[-1]

    yield make
    for one in made:
        one.forwards.close()


def test_requests_come_back_in_order_cut_into_forwards_by_the_limits(served):
    server = served(max_batch_size=2, max_batch_tokens=None)
    model, prompt = server.model, server.prompt
    first, second = ["rain", "sun and wind", "a cloud"], [" ".join(["glacier"] * 100), "snow"]
    context = server.context(TOPIC_DOCS, seed=0)
    parts = [server.tokenizer.tokenize(first, prompt), server.tokenizer.tokenize(second, prompt)]
    batch = server.forwards.embed_tokens(parts, context)
    expected = model.encode(first + second, prompt=prompt, context_vectors=context.vectors)
    assert batch.embeddings.dtype == np.float32 and np.abs(batch.embeddings - expected).max() <= 1e-5
    assert server.forwards.forwards == 3  # five texts, at most two a forward
    counted = np.array([len(model.tokenizer(prompt + t)["input_ids"]) for t in first + second])
    assert batch.tokens.tolist() == np.minimum(counted, MAX_SEQ_LENGTH).tolist()
    assert batch.truncated.tolist() == (counted > MAX_SEQ_LENGTH).tolist() and batch.truncated[3]
    rows = batch.rows(3, 5)
    assert np.array_equal(rows.embeddings, batch.embeddings[3:]) and rows.tokens.tolist() == batch.tokens[3:].tolist()


def test_switching_contexts_between_batches_changes_nothing(served, cde_model):
    server = served()
    topics, short = server.context(TOPIC_DOCS, seed=0), server.context(SHORT_DOCS, seed=1, rows=5)
    first = server.embed(SHORT_DOCS, topics)
    other = server.embed(SHORT_DOCS, short)
    none = server.embed(SHORT_DOCS, None)  # the null context
    again = server.embed(SHORT_DOCS, topics)
    assert np.array_equal(first, again)
    assert np.abs(first - other).max() > 1e-3 and np.abs(first - none).max() > 1e-3
    encode = cde_model.encode
    assert np.abs(first - encode(SHORT_DOCS, prompt=server.prompt, context_vectors=topics.vectors)).max() <= 1e-5
    assert np.abs(other - encode(SHORT_DOCS, prompt=server.prompt, context_vectors=short.vectors)).max() <= 1e-5


def test_switching_contexts_reads_no_weight_and_keeps_their_keys_values(served, monkeypatch):
    server = served()
    contexts = [server.context(TOPIC_DOCS, seed=i) for i in range(3)]
    server.embed(["warm"], contexts[0])  # the forwards' one weights check
    reads, computed = [], []
    original = context_lifecycle.first_stage_fingerprint
    monkeypatch.setattr(context_lifecycle, "first_stage_fingerprint", lambda *a: reads.append(1) or original(*a))
    adapter = server.model.contextual_module.second_adapter
    states = adapter.context_states
    monkeypatch.setattr(adapter, "context_states", lambda *a: computed.append(1) or states(*a))
    first = [server.embed(SHORT_DOCS, c) for c in contexts]
    for _ in range(2):
        for context, embedded in zip(contexts, first):
            assert np.array_equal(server.embed(SHORT_DOCS, context), embedded)
    assert reads == []  # a switch re-reads no first-stage weight
    assert len(computed) == 2  # contexts[0]'s were made by the warm-up; each other context's once, then kept
    stats = server.forwards.cache_stats()
    assert stats.contexts == 3 and stats.evictions == 0 and stats.bytes > 0


def test_a_budget_keeps_the_most_recently_used_contexts(served, monkeypatch):
    probe = served()
    contexts = [probe.context(TOPIC_DOCS, seed=i) for i in range(3)]
    probe.embed(["warm"], contexts[0])
    server = served(context_cache_bytes=2 * probe.forwards.cache_stats().bytes)
    computed = []
    adapter = server.model.contextual_module.second_adapter
    states = adapter.context_states
    monkeypatch.setattr(adapter, "context_states", lambda *a: computed.append(1) or states(*a))
    for context in contexts + contexts:  # round robin over three with room for two: every switch recomputes
        server.embed(["a query"], context)
    assert len(computed) == 6
    assert server.forwards.cache_stats().contexts == 2 and server.forwards.cache_stats().evictions == 4
    computed.clear()
    for context in [contexts[1], contexts[2], contexts[1]]:  # the two most recent are kept
        server.embed(["a query"], context)
    assert computed == []


def test_a_context_let_go_frees_its_keys_values(served):
    """A context the store drops (deleted, replaced, or removed by another replica's write) takes its keys/values
    with it, instead of holding them until the budget pushes them out; a later context is never served with them."""
    server = served()
    contexts = [server.context(TOPIC_DOCS, seed=i) for i in range(3)]
    for context in contexts:
        server.embed(["a query"], context)
    full = server.forwards.cache_stats()
    assert full.contexts == 3
    del contexts[0]  # not the active one
    gc.collect()
    server.embed(["a query"], contexts[0])  # the next switch drops what was let go
    assert (server.forwards.cache_stats().contexts, server.forwards.cache_stats().bytes) == (2, full.bytes * 2 // 3)
    replacement = server.context(SHORT_DOCS, seed=9)
    expected = server.embed(SHORT_DOCS, replacement)
    contexts[0] = replacement  # c1 replaced: the old object let go
    gc.collect()
    server.embed(["a query"], contexts[1])
    assert server.forwards.cache_stats().contexts == 2  # c2 and the replacement
    assert np.array_equal(server.embed(SHORT_DOCS, replacement), expected)


def test_batches_do_not_re_read_the_weights(served, monkeypatch):
    server = served()
    topics = server.context(TOPIC_DOCS, seed=0)
    server.embed(["warm"], topics)
    reads = []
    original = context_attention.second_stage_fingerprint
    monkeypatch.setattr(context_attention, "second_stage_fingerprint", lambda b: reads.append(1) or original(b))
    first = server.embed(SHORT_DOCS, topics)
    for _ in range(3):
        assert np.array_equal(server.embed(SHORT_DOCS, topics), first)
    assert reads == []  # one weights check for the forwards' life, not one per batch


def test_the_null_context_is_served_without_a_warning_or_warnings_state(served, monkeypatch, recwarn):
    server = served()
    touched = []
    monkeypatch.setattr(warnings, "catch_warnings", lambda *a, **k: touched.append(1))  # not thread-safe
    null = server.embed(SHORT_DOCS, None)
    monkeypatch.undo()
    assert touched == [] and not [w for w in recwarn if issubclass(w.category, UserWarning)]
    empty = torch.zeros(0, server.forwards.dimension)  # no vectors: every slot is the null vector
    expected = server.model.encode(SHORT_DOCS, prompt=server.prompt, context_vectors=empty)
    assert np.abs(null - expected).max() <= 1e-5


def test_non_finite_embeddings_are_never_answered(served):
    server = served()
    with torch.no_grad():
        server.model.contextual_module.null_vector.fill_(float("nan"))  # a broken model: NaN in every answer
    with pytest.raises(NonFiniteEmbedding, match="The model gave NaN or infinite values for this batch"):
        server.embed(["a query"], None)


def test_a_plain_model_is_run_without_a_context(plain_dir):
    from sentence_transformers import SentenceTransformer

    plain = SentenceTransformer(plain_dir).eval()
    forwards = Forwards(plain)
    batch = forwards.embed_tokens([RequestTokenizer(plain, MAX_SEQ_LENGTH, [""]).tokenize(SHORT_DOCS, "")], None)
    assert not forwards.contextual and forwards.dimension == 32
    assert np.abs(batch.embeddings - plain.encode(SHORT_DOCS)).max() <= 1e-5
    assert forwards.cache_stats().contexts == 0 and forwards.forwards == 1
