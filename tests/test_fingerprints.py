"""The one model fingerprint (cde_st/fingerprints.py): it follows the weights and the configuration, not the dtype
the model is served in; with or without the context; and it is the value folders written before it recorded."""

from __future__ import annotations

import torch

from cde_st.fingerprints import model_fingerprint

TEXTS = ["rain falls", "stocks fell", "cats sleep", "tea leaves"]


def test_the_fingerprint_follows_weights_and_config_not_dtype(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    fingerprint = model_fingerprint(model)
    assert fingerprint == model_fingerprint(model) and len(fingerprint) == 16
    assert model_fingerprint(make_tiny_cde(context_size=4, seed=1)) != fingerprint  # other weights
    assert model_fingerprint(make_tiny_cde(context_size=8)) != fingerprint  # another configuration
    with torch.no_grad():
        model.contextual_module.null_vector.add_(1.0)  # one tensor changed in every sampled value
    assert model_fingerprint(model) != fingerprint


def test_the_fingerprint_is_read_as_float32(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    before = model_fingerprint(model)
    assert model_fingerprint(model.to(torch.float64)) == before  # float32 values widened exactly


def test_without_the_context_it_ignores_the_context_and_puts_it_back(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    bare = model_fingerprint(model)
    info = model.set_context(TEXTS, seed=0)
    assert model_fingerprint(model) != bare  # the active context is in the module config
    assert model_fingerprint(model, with_context=False) == bare
    assert model.contextual_module.context_info.fingerprint == info.fingerprint  # the context was put back


def test_the_values_stored_folders_recorded_still_verify(make_tiny_cde):
    """Manifests (``model.identity``), served context files (``model_identity``) and vector-store records hold the
    values the rules before this module computed: serving's ``model_identity`` (the model as loaded) and the corpus
    tool's ``model_fingerprint`` (no context). These are what they gave for this tiny model; a changed rule would
    make every stored folder refuse its own model."""
    model = make_tiny_cde(context_size=4)
    assert model_fingerprint(model) == model_fingerprint(model, with_context=False) == "97cb0b51464ab903"
    # A stored folder records its context as vectors, so the sample a seed picks does not enter its fingerprint;
    # here the context is sampled, and the value follows the one sampling rule (bottom-k since 2026-12-02).
    model.set_context(TEXTS, seed=0)
    assert model_fingerprint(model) == "6aa007eddd98c51d"
    assert model_fingerprint(model, with_context=False) == "97cb0b51464ab903"
