"""Hard-negative mining with a contextual model: cached embeddings belong to the context (and weights) they were
made with."""

from __future__ import annotations

import pytest

TEXTS = [f"passage {i} about {topic}" for i, topic in enumerate(["rain", "stocks", "cats", "tea", "mars", "ice"] * 2)]


def _pairs():
    from datasets import Dataset

    return Dataset.from_dict({"anchor": [f"what about {t}" for t in TEXTS], "positive": TEXTS})


def _mine(mine, model, **kwargs):
    result = mine(
        _pairs(), model, num_negatives=3, output_format="n-tuple", output_scores=True, verbose=False, **kwargs
    )
    return list(result["scores"])


@pytest.mark.parametrize("route", ["cde_st", "sentence_transformers"])
def test_cached_embeddings_are_keyed_by_the_context(make_tiny_cde, tmp_path, route):
    import cde_st

    if route == "cde_st":
        mine = cde_st.mine_hard_negatives
    else:  # the function as sentence-transformers exports it, imported after cde_st
        from sentence_transformers.util import mine_hard_negatives as mine
    model = make_tiny_cde(context_size=4)
    cache = str(tmp_path / "cache")
    model.set_context(TEXTS[:6], seed=0)
    first = _mine(mine, model, cache_folder=cache)
    model.set_context(TEXTS[6:], seed=1)
    uncached = _mine(mine, model)
    assert uncached != first  # the other context gives other embeddings, so other scores
    assert _mine(mine, model, cache_folder=cache) == uncached  # not the first context's cached embeddings
    model.set_context(TEXTS[:6], seed=0)
    assert _mine(mine, model, cache_folder=cache) == first  # the first context's cache is still used


def test_cached_embeddings_are_keyed_by_the_weights(make_tiny_cde, tmp_path):
    import torch

    import cde_st

    model = make_tiny_cde(context_size=4)
    cache = str(tmp_path / "cache")
    model.set_context(TEXTS, seed=0)
    first = cde_st.mine_hard_negatives(_pairs(), model, cache_folder=cache, verbose=False, output_scores=True)
    with torch.no_grad():
        for p in model.contextual_module.second_stage.parameters():
            p.mul_(1.1)
    again = cde_st.mine_hard_negatives(_pairs(), model, cache_folder=cache, verbose=False, output_scores=True)
    fresh = cde_st.mine_hard_negatives(_pairs(), model, verbose=False, output_scores=True)
    assert list(again["scores"]) == list(fresh["scores"]) != list(first["scores"])
