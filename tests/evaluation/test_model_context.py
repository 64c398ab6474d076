"""Setting J documents as the model's context: J equal to the slots and fewer agree."""

from __future__ import annotations

import numpy as np
import pytest
from evaluation_helpers import (
    TOPICS,
)


def test_full_and_partial_context_paths_agree(make_tiny_cde):
    """J = slots goes through set_context(texts), J < slots through first-stage vectors: same documents and
    prompt must give the same context either way."""
    from cde_st import contextual_module, set_context
    from cde_st.evaluation.model_context import set_model_context

    model = make_tiny_cde(context_size=8)
    docs = [f"{TOPICS[i % 4]} context {i}" for i in range(8)]
    probe = ["what falls from clouds?", "a cat"]
    info = set_model_context(model, docs, seed=0, prompt="p: ")
    assert info.size == 8 and model.context_info is info
    full = model.encode(probe, prompt="")
    vectors = contextual_module(model).embed_context_texts(["p: " + d for d in docs])
    set_context(model, vectors)
    np.testing.assert_allclose(model.encode(probe, prompt=""), full, atol=1e-5)
    partial = set_model_context(model, docs[:3], seed=0, prompt="p: ")
    assert partial.size == 3  # the other 5 slots hold the null vector
    assert not np.allclose(model.encode(probe, prompt=""), full, atol=1e-3)
    with pytest.raises(ValueError, match="exceeds the model's 8 context slots"):
        set_model_context(model, docs + ["one more"], seed=0, prompt="")
