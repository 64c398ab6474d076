"""The context of a training batch: sampled, truncated and trimmed first-stage inputs
(cde_st/losses/training_context.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sample_texts import TOPIC_DOCS

from cde_st import contextual_module
from cde_st.losses import batch_context
from cde_st.prompts import DOCUMENT_PROMPT

DOCS = TOPIC_DOCS


def test_batch_context_samples_truncates_and_trims(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    m = contextual_module(model)
    docs = model.preprocess(DOCS, prompt=DOCUMENT_PROMPT)
    small = batch_context(model.preprocess(DOCS[:3]), context_size=4)
    assert small["input_ids"].shape[0] == 3  # fewer documents than slots: all of them, the model null-pads
    a = batch_context(docs, context_size=4, seed=1)
    b = batch_context(docs, context_size=4, seed=1)
    c = batch_context(docs, context_size=4, seed=2)
    assert a["input_ids"].shape[0] == 4 and torch.equal(a["input_ids"], b["input_ids"])
    assert not torch.equal(a["input_ids"], c["input_ids"])
    rows = {tuple(r[m_.bool()].tolist()) for r, m_ in zip(a["input_ids"], a["attention_mask"])}
    every = {tuple(r[m_.bool()].tolist()) for r, m_ in zip(docs["input_ids"], docs["attention_mask"])}
    assert len(rows) == 4 and rows <= every  # without replacement, real documents
    cut = batch_context(docs, context_size=len(DOCS), max_length=8, end_token_id=m.tokenizer.sep_token_id)
    assert cut["input_ids"].shape == (len(DOCS), 8)
    # the cut rows end like the tokenizer's own truncation would end them
    direct = m.tokenizer([DOCUMENT_PROMPT + t for t in DOCS], padding=True, truncation=True, max_length=8)
    assert cut["input_ids"].tolist() == direct["input_ids"]
    assert cut["attention_mask"].tolist() == direct["attention_mask"]
    # trailing columns that are padding for every kept row are dropped
    features = model.preprocess(["a b", "a much much longer document here"])
    widths = features["attention_mask"].sum(1).tolist()
    padded = {k: F.pad(v, (0, 5)) for k, v in features.items() if k in ("input_ids", "attention_mask")}
    assert batch_context(padded, context_size=2)["input_ids"].shape[1] == max(widths)
    kept = [batch_context(padded, context_size=1, seed=s) for s in range(8)]
    assert {k["input_ids"].shape[1] for k in kept} == set(widths)  # each single kept row at its own width
