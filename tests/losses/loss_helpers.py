"""Shared pieces of the loss tests: the (query, document) rows, the gradient comparison and the filtered InfoNCE
written out pair by pair (the definition the loss must match)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sample_texts import TOPIC_DOCS
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

from cde_st import contextual_module
from cde_st.losses import batch_context
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


ATTENTION_MODES = {
    "joint": {},
    "cached": {"context_attention": "cached"},
    "joint-gate": {"context_gate": True},
    "cached-gate": {"context_attention": "cached", "context_gate": True},
    "cached-gate-top-layer": {"context_attention": "cached", "context_gate": True, "context_layers": [-1]},
}


def make_columns(model, n=12, negatives=False, duplicate=False, prompts=True):
    queries, docs = list(QUERIES[:n]), list(DOCS[:n])
    if duplicate:
        queries[DUPLICATE], docs[DUPLICATE] = DUPLICATE_QUERY, docs[2]
    q_prompt, d_prompt = (QUERY_PROMPT, DOCUMENT_PROMPT) if prompts else (None, None)
    columns = [model.preprocess(queries, prompt=q_prompt), model.preprocess(docs, prompt=d_prompt)]
    if negatives:
        columns.append(model.preprocess(HARD_NEGATIVES[:n], prompt=d_prompt))
    return columns


def copy_columns(columns):
    return [dict(c) for c in columns]


def gradients_of(model, loss, columns):
    model.zero_grad(set_to_none=True)
    value = loss(copy_columns(columns), None)
    value.backward()
    return value.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(reference, other, rtol):
    """Every parameter's gradient agrees: ||a - b|| <= rtol * (||b|| + ||all gradients||). The second term is a
    floor for parameters whose true gradient is ~0 (attention key biases), where only rounding noise remains."""
    assert set(reference) == set(other)
    total = torch.sqrt(sum(g.double().norm() ** 2 for g in reference.values()))
    for name, grad in reference.items():
        error = (other[name].double() - grad.double()).norm()
        allowed = rtol * (grad.double().norm() + total)
        assert error <= allowed, f"{name}: gradient error {error:.2e} > {allowed:.2e} (norm {grad.norm():.2e})"


def plain_model(tiny_bert_dir, seed=0):
    torch.manual_seed(seed)
    transformer = Transformer(tiny_bert_dir, max_seq_length=64)
    return SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])


def reference_loss(reps, guide=None, margin=0.0, temperature=0.02, bidirectional=False):
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


def reference_forward(model, columns, **kwargs):
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
