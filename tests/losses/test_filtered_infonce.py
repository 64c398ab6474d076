"""FilteredInfoNCELoss (cde_st/losses/filtered_infonce.py): filtering, the batch context, Matryoshka, trainer
integration, guide isolation, learning on real pairs, context dropout. Two-stage gradient caching: test_gradient_cache.py."""

from __future__ import annotations

import gzip
import json
import random
import textwrap

import pytest
import torch
import torch.nn.functional as F
from loss_helpers import (
    DOCS,
    DUPLICATE,
    F32_TOL,
    QUERIES,
    assert_same_gradients,
    copy_columns,
    gradients_of,
    make_columns,
    plain_model,
    reference_forward,
    reference_loss,
)
from sentence_transformers.sentence_transformer.losses import (
    GISTEmbedLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
)

from cde_st import contextual_module
from cde_st.losses import FilteredInfoNCELoss, false_negative_mask
from cde_st.prompts import DOCUMENT_PROMPT, QUERY_PROMPT


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
    loss = FilteredInfoNCELoss(plain_model(tiny_bert_dir), guide=False, temperature=1.0)
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
    model = plain_model(tiny_bert_dir)
    columns = make_columns(model, negatives=True)
    ours = FilteredInfoNCELoss(model, guide=False, temperature=0.02)
    mnrl = MultipleNegativesRankingLoss(model, scale=50.0)
    with torch.no_grad():
        torch.testing.assert_close(
            ours(copy_columns(columns), None), mnrl(copy_columns(columns), None), rtol=1e-5, atol=1e-5
        )


@pytest.mark.slow
def test_real_guide_removes_exactly_the_duplicate_positive(minilm_guide, tiny_bert_dir):
    model = plain_model(tiny_bert_dir)
    columns = make_columns(model, duplicate=True)
    loss = FilteredInfoNCELoss(model, guide=minilm_guide)
    guide_q, guide_d = loss._guide_embeddings(copy_columns(columns))
    mask = false_negative_mask(guide_q, guide_d, positive_index=torch.arange(len(QUERIES)))
    expected = torch.zeros_like(mask)
    expected[2, DUPLICATE] = expected[DUPLICATE, 2] = True
    assert torch.equal(mask, expected)
    with torch.no_grad():
        reps = reference_forward(model, columns)
        torch.testing.assert_close(
            loss(copy_columns(columns), None), reference_loss(reps, guide=(guide_q, guide_d)), rtol=1e-5, atol=1e-5
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
                loss(copy_columns(make_columns(model, n=4, prompts=False)), None)
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
    columns = make_columns(model, negatives=True)
    dims, weights = (32, 16, 8), (1.0, 0.5, 0.25)
    inner = FilteredInfoNCELoss(model, guide=tiny_guide, mini_batch_size=mini_batch_size)
    guide_reps = inner._guide_embeddings(copy_columns(columns))
    loss = MatryoshkaLoss(model, inner, list(dims), matryoshka_weights=list(weights))
    value, grads = gradients_of(model, loss, columns)

    model.zero_grad(set_to_none=True)
    reps = reference_forward(model, columns)
    reference = sum(w * reference_loss([r[:, :dim] for r in reps], guide=guide_reps) for dim, w in zip(dims, weights))
    reference.backward()
    grads_r = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(value, reference.detach(), rtol=1e-5, atol=1e-5)
    assert_same_gradients(grads_r, grads, rtol=F32_TOL)


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
        loss(make_columns(model), None).backward()
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
