"""FilteredInfoNCELoss (cde_st/losses/filtered_infonce.py, gradient_cache.py): filtering, two-stage gradient caching,
Matryoshka, trainer integration, guide isolation."""

from __future__ import annotations

import gzip
import json
import random
import textwrap

import pytest
import torch
import torch.nn.functional as F
from sample_texts import TOPIC_DOCS
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import (
    GISTEmbedLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

from cde_st import contextual_module
from cde_st.losses import FilteredInfoNCELoss, batch_context, false_negative_mask
from cde_st.prompts import DOCUMENT_PROMPT, QUERY_PROMPT

QUERIES = [
    "how do glaciers move",
    "what causes rain",
    "who painted the mona lisa",
    "why do stocks fall",
    "how do vaccines work",
    "what is photosynthesis",
    "when did the roman empire end",
    "how do bees make honey",
    "what is a black hole",
    "how does a compiler work",
    "why is the sky blue",
    "what do pandas eat",
]
DOCS = TOPIC_DOCS
HARD_NEGATIVES = [DOCS[(i + 5) % len(DOCS)] + " Unrelated note." for i in range(len(DOCS))]
# Duplicate tests: row 5 becomes a paraphrase of row 2's query, with row 2's document as its positive.
DUPLICATE = 5
DUPLICATE_QUERY = "who was the painter of the mona lisa"


# Gradient comparisons are relative to each parameter's largest gradient entry. float32 sums over thousands of
# tokens in a different order per chunking (~1e-5 relative; up to 1.5e-5 for the token-type embedding of the tiny
# encoder's character-level rows, which sums over every token); float64 shows the computations are the same.
F32_TOL, F64_TOL = 2e-5, 1e-9


# ---------------------------------------------------------------- helpers
@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's spinning makes each
    small op ~100x slower; restore the setting for other test modules."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _columns(model, n=12, negatives=False, duplicate=False, prompts=True):
    queries, docs = list(QUERIES[:n]), list(DOCS[:n])
    if duplicate:
        queries[DUPLICATE], docs[DUPLICATE] = DUPLICATE_QUERY, docs[2]
    q_prompt, d_prompt = (QUERY_PROMPT, DOCUMENT_PROMPT) if prompts else (None, None)
    columns = [model.preprocess(queries, prompt=q_prompt), model.preprocess(docs, prompt=d_prompt)]
    if negatives:
        columns.append(model.preprocess(HARD_NEGATIVES[:n], prompt=d_prompt))
    return columns


def _copies(columns):
    return [dict(c) for c in columns]


def _gradients(model, loss, columns):
    model.zero_grad(set_to_none=True)
    value = loss(_copies(columns), None)
    value.backward()
    return value.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_gradients(reference, other, rtol):
    """Every parameter's gradient agrees: ||a - b|| <= rtol * (||b|| + ||all gradients||). The second term is a
    floor for parameters whose true gradient is ~0 (attention key biases), where only rounding noise remains."""
    assert set(reference) == set(other)
    total = torch.sqrt(sum(g.double().norm() ** 2 for g in reference.values()))
    for name, grad in reference.items():
        error = (other[name].double() - grad.double()).norm()
        allowed = rtol * (grad.double().norm() + total)
        assert error <= allowed, f"{name}: gradient error {error:.2e} > {allowed:.2e} (norm {grad.norm():.2e})"


def _plain_model(tiny_bert_dir, seed=0):
    torch.manual_seed(seed)
    transformer = Transformer(tiny_bert_dir, max_seq_length=64)
    return SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])


def _reference_loss(reps, guide=None, margin=0.0, temperature=0.02, bidirectional=False):
    """Filtered InfoNCE written out pair by pair, with plain autograd: the definition the loss must match.

    reps: [queries (B, d), positives (B, d), *hard negatives (B, d)]; guide: (guide_q, guide_d) or None.
    """
    q, d, *negs = reps
    batch = q.shape[0]

    def cos(a, b):
        return F.cosine_similarity(a, b, dim=0) / temperature

    def gscore(a, b):
        return float(F.cosine_similarity(a, b, dim=0))

    def removed(row, col, pos_score):  # the guide's rule, incl. the 1e-6 float tolerance of the loss
        return guide is not None and gscore(row, col) >= pos_score - margin - 1e-6

    losses = []
    for i in range(batch):
        pos = gscore(guide[0][i], guide[1][i]) if guide is not None else None
        logits = [cos(q[i], d[i])]
        for j in range(batch):
            if j != i and not (guide is not None and removed(guide[0][i], guide[1][j], pos)):
                logits.append(cos(q[i], d[j]))
        for neg in negs:
            logits.extend(cos(q[i], neg[j]) for j in range(batch))
        if bidirectional:
            for j in range(batch):
                if j == i:
                    continue
                if not (guide is not None and removed(guide[0][i], guide[0][j], pos)):
                    logits.append(cos(q[i], q[j]))
                if not (guide is not None and removed(guide[1][i], guide[0][j], pos)):
                    logits.append(cos(d[i], q[j]))
                if not (guide is not None and removed(guide[1][i], guide[1][j], pos)):
                    logits.append(cos(d[i], d[j]))
        logits = torch.stack(logits)
        losses.append(torch.logsumexp(logits, 0) - logits[0])
    return torch.stack(losses).mean()


def _reference_forward(model, columns, **kwargs):
    """Embed with plain autograd (the library's batch_context picks the same documents) -> reference loss."""
    model_kwargs = {}
    if hasattr(model, "contextual_module"):
        m = contextual_module(model)
        ids = columns[1]["input_ids"]
        assert ids.shape[0] <= m.context_size, "reference assumes the whole batch is the context"
        ctx = batch_context(columns[1], m.context_size, max_length=m.context_max_seq_length)
        model_kwargs["context_vectors"] = m.embed_context_features(ctx)
    reps = [model(dict(c), **model_kwargs)["sentence_embedding"] for c in columns]
    return reps


@pytest.fixture(scope="module")
def tiny_guide(tiny_bert_dir):
    """A frozen random tiny SentenceTransformer as guide (fast; arbitrary but deterministic scores)."""
    guide = _plain_model(tiny_bert_dir, seed=123)
    guide.eval()
    guide.requires_grad_(False)
    return guide


@pytest.fixture(scope="module")
def minilm_guide(minilm):
    from cde_st._defaults import load_default_surrogate

    return load_default_surrogate()


# ---------------------------------------------------------------- the filtering rule
def test_calculate_loss_masks_exactly_the_duplicate_logits(tiny_bert_dir):
    torch.manual_seed(0)
    batch, dim = 6, 8
    q, d, neg = torch.randn(batch, dim), torch.randn(batch, dim), torch.randn(batch, dim)
    d[4] = d[1]  # rows 1 and 4 share their positive document
    guide_q = F.normalize(torch.eye(batch, dim) + 0.01 * torch.randn(batch, dim), dim=-1)
    guide_q[4] = F.normalize(guide_q[1] + 0.01 * torch.randn(dim), dim=-1)  # q4 asks what q1 asks
    guide_d = guide_q.clone()
    guide_d[4] = guide_d[1]  # the guide sees the duplicate as the same document
    # temperature 1: every logit carries weight, so any extra or missing mask shows in the value
    loss = FilteredInfoNCELoss(_plain_model(tiny_bert_dir), guide=False, temperature=1.0)
    value = loss.calculate_loss([[q], [d], [neg]], guide_reps=[guide_q, guide_d])

    scores = F.normalize(q, dim=-1) @ F.normalize(torch.cat([d, neg]), dim=-1).T  # (6, 12)
    gscores = guide_q @ guide_d.T
    expected_mask = torch.zeros(batch, 2 * batch, dtype=torch.bool)
    expected_mask[4, 1] = True  # q4: d1 is the same text as its positive d4
    # q1: d4 duplicates d1 only if the guide scores it as high as q1's positive; it does (identical vectors)
    expected_mask[1, 4] = True
    assert torch.equal(false_negative_mask(guide_q, guide_d, positive_index=torch.arange(batch)), expected_mask[:, :6])
    assert gscores[1, 4] == gscores[1, 1]
    reference = F.cross_entropy(scores.masked_fill(expected_mask, -torch.inf), torch.arange(batch))
    torch.testing.assert_close(value, reference)
    # and only those: masking nothing, or one more logit, gives a different value
    assert not torch.isclose(value, F.cross_entropy(scores, torch.arange(batch)))
    more = expected_mask.clone()
    more[0, 3] = True
    assert not torch.isclose(value, F.cross_entropy(scores.masked_fill(more, -torch.inf), torch.arange(batch)))


def test_unfiltered_loss_equals_multiple_negatives_ranking_loss(tiny_bert_dir):
    model = _plain_model(tiny_bert_dir)
    columns = _columns(model, negatives=True)
    ours = FilteredInfoNCELoss(model, guide=False, temperature=0.02)
    mnrl = MultipleNegativesRankingLoss(model, scale=50.0)
    with torch.no_grad():
        torch.testing.assert_close(ours(_copies(columns), None), mnrl(_copies(columns), None), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_real_guide_removes_exactly_the_duplicate_positive(minilm_guide, tiny_bert_dir):
    model = _plain_model(tiny_bert_dir)
    columns = _columns(model, duplicate=True)
    loss = FilteredInfoNCELoss(model, guide=minilm_guide)
    guide_q, guide_d = loss._guide_embeddings(_copies(columns))
    mask = false_negative_mask(guide_q, guide_d, positive_index=torch.arange(len(QUERIES)))
    expected = torch.zeros_like(mask)
    expected[2, DUPLICATE] = expected[DUPLICATE, 2] = True
    assert torch.equal(mask, expected)
    with torch.no_grad():
        reps = _reference_forward(model, columns)
        torch.testing.assert_close(
            loss(_copies(columns), None), _reference_loss(reps, guide=(guide_q, guide_d)), rtol=1e-5, atol=1e-5
        )


# ---------------------------------------------------------------- the batch context
def test_context_is_seeded_by_batch_content(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    loss = FilteredInfoNCELoss(model, guide=False)
    m = contextual_module(model)
    docs = model.preprocess(DOCS, prompt=DOCUMENT_PROMPT)
    first = loss._context_features(m, docs)[0]
    again = loss._context_features(m, dict(docs))[0]
    other = loss._context_features(m, model.preprocess(DOCS[::-1], prompt=DOCUMENT_PROMPT))[0]
    assert torch.equal(first["input_ids"], again["input_ids"])
    assert first["input_ids"].shape[0] == 4
    assert not torch.equal(first["input_ids"], other["input_ids"])


# ---------------------------------------------------------------- gradient caching == no caching
ATTENTION_MODES = {
    "joint": {},
    "cached": {"context_attention": "cached"},
    "joint-gate": {"context_gate": True},
    "cached-gate": {"context_attention": "cached", "context_gate": True},
    "cached-gate-top-layer": {"context_attention": "cached", "context_gate": True, "context_layers": [-1]},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("mode", sorted(ATTENTION_MODES))
def test_cached_gradients_equal_uncached_contextual(make_tiny_cde, tiny_guide, dtype, bidirectional, mode):
    model = make_tiny_cde(context_size=16, sequence_dropout=0.0, **ATTENTION_MODES[mode]).to(dtype)
    if model.contextual_module.gates is not None:
        with torch.no_grad():  # open the gates, so that the context (and the first stage) get gradients
            model.contextual_module.gates.uniform_(0.2, 0.8, generator=torch.Generator().manual_seed(0))
    model.train()
    columns = _columns(model, negatives=True, duplicate=True)
    kwargs = dict(guide=tiny_guide, temperature=0.05, margin=0.05, bidirectional=bidirectional)
    direct = FilteredInfoNCELoss(model, **kwargs)
    cached = FilteredInfoNCELoss(model, mini_batch_size=5, context_mini_batch_size=3, **kwargs)
    value_d, grads_d = _gradients(model, direct, columns)
    value_c, grads_c = _gradients(model, cached, columns)
    assert any(n.startswith("0.first_stage.") for n in grads_d), "the first stage must receive gradients"
    assert any(n.startswith("0.second_stage.") for n in grads_d)
    assert "0.null_vector" in grads_d  # 12 documents in 16 slots: 4 null slots
    assert all(grads_d[n].abs().sum() > 0 for n in grads_d if n.startswith("0.first_stage.encoder.layer.1."))
    tol = F32_TOL if dtype == torch.float32 else F64_TOL
    torch.testing.assert_close(value_c, value_d, rtol=tol, atol=tol)
    _assert_same_gradients(grads_d, grads_c, rtol=tol)

    # both equal the definition, computed with plain autograd end to end
    guide_reps = direct._guide_embeddings(_copies(columns))
    assert false_negative_mask(*guide_reps, positive_index=torch.arange(12))[2, DUPLICATE]
    model.zero_grad(set_to_none=True)
    reference = _reference_loss(
        _reference_forward(model, columns), guide=guide_reps, margin=0.05, temperature=0.05, bidirectional=bidirectional
    )
    reference.backward()
    grads_r = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(value_d, reference.detach(), rtol=tol, atol=tol)
    _assert_same_gradients(grads_r, grads_c, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cached_gradients_equal_uncached_plain(tiny_bert_dir, tiny_guide, dtype):
    model = _plain_model(tiny_bert_dir).to(dtype)
    model.train()
    columns = _columns(model, negatives=True, duplicate=True)
    direct = FilteredInfoNCELoss(model, guide=tiny_guide, margin=0.05)
    cached = FilteredInfoNCELoss(model, guide=tiny_guide, margin=0.05, mini_batch_size=4)
    value_d, grads_d = _gradients(model, direct, columns)
    value_c, grads_c = _gradients(model, cached, columns)
    tol = F32_TOL if dtype == torch.float32 else F64_TOL
    torch.testing.assert_close(value_c, value_d, rtol=tol, atol=tol)
    _assert_same_gradients(grads_d, grads_c, rtol=tol)
    model.zero_grad(set_to_none=True)
    guide_reps = direct._guide_embeddings(_copies(columns))
    _reference_loss(_reference_forward(model, columns), guide=guide_reps, margin=0.05).backward()
    grads_r = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    _assert_same_gradients(grads_r, grads_c, rtol=tol)


def test_context_larger_batch_than_slots_cached_equals_uncached(make_tiny_cde):
    # 12 documents, 5 slots: the context is a seeded sample, the same in both modes
    model = make_tiny_cde(context_size=5, sequence_dropout=0.0)
    model.train()
    columns = _columns(model)
    _, grads_d = _gradients(model, FilteredInfoNCELoss(model, guide=False), columns)
    _, grads_c = _gradients(model, FilteredInfoNCELoss(model, guide=False, mini_batch_size=4), columns)
    assert "0.null_vector" not in grads_d  # all 5 slots hold documents
    _assert_same_gradients(grads_d, grads_c, rtol=F32_TOL)


@pytest.mark.parametrize("mode", ["joint", "joint-gate", "cached-gate-top-layer"])
def test_leave_one_out_cached_equals_uncached(make_tiny_cde, tiny_guide, mode):
    """leave_one_out hides each pair's own document (and its copy) from the pair; gradient caching replays the
    same per-row masks."""
    model = make_tiny_cde(context_size=16, sequence_dropout=0.0, **ATTENTION_MODES[mode]).to(torch.float64)
    if model.contextual_module.gates is not None:
        with torch.no_grad():
            model.contextual_module.gates.uniform_(0.2, 0.8, generator=torch.Generator().manual_seed(0))
    model.train()
    columns = _columns(model, negatives=True, duplicate=True)
    direct = FilteredInfoNCELoss(model, guide=tiny_guide, leave_one_out=True)
    cached = FilteredInfoNCELoss(
        model, guide=tiny_guide, leave_one_out=True, mini_batch_size=5, context_mini_batch_size=3
    )
    _, mask = direct._context_features(model.contextual_module, dict(columns[1]))
    hidden = {(int(i), int(j)) for i, j in (~mask).nonzero()}
    assert hidden == {(i, i) for i in range(12)} | {(2, DUPLICATE), (DUPLICATE, 2)}
    value_d, grads_d = _gradients(model, direct, columns)
    value_c, grads_c = _gradients(model, cached, columns)
    value_p, grads_p = _gradients(model, FilteredInfoNCELoss(model, guide=tiny_guide), columns)
    torch.testing.assert_close(value_c, value_d, rtol=F64_TOL, atol=F64_TOL)
    _assert_same_gradients(grads_d, grads_c, rtol=F64_TOL)
    assert (value_p - value_d).abs() > 1e-6  # the masks change the loss


def test_leave_one_out_follows_the_sampled_slots(make_tiny_cde):
    """12 documents in 5 slots: each slot is hidden from exactly the pair whose document it holds."""
    model = make_tiny_cde(context_size=5)
    loss = FilteredInfoNCELoss(model, guide=False, leave_one_out=True)
    docs = model.preprocess(DOCS[:12], prompt=DOCUMENT_PROMPT)
    context, mask = loss._context_features(model.contextual_module, dict(docs))
    assert mask.shape == (12, 5)
    width = context["input_ids"].shape[1]
    for s in range(5):
        owners = (docs["input_ids"][:, :width] == context["input_ids"][s]).all(dim=1)
        assert torch.equal(~mask[:, s], owners) and owners.sum() == 1


class _RecordingLoss(FilteredInfoNCELoss):
    """Records every second-stage chunk (pass, rows, output) and every first-stage chunk."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.second, self.first = [], []
        module = contextual_module(self.model)
        original = module.embed_context_features

        def recording(features):
            out = original(features)
            self.first.append((torch.is_grad_enabled(), features["input_ids"].shape[0], out.detach().clone()))
            return out

        module.embed_context_features = recording

    def embed_minibatch(self, sentence_feature, begin, end, with_grad, copy_random_state, random_state=None, **kw):
        reps, state = super().embed_minibatch(
            sentence_feature, begin, end, with_grad, copy_random_state, random_state, **kw
        )
        self.second.append((with_grad, end - begin, reps.detach().clone()))
        return reps, state


def test_replay_reproduces_first_pass_with_sequence_dropout(make_tiny_cde):
    model = make_tiny_cde(context_size=16, sequence_dropout=0.5)
    model.train()
    loss = _RecordingLoss(model, guide=False, mini_batch_size=5, context_mini_batch_size=4)
    value = loss(_copies(_columns(model, negatives=True)), None)
    value.backward()
    first_pass = [r for g, _, r in loss.second if not g]
    replay = [r for g, _, r in loss.second if g]
    assert len(first_pass) == len(replay) == 3 * 3  # 3 columns x ceil(12 / 5) chunks
    for a, b in zip(first_pass, replay):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # chunk sizes bound memory: never more rows than the mini-batch sizes
    assert max(n for _, n, _ in loss.second) <= 5
    assert max(n for _, n, _ in loss.first) <= 4
    m1_first = [r for g, _, r in loss.first if not g]
    m1_replay = [r for g, _, r in loss.first if g]
    assert len(m1_first) == len(m1_replay) == 3  # 12 documents in chunks of 4
    for a, b in zip(m1_first, m1_replay):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # the dropout is real: the same rows without sequence dropout give other embeddings
    model.eval()
    with torch.no_grad():
        context_vectors = torch.cat(m1_first)
        clean = model(_columns(model)[0], context_vectors=context_vectors)["sentence_embedding"][:5]
    assert (clean - first_pass[0]).abs().max() > 1e-4


def test_eval_mode_returns_the_same_value_without_backward(make_tiny_cde, tiny_guide):
    model = make_tiny_cde(context_size=16, sequence_dropout=0.0)
    columns = _columns(model, negatives=True)
    cached = FilteredInfoNCELoss(model, guide=tiny_guide, mini_batch_size=4)
    direct = FilteredInfoNCELoss(model, guide=tiny_guide)
    with torch.no_grad():
        a, b = cached(_copies(columns), None), direct(_copies(columns), None)
    assert not a.requires_grad
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    model.train()
    torch.testing.assert_close(direct(_copies(columns), None).detach(), b, rtol=1e-5, atol=1e-5)


def test_zero_context_model_trains_as_bi_encoder(make_tiny_cde):
    model = make_tiny_cde(context_size=0)
    model.train()
    columns = _columns(model)
    _, grads_d = _gradients(model, FilteredInfoNCELoss(model, guide=False), columns)
    _, grads_c = _gradients(model, FilteredInfoNCELoss(model, guide=False, mini_batch_size=4), columns)
    assert not any(n.startswith("0.first_stage.") for n in grads_d)
    _assert_same_gradients(grads_d, grads_c, rtol=F32_TOL)


def test_bad_inputs(make_tiny_cde):
    model = make_tiny_cde()
    loss = FilteredInfoNCELoss(model, guide=False)
    with pytest.raises(ValueError, match="expects"):
        loss([model.preprocess(QUERIES[:2])], None)
    with pytest.raises(ValueError, match="temperature"):
        FilteredInfoNCELoss(model, guide=False, temperature=0)
    with pytest.raises(ValueError, match="mini_batch_size"):
        FilteredInfoNCELoss(model, guide=False, mini_batch_size=0)
    with pytest.raises(ValueError, match="separate"):
        FilteredInfoNCELoss(model, guide=model)
    # A margin of 2 or more filters every negative (cosines lie in [-1, 1]); NaN filters none.
    for margin in (2.0, 10.0, float("nan"), float("inf"), -2.0):
        with pytest.raises(ValueError, match=r"margin must be a finite number in \(-2, 2\)"):
            FilteredInfoNCELoss(model, guide=False, margin=margin)
    FilteredInfoNCELoss(model, guide=False, margin=1.5)


def test_unprompted_document_column_warns_once(make_tiny_cde, caplog):
    model = make_tiny_cde()
    loss = FilteredInfoNCELoss(model, guide=False)
    with caplog.at_level("WARNING", logger="cde_st.losses.filtered_infonce"):
        for _ in range(2):
            with torch.no_grad():
                loss(_copies(_columns(model, n=4, prompts=False)), None)
        with torch.no_grad():  # a prefix written into the texts counts as the prompt
            FilteredInfoNCELoss(model, guide=False)(
                [model.preprocess(QUERIES[:4]), model.preprocess([DOCUMENT_PROMPT + d for d in DOCS[:4]])], None
            )
    assert sum("carries no prompt" in r.message for r in caplog.records) == 1


# ---------------------------------------------------------------- MatryoshkaLoss
@pytest.mark.parametrize("mini_batch_size", [None, 4])
def test_matryoshka_wrapping(make_tiny_cde, tiny_guide, mini_batch_size):
    model = make_tiny_cde(context_size=16, sequence_dropout=0.0)
    model.train()
    columns = _columns(model, negatives=True)
    dims, weights = (32, 16, 8), (1.0, 0.5, 0.25)
    inner = FilteredInfoNCELoss(model, guide=tiny_guide, mini_batch_size=mini_batch_size)
    guide_reps = inner._guide_embeddings(_copies(columns))
    loss = MatryoshkaLoss(model, inner, list(dims), matryoshka_weights=list(weights))
    value, grads = _gradients(model, loss, columns)

    model.zero_grad(set_to_none=True)
    reps = _reference_forward(model, columns)
    reference = sum(w * _reference_loss([r[:, :dim] for r in reps], guide=guide_reps) for dim, w in zip(dims, weights))
    reference.backward()
    grads_r = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(value, reference.detach(), rtol=1e-5, atol=1e-5)
    _assert_same_gradients(grads_r, grads, rtol=F32_TOL)


# ---------------------------------------------------------------- the guide stays out of training
def test_guide_is_frozen_and_not_a_parameter_of_the_loss(make_tiny_cde, minilm):
    model = make_tiny_cde()
    loss = FilteredInfoNCELoss(model)  # the default guide: offline all-MiniLM-L6-v2
    guide = loss.guide
    assert guide is not None and not guide.training
    assert not any(p.requires_grad for p in guide.parameters())
    guide_ids = {id(p) for p in guide.parameters()}
    assert not guide_ids & {id(p) for p in loss.parameters()}
    # the check can fail: ST's GISTEmbedLoss registers its guide, whose parameters then reach the optimizer
    assert guide_ids & {id(p) for p in GISTEmbedLoss(model, guide).parameters()}
    assert "guide" not in dict(loss.named_children())
    loss.train()
    assert not guide.training
    assert FilteredInfoNCELoss(model, guide=False).guide is None
    assert FilteredInfoNCELoss(model, filter_false_negatives=False).guide is None
    config = loss.get_config_dict()
    assert config["filter_false_negatives"] is True and isinstance(config["guide"], str)
    json.dumps(config)  # the model card serialises it
    assert "Contextual Document Embeddings" in loss.citation


def _train_dataset(n):
    from datasets import Dataset

    return Dataset.from_dict({"anchor": QUERIES[:n], "positive": DOCS[:n]})


def test_trainer_contextual_cached_guide_untouched(make_tiny_cde, minilm, tmp_path):
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    model = make_tiny_cde(context_size=8)
    loss = FilteredInfoNCELoss(model, mini_batch_size=4, context_mini_batch_size=4)
    guide = loss.guide
    guide_before = {n: p.detach().clone() for n, p in guide.named_parameters()}
    model_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=6,
        max_steps=3,
        learning_rate=1e-3,
        warmup_steps=0,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
        prompts={"anchor": QUERY_PROMPT, "positive": DOCUMENT_PROMPT},
    )
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=_train_dataset(12), loss=loss)
    trainer.train()
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert not optimised & {id(p) for p in guide.parameters()}
    assert {id(p) for p in model.parameters()} <= optimised
    for name, p in guide.named_parameters():
        assert torch.equal(p, guide_before[name]), name
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), model_before[n])}
    assert any(n.startswith("0.first_stage.") for n in changed) and any(
        n.startswith("0.second_stage.") for n in changed
    )
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(v == v and v > 0 for v in losses)


# ---------------------------------------------------------------- learning on real pairs
def _real_pairs(shared_data, n, seed=0):
    rows = []
    for name in ("wikiqa", "scifact_train", "snli_entailment"):
        with gzip.open(shared_data / "pairs" / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f)
    random.Random(seed).shuffle(rows)
    return [r["query"] for r in rows[:n]], [r["document"] for r in rows[:n]]


def _train_steps(model, loss, batches, steps, lr):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        queries, docs = batches[step % len(batches)]
        columns = [
            model.preprocess(queries, prompt=QUERY_PROMPT),
            model.preprocess(docs, prompt=DOCUMENT_PROMPT),
        ]
        optimizer.zero_grad()
        loss(columns, None).backward()
        optimizer.step()


def _eval_loss(model, loss, queries, docs):
    model.eval()
    with torch.no_grad():
        columns = [
            model.preprocess(queries, prompt=QUERY_PROMPT),
            model.preprocess(docs, prompt=DOCUMENT_PROMPT),
        ]
        return loss(columns, None).item()


def test_training_steps_reduce_the_loss_tiny(make_tiny_cde, shared_data):
    queries, docs = _real_pairs(shared_data, 32)
    model = make_tiny_cde(context_size=16, max_seq_length=48)
    loss = FilteredInfoNCELoss(model, guide=False, mini_batch_size=8)
    before = _eval_loss(model, loss, queries, docs)
    _train_steps(model, loss, [(queries, docs)], steps=8, lr=2e-3)
    after = _eval_loss(model, loss, queries, docs)
    assert after < before - 0.1, (before, after)


@pytest.mark.slow
def test_training_steps_reduce_held_out_loss_minilm(minilm, minilm_guide, shared_data):
    from cde_st import ContextualSentenceTransformer

    batch = 16
    queries, docs = _real_pairs(shared_data, batch * 5, seed=1)
    model = ContextualSentenceTransformer.from_encoder(minilm, context_size=batch, max_seq_length=32)
    loss = FilteredInfoNCELoss(model, guide=minilm_guide, mini_batch_size=8, context_mini_batch_size=8)
    held_q, held_d = queries[-batch:], docs[-batch:]
    before = _eval_loss(model, loss, held_q, held_d)
    batches = [(queries[i : i + batch], docs[i : i + batch]) for i in range(0, batch * 4, batch)]
    _train_steps(model, loss, batches, steps=4, lr=5e-5)
    after = _eval_loss(model, loss, held_q, held_d)
    assert after < before, (before, after)


# ---------------------------------------------------------------- context dropout (partial and empty contexts)
def test_context_dropout_draws_partial_and_empty_contexts(make_tiny_cde):
    model = make_tiny_cde(context_size=16)
    model.train()
    docs = model.preprocess(DOCS[:12], prompt=DOCUMENT_PROMPT)
    loss = FilteredInfoNCELoss(model, guide=False, context_dropout=0.5)
    sizes = [loss._context_features(model.contextual_module, docs)[0]["input_ids"].shape[0] for _ in range(60)]
    assert sizes.count(12) > 10 and 0 in sizes and all(0 <= s <= 12 for s in sizes)
    assert len(set(sizes)) > 5  # J' varies from batch to batch
    model.eval()  # never at evaluation
    assert loss._context_features(model.contextual_module, docs)[0]["input_ids"].shape[0] == 12
    with pytest.raises(ValueError, match="context_dropout"):
        FilteredInfoNCELoss(model, guide=False, context_dropout=1.5)


@pytest.mark.parametrize("target", ["empty", "partial"])
def test_context_dropout_cached_equals_uncached(make_tiny_cde, tiny_guide, target):
    model = make_tiny_cde(context_size=16, sequence_dropout=0.0, context_gate=True)
    with torch.no_grad():
        model.contextual_module.gates.fill_(0.5)
    model.train()
    columns = _columns(model)
    direct = FilteredInfoNCELoss(model, guide=tiny_guide, context_dropout=1.0)
    cached = FilteredInfoNCELoss(
        model, guide=tiny_guide, context_dropout=1.0, mini_batch_size=5, context_mini_batch_size=3
    )
    # find a call whose draw gives the wanted context size, then put both losses on it
    for call in range(200):
        direct._context_calls = call
        n = direct._context_features(model.contextual_module, dict(columns[1]))[0]["input_ids"].shape[0]
        if (n == 0) if target == "empty" else (0 < n < 12):
            break
    direct._context_calls = cached._context_calls = call
    value_d, grads_d = _gradients(model, direct, columns)
    value_c, grads_c = _gradients(model, cached, columns)
    torch.testing.assert_close(value_c, value_d, rtol=F32_TOL, atol=F32_TOL)
    _assert_same_gradients(grads_d, grads_c, rtol=F32_TOL)
    first_stage = [n for n in grads_d if n.startswith("0.first_stage.")]
    assert bool(first_stage) == (target == "partial")  # an empty context never reaches the first stage


@pytest.mark.parametrize("mini_batch_size", [None, 4])
def test_first_stage_runs_in_the_trainers_mixed_precision(make_tiny_cde, mini_batch_size):
    """accelerate (the trainer's bf16=True) autocasts the model's forward; the loss calls the first stage outside
    it, and must run it in the same precision, in the first pass and in the replay."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    model = make_tiny_cde(context_size=16)
    model.train()
    dtypes = []
    # a projection inside the first stage (its output LayerNorm runs in float32 under autocast either way)
    hook = model.contextual_module.first_stage.encoder.layer[0].attention.self.query.register_forward_hook(
        lambda module, args, output: dtypes.append(output.dtype)
    )
    AcceleratorState._reset_state(reset_partial_state=True)  # an earlier trainer test may have set one up
    try:
        prepared = Accelerator(mixed_precision="bf16", cpu=True).prepare(model)
        loss = FilteredInfoNCELoss(prepared, guide=False, mini_batch_size=mini_batch_size)
        loss(_columns(model), None).backward()
    finally:
        hook.remove()
        AcceleratorState._reset_state(reset_partial_state=True)
    assert len(dtypes) == (1 if mini_batch_size is None else 6)  # cached: 3 chunks of 4 (12 docs), replayed
    assert set(dtypes) == {torch.bfloat16}
    assert model.contextual_module.first_stage.embeddings.word_embeddings.weight.grad is not None


@pytest.mark.slow
def test_docstring_example_trains_as_written(minilm, tmp_path, monkeypatch):
    """The class docstring's example runs as written (offline MiniLM, one step) and changes the weights."""
    doc = FilteredInfoNCELoss.__doc__
    example = textwrap.dedent(doc[doc.index("Example:\n        ::\n") + len("Example:\n        ::\n") :])
    monkeypatch.chdir(tmp_path)  # the example writes its output_dir where it runs
    namespace = {"__name__": "__main__"}
    exec(compile(example, "FilteredInfoNCELoss example", "exec"), namespace)
    assert namespace["trainer"].state.global_step == 1
    assert namespace["loss"].guide is not None  # the default guide was loaded
