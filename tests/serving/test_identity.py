"""Which model a stored context belongs to (cde_st/serving/identity.py): the identity follows the weights and the
configuration, not the dtype the model is served in."""

from __future__ import annotations

import torch

from cde_st.serving.identity import model_identity


def test_identity_follows_weights_and_config_not_dtype(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    identity = model_identity(model)
    assert identity == model_identity(model) and len(identity) == 16
    assert model_identity(make_tiny_cde(context_size=4, seed=1)) != identity  # other weights
    assert model_identity(make_tiny_cde(context_size=8)) != identity  # another configuration
    with torch.no_grad():
        model.contextual_module.null_vector.add_(1.0)  # one tensor changed in every sampled value
    assert model_identity(model) != identity


def test_the_identity_is_read_as_float32(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    before = model_identity(model)
    as_double = model_identity(model.to(torch.float64))
    assert as_double == before  # float32 values widened exactly: the same identity
