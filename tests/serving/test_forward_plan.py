"""Cutting a batch into forwards by length: without a forward's cost every forward is as full as the limits allow
(what the server always did), with it a long text does not pad many short ones, the limits always hold, and the
embeddings of a batch cut in several forwards are those of one forward."""

from __future__ import annotations

import numpy as np
import pytest
from sample_texts import SHORT_DOCS
from serving_helpers import MAX_SEQ_LENGTH

from cde_st import ContextualSentenceTransformer
from cde_st.modules.batch_plan import plan_batches
from cde_st.serving.engine import Engine
from cde_st.serving.tokens import forward_features


def _covers(cuts, n):
    assert [start for start, _ in cuts] == [0] + [stop for _, stop in cuts[:-1]] and cuts[-1][1] == n


def test_without_a_cost_forwards_are_as_full_as_allowed():
    lengths = np.array([30, 20, 20, 10, 10, 10, 5])
    assert plan_batches(lengths, 4) == [(0, 4), (4, 7)]
    assert plan_batches(lengths, 8, max_tokens=60) == [(0, 2), (2, 5), (5, 7)]  # 2x30, 3x20, 2x10
    assert plan_batches(np.array([100, 1]), 8, max_tokens=50) == [(0, 1), (1, 2)]  # one text at least


def test_a_long_text_does_not_pad_many_short_ones():
    lengths = np.array([60] + [10] * 15)
    # one forward: 16 x 60 = 960 padded tokens; two: 60 + 15 x 10 = 210, plus one more forward's cost
    assert plan_batches(lengths, 32, overhead_tokens=40) == [(0, 1), (1, 16)]
    assert plan_batches(lengths, 32, overhead_tokens=5000) == [(0, 16)]  # a forward costs more than padding
    assert plan_batches(np.array([20] * 10), 32, overhead_tokens=40) == [(0, 10)]  # nothing to gain: one forward


@pytest.mark.parametrize("overhead", [0.0, 1.0, 45.0, 1e6])
@pytest.mark.parametrize("max_tokens", [None, 200])
def test_the_limits_hold_and_every_text_is_in_one_forward(overhead, max_tokens):
    rng = np.random.default_rng(0)
    for _ in range(20):
        lengths = np.sort(rng.integers(1, 120, size=rng.integers(1, 80)))[::-1]
        cuts = plan_batches(lengths, 16, max_tokens, overhead)
        _covers(cuts, len(lengths))
        for start, stop in cuts:
            assert 1 <= stop - start <= 16
            assert max_tokens is None or stop - start == 1 or (stop - start) * lengths[start] <= max_tokens
        cost = sum(overhead + (stop - start) * lengths[start] for start, stop in cuts)
        full = plan_batches(lengths, 16, max_tokens)
        assert cost <= sum(overhead + (stop - start) * lengths[start] for start, stop in full) + 1e-9


def test_a_batch_cut_by_length_embeds_as_one_forward(cde_dir):
    engine = Engine(ContextualSentenceTransformer(cde_dir))
    context = engine.model_context
    texts = ["a " * (MAX_SEQ_LENGTH * 2)] + SHORT_DOCS[:6] + ["b"]
    whole = engine.embed(texts, "query", context)
    assert engine.forwards == 1
    engine.forward_overhead_tokens = 1.0
    cut = engine.embed(texts, "query", context)
    assert engine.forwards > 2  # the long text, the short ones and the shortest apart
    assert np.abs(cut.embeddings - whole.embeddings).max() <= 1e-5
    assert cut.tokens.tolist() == whole.tokens.tolist() and cut.truncated.tolist() == whole.truncated.tolist()


def test_the_cost_of_a_forward_is_measured(cde_dir):
    engine = Engine(ContextualSentenceTransformer(cde_dir), max_batch_size=4)
    overhead = engine.measure_forward_overhead(engine.forward_probes(), engine.model_context)
    assert overhead is not None and overhead >= 1.0 and engine.forward_overhead_tokens == overhead
    one, many = engine.forward_probes()
    assert len(one) == 1 and len(many) == 4  # at most a batch
    narrow = Engine(ContextualSentenceTransformer(cde_dir), max_batch_tokens=5)
    assert narrow.forward_probes() is None  # no forward holds two probe texts: nothing to measure
    assert narrow.measure_forward_overhead(None, narrow.model_context) is None
    assert narrow.forward_overhead_tokens is None


@pytest.mark.parametrize("overhead", [None, 1.0])
def test_the_engine_s_embeddings_are_those_of_its_former_forward_loop(cde_dir, overhead):
    """The engine runs the forward loop encode_fast runs (cde_st.modules.forward_loop): its embeddings are bit for
    bit those of the loop it had of its own, kept here as it was."""
    import torch
    from sentence_transformers.util import batch_to_device

    engine = Engine(ContextualSentenceTransformer(cde_dir), max_batch_size=3, max_batch_tokens=60)
    engine.forward_overhead_tokens = overhead
    texts = ["a " * (MAX_SEQ_LENGTH * 2)] + SHORT_DOCS + ["b"]
    parts = [engine.tokenize(texts[:4], "query"), engine.tokenize(texts[4:], "query")]
    got = engine.embed_tokens(parts, engine.model_context).embeddings
    expected = np.empty_like(got)
    with torch.inference_mode():  # the engine's former loop, with the context it has just activated
        for positions, features in forward_features(engine.model, parts, 3, 60, overhead):
            features = batch_to_device(features, engine.model.device)
            expected[positions] = engine.model(features)["sentence_embedding"].float().cpu().numpy()
    assert np.abs(got - expected).max() == 0.0
    engine.close()
