"""cde_st.modules.context_lifecycle: setting, re-embedding and reading a module's active context."""

from __future__ import annotations

import warnings

import pytest
import torch
from sample_texts import TOPIC_DOCS

from cde_st.modules.context_lifecycle import (
    activate_context,
    context_of_call,
    refresh_module_context,
    set_module_context,
)


def test_a_set_context_is_active_and_a_changed_first_stage_re_embeds_it(make_tiny_cde):
    module = make_tiny_cde(context_size=4).contextual_module
    info = set_module_context(module, TOPIC_DOCS, 0, None, 2, False)
    vectors = module.context_vectors.clone()
    assert module.context_info is info and vectors.shape == (4, module.hidden_size)
    assert not refresh_module_context(module)  # the weights it was embedded with: nothing to do
    with torch.no_grad():
        next(module.first_stage.parameters()).add_(0.1)
    assert refresh_module_context(module)
    assert module.context_info is info and not torch.allclose(module.context_vectors, vectors)
    assert module.context_cache.nbytes() == 0  # a new context: no keys/values of the old one
    activate_context(module, None, None, None)
    assert module.context_vectors is None and module.context_info is None


def test_the_context_one_forward_reads(make_tiny_cde):
    module = make_tiny_cde(context_size=4).contextual_module
    given = torch.randn(3, module.hidden_size)
    vectors, checked = context_of_call(module, given)
    assert torch.equal(vectors, given) and not checked  # given vectors: no weights compared
    with pytest.raises(ValueError):
        context_of_call(module, torch.randn(5, module.hidden_size))  # more rows than J slots
    module.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no context while training: the null context, without a warning
        vectors, checked = context_of_call(module, None)
    assert vectors.shape == (0, module.hidden_size) and not checked
    module.eval()
    set_module_context(module, TOPIC_DOCS, 0, None, 2, False)
    vectors, checked = context_of_call(module, None)
    assert torch.equal(vectors, module.context_vectors) and checked  # the first forward of a call compares
