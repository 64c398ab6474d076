"""Two-stage gradient caching (cde_st/losses/gradient_cache.py): a cached loss gives the value and the gradients of
the uncached one and of the definition written out with plain autograd, for every attention mode, with hard
negatives, leave-one-out masks, sequence dropout and partial or empty contexts; chunks bound the rows per pass."""

from __future__ import annotations

import pytest
import torch
from loss_helpers import (
    ATTENTION_MODES,
    DUPLICATE,
    F32_TOL,
    F64_TOL,
    assert_same_gradients,
    copy_columns,
    gradients_of,
    make_columns,
    plain_model,
    reference_forward,
    reference_loss,
)

from cde_st import contextual_module
from cde_st.losses import FilteredInfoNCELoss, false_negative_mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("mode", sorted(ATTENTION_MODES))
def test_cached_gradients_equal_uncached_contextual(make_tiny_cde, tiny_guide, dtype, bidirectional, mode):
    model = make_tiny_cde(context_size=16, sequence_dropout=0.0, **ATTENTION_MODES[mode]).to(dtype)
    if model.contextual_module.gates is not None:
        with torch.no_grad():  # open the gates, so that the context (and the first stage) get gradients
            model.contextual_module.gates.uniform_(0.2, 0.8, generator=torch.Generator().manual_seed(0))
    model.train()
    columns = make_columns(model, negatives=True, duplicate=True)
    kwargs = dict(guide=tiny_guide, temperature=0.05, margin=0.05, bidirectional=bidirectional)
    direct = FilteredInfoNCELoss(model, **kwargs)
    cached = FilteredInfoNCELoss(model, mini_batch_size=5, context_mini_batch_size=3, **kwargs)
    value_d, grads_d = gradients_of(model, direct, columns)
    value_c, grads_c = gradients_of(model, cached, columns)
    assert any(n.startswith("0.first_stage.") for n in grads_d), "the first stage must receive gradients"
    assert any(n.startswith("0.second_stage.") for n in grads_d)
    assert "0.null_vector" in grads_d  # 12 documents in 16 slots: 4 null slots
    assert all(grads_d[n].abs().sum() > 0 for n in grads_d if n.startswith("0.first_stage.encoder.layer.1."))
    tol = F32_TOL if dtype == torch.float32 else F64_TOL
    torch.testing.assert_close(value_c, value_d, rtol=tol, atol=tol)
    assert_same_gradients(grads_d, grads_c, rtol=tol)

    # both equal the definition, computed with plain autograd end to end
    guide_reps = direct._guide_embeddings(copy_columns(columns))
    assert false_negative_mask(*guide_reps, positive_index=torch.arange(12))[2, DUPLICATE]
    model.zero_grad(set_to_none=True)
    reference = reference_loss(
        reference_forward(model, columns), guide=guide_reps, margin=0.05, temperature=0.05, bidirectional=bidirectional
    )
    reference.backward()
    grads_r = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(value_d, reference.detach(), rtol=tol, atol=tol)
    assert_same_gradients(grads_r, grads_c, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cached_gradients_equal_uncached_plain(tiny_bert_dir, tiny_guide, dtype):
    model = plain_model(tiny_bert_dir).to(dtype)
    model.train()
    columns = make_columns(model, negatives=True, duplicate=True)
    direct = FilteredInfoNCELoss(model, guide=tiny_guide, margin=0.05)
    cached = FilteredInfoNCELoss(model, guide=tiny_guide, margin=0.05, mini_batch_size=4)
    value_d, grads_d = gradients_of(model, direct, columns)
    value_c, grads_c = gradients_of(model, cached, columns)
    tol = F32_TOL if dtype == torch.float32 else F64_TOL
    torch.testing.assert_close(value_c, value_d, rtol=tol, atol=tol)
    assert_same_gradients(grads_d, grads_c, rtol=tol)
    model.zero_grad(set_to_none=True)
    guide_reps = direct._guide_embeddings(copy_columns(columns))
    reference_loss(reference_forward(model, columns), guide=guide_reps, margin=0.05).backward()
    grads_r = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    assert_same_gradients(grads_r, grads_c, rtol=tol)


def test_context_larger_batch_than_slots_cached_equals_uncached(make_tiny_cde):
    # 12 documents, 5 slots: the context is a seeded sample, the same in both modes
    model = make_tiny_cde(context_size=5, sequence_dropout=0.0)
    model.train()
    columns = make_columns(model)
    _, grads_d = gradients_of(model, FilteredInfoNCELoss(model, guide=False), columns)
    _, grads_c = gradients_of(model, FilteredInfoNCELoss(model, guide=False, mini_batch_size=4), columns)
    assert "0.null_vector" not in grads_d  # all 5 slots hold documents
    assert_same_gradients(grads_d, grads_c, rtol=F32_TOL)


@pytest.mark.parametrize("mode", ["joint", "joint-gate", "cached-gate-top-layer"])
def test_leave_one_out_cached_equals_uncached(make_tiny_cde, tiny_guide, mode):
    """leave_one_out hides each pair's own document (and its copy) from the pair; gradient caching replays the
    same per-row masks."""
    model = make_tiny_cde(context_size=16, sequence_dropout=0.0, **ATTENTION_MODES[mode]).to(torch.float64)
    if model.contextual_module.gates is not None:
        with torch.no_grad():
            model.contextual_module.gates.uniform_(0.2, 0.8, generator=torch.Generator().manual_seed(0))
    model.train()
    columns = make_columns(model, negatives=True, duplicate=True)
    direct = FilteredInfoNCELoss(model, guide=tiny_guide, leave_one_out=True)
    cached = FilteredInfoNCELoss(
        model, guide=tiny_guide, leave_one_out=True, mini_batch_size=5, context_mini_batch_size=3
    )
    _, mask = direct._context_features(model.contextual_module, dict(columns[1]))
    hidden = {(int(i), int(j)) for i, j in (~mask).nonzero()}
    assert hidden == {(i, i) for i in range(12)} | {(2, DUPLICATE), (DUPLICATE, 2)}
    value_d, grads_d = gradients_of(model, direct, columns)
    value_c, grads_c = gradients_of(model, cached, columns)
    value_p, grads_p = gradients_of(model, FilteredInfoNCELoss(model, guide=tiny_guide), columns)
    torch.testing.assert_close(value_c, value_d, rtol=F64_TOL, atol=F64_TOL)
    assert_same_gradients(grads_d, grads_c, rtol=F64_TOL)
    assert (value_p - value_d).abs() > 1e-6  # the masks change the loss


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
    value = loss(copy_columns(make_columns(model, negatives=True)), None)
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
        clean = model(make_columns(model)[0], context_vectors=context_vectors)["sentence_embedding"][:5]
    assert (clean - first_pass[0]).abs().max() > 1e-4


def test_eval_mode_returns_the_same_value_without_backward(make_tiny_cde, tiny_guide):
    model = make_tiny_cde(context_size=16, sequence_dropout=0.0)
    columns = make_columns(model, negatives=True)
    cached = FilteredInfoNCELoss(model, guide=tiny_guide, mini_batch_size=4)
    direct = FilteredInfoNCELoss(model, guide=tiny_guide)
    with torch.no_grad():
        a, b = cached(copy_columns(columns), None), direct(copy_columns(columns), None)
    assert not a.requires_grad
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    model.train()
    torch.testing.assert_close(direct(copy_columns(columns), None).detach(), b, rtol=1e-5, atol=1e-5)


def test_zero_context_model_trains_as_bi_encoder(make_tiny_cde):
    model = make_tiny_cde(context_size=0)
    model.train()
    columns = make_columns(model)
    _, grads_d = gradients_of(model, FilteredInfoNCELoss(model, guide=False), columns)
    _, grads_c = gradients_of(model, FilteredInfoNCELoss(model, guide=False, mini_batch_size=4), columns)
    assert not any(n.startswith("0.first_stage.") for n in grads_d)
    assert_same_gradients(grads_d, grads_c, rtol=F32_TOL)


@pytest.mark.parametrize("target", ["empty", "partial"])
def test_context_dropout_cached_equals_uncached(make_tiny_cde, tiny_guide, target):
    model = make_tiny_cde(context_size=16, sequence_dropout=0.0, context_gate=True)
    with torch.no_grad():
        model.contextual_module.gates.fill_(0.5)
    model.train()
    columns = make_columns(model)
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
    value_d, grads_d = gradients_of(model, direct, columns)
    value_c, grads_c = gradients_of(model, cached, columns)
    torch.testing.assert_close(value_c, value_d, rtol=F32_TOL, atol=F32_TOL)
    assert_same_gradients(grads_d, grads_c, rtol=F32_TOL)
    first_stage = [n for n in grads_d if n.startswith("0.first_stage.")]
    assert bool(first_stage) == (target == "partial")  # an empty context never reaches the first stage
