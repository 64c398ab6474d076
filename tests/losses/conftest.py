"""Fixtures of the loss tests: one thread per test module, and the guide models."""

from __future__ import annotations

import pytest
import torch
from loss_helpers import plain_model


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's spinning makes each
    small op ~100x slower; restore the setting for other test modules."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_guide(tiny_bert_dir):
    """A frozen random tiny SentenceTransformer as guide (fast; arbitrary but deterministic scores)."""
    guide = plain_model(tiny_bert_dir, seed=123)
    guide.eval()
    guide.requires_grad_(False)
    return guide


@pytest.fixture(scope="module")
def minilm_guide(minilm):
    from cde_st.defaults import load_default_surrogate

    return load_default_surrogate()
