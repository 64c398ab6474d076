"""cde_st.modules.forward_loop: each planned batch's features go to the model's device, one forward each, the
embeddings come out with their rows' positions; keywords reach every forward. encode_fast and the server run it
(their own before/after tests: tests/test_fast_encode.py, tests/serving/test_forward_plan.py)."""

from __future__ import annotations

import numpy as np
import torch

from cde_st import ContextualSentenceTransformer
from cde_st.modules.forward_loop import forward_batches

TEXTS = ["what causes rain", "cells", "a protein of the cell membrane", "zebra"]


def test_one_forward_per_batch_with_its_positions_and_keywords(tiny_bert_dir):
    torch.manual_seed(0)
    model = ContextualSentenceTransformer.from_encoder(  # a context that changes every embedding (no gate)
        tiny_bert_dir,
        context_size=4,
        max_seq_length=32,
        output_head="mlp",
        first_stage_residual=False,
        context_gate=False,
    ).eval()
    vectors = model.embed_context(TEXTS, seed=0)
    batches = [
        (np.array([2, 0]), model.preprocess([TEXTS[2], TEXTS[0]])),
        (np.array([1]), model.preprocess([TEXTS[1]])),
    ]
    with torch.inference_mode():
        out = list(forward_batches(model, batches, context_vectors=vectors))
        assert [positions.tolist() for positions, _ in out] == [[2, 0], [1]]
        for (_, features), (_, embeddings) in zip(batches, out):
            expected = model(features, context_vectors=vectors)["sentence_embedding"]
            assert torch.equal(embeddings, expected) and embeddings.device == model.device
        null = next(forward_batches(model, batches[:1]))[1]  # no context given: the model's (none: null context)
    assert not torch.allclose(null, out[0][1])  # the keyword reached the forward
