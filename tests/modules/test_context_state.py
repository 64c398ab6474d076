"""The active context and the cached context keys/values never go stale, however the weights change,
and the context hook accepts or clearly refuses every input (J = 0, differentiable forwards, odd arguments)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from cde_st.context import sample_context

DOCS = [f"document {i} about topic {i % 3} with words {' '.join(str(j) for j in range(i % 5))}" for i in range(12)]
QUERIES = ["topic 1 words", "document 4", "what is topic 2?"]


def _fresh(model, texts=DOCS, seed=0):
    """Embeddings of QUERIES with a context set anew from ``texts`` (the reference for a fresh context)."""
    model.set_context(texts, seed=seed)
    return model.encode(QUERIES, convert_to_tensor=True)


def _max_diff(a, b) -> float:
    return (torch.as_tensor(a) - torch.as_tensor(b)).abs().max().item()


def _fresh_forward(model, features):
    """The embeddings a direct forward gives with the context set again and no cached keys/values."""
    model.contextual_module.context_cache.drop()
    model.set_context(DOCS)
    with torch.inference_mode():
        return model(dict(features))["sentence_embedding"]


def _first_stage_params(model):
    return list(model.contextual_module.first_stage.parameters())


def _second_stage_params(model):
    return list(model.contextual_module.second_stage.parameters())


def _fused_adamw_step(params):
    for p in params:
        p.grad = torch.full_like(p, 0.5)
    torch.optim.AdamW(params, lr=1e-2, fused=True).step()


def _foreach_adamw_step(params):
    for p in params:
        p.grad = torch.full_like(p, 0.5)
    torch.optim.AdamW(params, lr=1e-2, foreach=True).step()


def _assign_data(params):  # EMA / weight averaging: a new tensor behind the parameter, no version bump
    for p in params:
        p.data = p.data * 0.8 + 0.05


def _data_inplace(params):  # `p.data` has its own version counter: in-place ops on it are invisible to p._version
    for p in params:
        p.data.add_(0.05)


def _add_no_grad(params):
    with torch.no_grad():
        for p in params:
            p.add_(0.05)


WRITE_PATHS = {
    "fused_adamw": _fused_adamw_step,
    "foreach_adamw": _foreach_adamw_step,
    "assign_data": _assign_data,
    "data_inplace": _data_inplace,
    "add_no_grad": _add_no_grad,
}


@pytest.mark.parametrize("path", sorted(WRITE_PATHS))
def test_first_stage_change_reembeds_the_context(make_tiny_cde, path):
    model = make_tiny_cde(context_size=4)
    model.set_context(DOCS, seed=0)
    before = model.encode(QUERIES, convert_to_tensor=True)
    WRITE_PATHS[path](_first_stage_params(model))  # model stays in eval mode throughout
    after = model.encode(QUERIES, convert_to_tensor=True)
    assert _max_diff(after, before) > 1e-5  # the change matters ...
    assert _max_diff(after, _fresh(model)) <= 1e-6  # ... and encode used the re-embedded context


def test_first_stage_load_state_dict_reembeds_the_context(make_tiny_cde):
    model, other = make_tiny_cde(context_size=4), make_tiny_cde(context_size=4, seed=1)
    model.set_context(DOCS)
    model.encode(QUERIES)
    model.contextual_module.first_stage.load_state_dict(other.contextual_module.first_stage.state_dict())
    assert _max_diff(model.encode(QUERIES, convert_to_tensor=True), _fresh(model)) <= 1e-6


@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("path", sorted(WRITE_PATHS))
def test_second_stage_change_drops_the_cached_keys_values(make_tiny_cde, path, gate):
    model = make_tiny_cde(context_size=4, context_attention="cached", context_gate=gate)
    if gate:  # zero gates ignore the context: open them so the cached keys/values matter
        model.contextual_module.gates.data.fill_(0.5)
    model.set_context(DOCS)
    before = model.encode(QUERIES, convert_to_tensor=True)
    WRITE_PATHS[path](_second_stage_params(model))
    after = model.encode(QUERIES, convert_to_tensor=True)
    assert _max_diff(after, before) > 1e-5
    module = model.contextual_module
    module.context_cache.drop()
    assert _max_diff(after, model.encode(QUERIES, convert_to_tensor=True)) <= 1e-6


def test_second_stage_load_state_dict_drops_the_cached_keys_values(make_tiny_cde):
    model = make_tiny_cde(context_size=4, context_attention="cached")
    other = make_tiny_cde(context_size=4, seed=1, context_attention="cached")
    model.set_context(DOCS)
    model.encode(QUERIES)
    model.contextual_module.second_stage.load_state_dict(other.contextual_module.second_stage.state_dict())
    after = model.encode(QUERIES, convert_to_tensor=True)
    model.contextual_module.context_cache.drop()
    assert _max_diff(after, model.encode(QUERIES, convert_to_tensor=True)) <= 1e-6


def test_edited_null_vector_reaches_the_cached_keys_values(make_tiny_cde):
    model = make_tiny_cde(context_size=8, context_attention="cached")
    model.set_context(torch.randn(3, model.get_embedding_dimension()))  # 3 vectors: 5 null slots
    before = model.encode(QUERIES, convert_to_tensor=True)
    with torch.no_grad():
        model.contextual_module.null_vector.data.mul_(3.0)
    after = model.encode(QUERIES, convert_to_tensor=True)
    assert _max_diff(after, before) > 1e-5
    model.contextual_module.context_cache.drop()
    assert _max_diff(after, model.encode(QUERIES, convert_to_tensor=True)) <= 1e-6


def test_evaluator_restore_does_not_mark_old_vectors_current(make_tiny_cde):
    """An evaluator snapshots the context, sets its own and restores the snapshot: vectors of the weights before
    a change must still be recognised as old."""
    model = make_tiny_cde(context_size=4)
    model.set_context(DOCS)
    module = model.contextual_module
    _fused_adamw_step(_first_stage_params(model))
    snapshot = module.context_snapshot()
    model.set_context(DOCS[::-1][:5], seed=3)  # the evaluator's context
    module.restore_context(snapshot)
    assert _max_diff(model.encode(QUERIES, convert_to_tensor=True), _fresh(model)) <= 1e-6


def test_save_after_a_fused_step_writes_the_current_context(make_tiny_cde, tmp_path):
    from cde_st import ContextualSentenceTransformer

    model = make_tiny_cde(context_size=4)
    model.set_context(DOCS)
    _fused_adamw_step(_first_stage_params(model))
    model.save(str(tmp_path / "m"))
    loaded = ContextualSentenceTransformer(str(tmp_path / "m"))
    expected = _fresh(model)
    assert _max_diff(loaded.encode(QUERIES, convert_to_tensor=True), expected) <= 1e-6


def test_readme_trainer_recipe_leaves_a_current_context(make_tiny_cde, tmp_path):
    """docs/training.md: SentenceTransformerTrainer with ClusteredBatchSampler and FilteredInfoNCELoss on a model
    with a context set; the trainer's default optimizer is fused AdamW where available."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from cde_st import ContextualSentenceTransformer
    from cde_st.batching import ClusteredBatchSampler
    from cde_st.losses import FilteredInfoNCELoss

    model = make_tiny_cde(context_size=4, context_attention="cached", context_gate=True)
    model.set_context(DOCS, seed=0)
    pairs = Dataset.from_dict({"query": [f"q {d}" for d in DOCS[:8]], "document": DOCS[:8], "domain": ["a"] * 8})
    rng = np.random.default_rng(0)
    embeddings = (rng.normal(size=(8, 16)).astype(np.float32), rng.normal(size=(8, 16)).astype(np.float32))
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        max_steps=2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        batch_sampler=partial(
            ClusteredBatchSampler, cluster_size=4, domain_dataset=pairs, embeddings=embeddings, cache=False
        ),
    )
    loss = FilteredInfoNCELoss(model, guide=False, temperature=0.05)
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=pairs.remove_columns("domain"), loss=loss
    )
    trainer.train()
    after = model.encode(QUERIES, convert_to_tensor=True)
    model.save(str(tmp_path / "saved"))
    loaded = ContextualSentenceTransformer(str(tmp_path / "saved"))
    loaded_out = loaded.encode(QUERIES, convert_to_tensor=True)
    expected = _fresh(model)
    assert _max_diff(after, expected) <= 1e-6
    assert _max_diff(loaded_out, expected) <= 1e-6


# ------------------------------------------------------------------ crashes on valid input
@pytest.mark.parametrize("mode", [dict(context_attention="cached"), dict(context_gate=True)])
def test_zero_context_slots_encode(make_tiny_cde, mode):
    model = make_tiny_cde(context_size=0, **mode)
    out = model.encode(QUERIES)
    plain = make_tiny_cde(context_size=0)
    assert out.shape == (3, model.get_embedding_dimension())
    assert np.abs(out - plain.encode(QUERIES)).max() <= 1e-5  # no context slot: the text-only encoder


def test_cached_train_mode_without_dropout_backpropagates(make_tiny_cde):
    model = make_tiny_cde(context_size=4, context_attention="cached", sequence_dropout=0.0)
    model.set_context(DOCS)
    model.train()
    features = model.preprocess(QUERIES)
    model(features)["sentence_embedding"].sum().backward()
    assert model.contextual_module.second_stage.encoder.layer[0].attention.self.key.weight.grad is not None


def test_gated_eval_forward_after_encode_backpropagates(make_tiny_cde):
    model = make_tiny_cde(context_size=4, context_attention="cached", context_gate=True)
    model.set_context(DOCS)
    model.encode(QUERIES)  # fills the cache under inference mode
    with torch.no_grad():
        expected = model(model.preprocess(QUERIES))["sentence_embedding"]
    out = model(model.preprocess(QUERIES))["sentence_embedding"]
    out.sum().backward()
    assert _max_diff(out.detach(), expected) <= 1e-5
    assert model.contextual_module.gates.grad is not None


# ------------------------------------------------------------------ the sample is a function of the set
def test_context_sample_does_not_depend_on_corpus_order():
    shuffled = list(np.random.default_rng(1).permutation(DOCS))
    assert sample_context(DOCS, 5, seed=2) == sample_context(shuffled, 5, seed=2)  # the documents and their order
    assert sample_context(DOCS, 30, seed=2) == sample_context(shuffled, 30, seed=2)


def test_set_context_does_not_depend_on_corpus_order(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    first = model.set_context(DOCS, seed=1).fingerprint
    assert model.set_context(DOCS[::-1], seed=1).fingerprint == first


# ------------------------------------------------------------------ odd arguments
def test_set_context_none_names_the_argument(make_tiny_cde):
    with pytest.raises(TypeError, match="clear_context"):
        make_tiny_cde().set_context(None)


def test_set_context_accepts_vectors_that_require_grad(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    vectors = torch.randn(3, model.get_embedding_dimension(), requires_grad=True)
    model.set_context(vectors)
    assert torch.equal(model.contextual_module.context_vectors, vectors.detach())


def test_set_context_accepts_a_numpy_array_of_strings(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    assert model.set_context(np.array(DOCS), seed=0) == model.set_context(DOCS, seed=0)


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_bad_seed_names_the_argument(make_tiny_cde, seed):
    with pytest.raises(ValueError, match="seed"):
        make_tiny_cde().set_context(DOCS, seed=seed)


def test_lone_surrogate_names_the_item(make_tiny_cde):
    model = make_tiny_cde()
    with pytest.raises(ValueError, match=r"item 1 .*surrogate"):
        model.set_context(["fine", "bad \ud800 text"])
    with pytest.raises(ValueError, match=r"item 0 .*surrogate"):
        model.encode(["\udfff"])


def test_direct_forward_after_an_in_place_edit_uses_the_current_context(make_tiny_cde):
    """No encode() (hence no eval()) between the edit and the forward: the parameters' version counters trigger the
    check."""
    model = make_tiny_cde(context_size=4, context_attention="cached")
    model.set_context(DOCS)
    features = model.preprocess(QUERIES)
    with torch.inference_mode():
        model(dict(features))
    _add_no_grad(_first_stage_params(model) + _second_stage_params(model))
    with torch.inference_mode():
        got = model(dict(features))["sentence_embedding"]
    expected = _fresh_forward(model, features)
    assert _max_diff(got, expected) <= 1e-6


@pytest.mark.parametrize("stage", ["first", "second"])
@pytest.mark.parametrize("path", sorted(WRITE_PATHS))
def test_direct_forward_after_any_weight_change_uses_the_current_context(make_tiny_cde, path, stage):
    """A forward called directly (no encode, the module left in eval mode) after any way of changing the weights,
    including those no version counter sees (a fused step, ``p.data`` edits), gives what a fresh context and fresh
    cached keys/values give."""
    model = make_tiny_cde(context_size=4, context_attention="cached")
    model.set_context(DOCS)
    features = model.preprocess(QUERIES)
    with torch.inference_mode():
        before = model(dict(features))["sentence_embedding"]
    params = _first_stage_params(model) if stage == "first" else _second_stage_params(model)
    WRITE_PATHS[path](params)
    with torch.inference_mode():
        got = model(dict(features))["sentence_embedding"]
    expected = _fresh_forward(model, features)
    assert _max_diff(before, expected) > 1e-5  # the change matters
    assert _max_diff(got, expected) <= 1e-6


def test_the_active_context_is_an_owned_object_outside_the_weights(make_tiny_cde):
    """The context lives in the module's ActiveContext: not in the weights file, yet it follows ``model.to``; a new
    context counts as a new generation (pool workers compare it), re-embedding the same one does not."""
    from sentence_transformers.base.modules import InputModule

    from cde_st import ContextualTransformer
    from cde_st.modules.context_state import ActiveContext

    assert ContextualTransformer.__bases__ == (InputModule,)  # no mixin shares the module's state
    model = make_tiny_cde(context_size=4)
    module = model.contextual_module
    assert isinstance(module.active_context, ActiveContext)
    model.set_context(DOCS)
    assert not any(key.startswith("active_context") for key in module.state_dict())
    generation = int(module.active_context.generation)
    _fused_adamw_step(_first_stage_params(model))
    assert module.refresh_context()  # the same context re-embedded: the same generation
    assert int(module.active_context.generation) == generation
    model.set_context(DOCS[:3])
    assert int(module.active_context.generation) == generation + 1
    model.to(torch.float64)
    assert module.context_vectors.dtype == torch.float64
