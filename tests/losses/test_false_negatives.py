"""The guide's false-negative rule and what the guide reads (cde_st/losses/false_negatives.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cde_st.losses import false_negative_mask
from cde_st.losses.false_negatives import _decode_texts
from cde_st.prompts import DOCUMENT_PROMPT


def test_false_negative_mask_hand_built():
    # guide embeddings: queries 0,1,2; docs 0,1,2 where doc 2 duplicates doc 0 and doc 1 is a near-miss of q0
    gq = F.normalize(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.1]]), dim=-1)
    gd = F.normalize(torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.3, 0.0], [1.0, 0.0, 0.0]]), dim=-1)
    own = torch.arange(3)
    expected = torch.tensor([[False, False, True], [False, False, False], [True, False, False]])
    assert torch.equal(false_negative_mask(gq, gd, positive_index=own), expected)
    # a margin widens the rule: cos(q0, d1) = 0.949 >= 1 - 0.1 and cos(q2, d1) = 0.944 >= 0.995 - 0.1
    expected_margin = expected.clone()
    expected_margin[0, 1] = expected_margin[2, 1] = True
    assert torch.equal(false_negative_mask(gq, gd, margin=0.1, positive_index=own), expected_margin)
    # a huge margin removes every candidate but never the positive
    everything = false_negative_mask(gq, gd, margin=10.0, positive_index=own)
    assert torch.equal(everything, ~torch.eye(3, dtype=torch.bool))
    # explicit thresholds (same-side blocks): no positive column, nothing protected
    same_side = false_negative_mask(gq, gq, positive_scores=torch.full((3,), 0.99))
    assert torch.equal(same_side.diagonal(), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="positive_index or positive_scores"):
        false_negative_mask(gq, gd)


def test_guide_reads_the_text_without_prompt(make_tiny_cde):
    model = make_tiny_cde()
    features = model.preprocess(["Rain forms in clouds.", "A short one"], prompt=DOCUMENT_PROMPT)
    assert _decode_texts(features, model.tokenizer) == ["rain forms in clouds.", "a short one"]
    assert _decode_texts(model.preprocess(["No prompt here"]), model.tokenizer) == ["no prompt here"]
