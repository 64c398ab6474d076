"""Hard-negative mining with a contextual model: cached embeddings belong to the context (and weights) they were
made with."""

from __future__ import annotations

import pytest
from preloaded_python import run_python

TEXTS = [f"passage {i} about {topic}" for i, topic in enumerate(["rain", "stocks", "cats", "tea", "mars", "ice"] * 2)]


def _pairs():
    from datasets import Dataset

    return Dataset.from_dict({"anchor": [f"what about {t}" for t in TEXTS], "positive": TEXTS})


def _mine(mine, model, **kwargs):
    result = mine(
        _pairs(), model, num_negatives=3, output_format="n-tuple", output_scores=True, verbose=False, **kwargs
    )
    return list(result["scores"])


def test_cached_embeddings_are_keyed_by_the_context(make_tiny_cde, tmp_path):
    import warnings

    import cde_st
    from cde_st.hard_negatives import ContextCacheKeyWarning

    model = make_tiny_cde(context_size=4)
    cache = str(tmp_path / "cache")
    model.set_context(TEXTS[:6], seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ContextCacheKeyWarning)  # the keyed route is silent
        first = _mine(cde_st.mine_hard_negatives, model, cache_folder=cache)
        model.set_context(TEXTS[6:], seed=1)
        uncached = _mine(cde_st.mine_hard_negatives, model)
        assert uncached != first  # the other context gives other embeddings, so other scores
        # not the first context's cached embeddings
        assert _mine(cde_st.mine_hard_negatives, model, cache_folder=cache) == uncached
        model.set_context(TEXTS[:6], seed=0)
        assert _mine(cde_st.mine_hard_negatives, model, cache_folder=cache) == first  # the first cache is still used


def test_import_leaves_sentence_transformers_function_in_place():
    code = "import sentence_transformers.util as u, cde_st; print(u.mine_hard_negatives.__module__)"
    run = run_python(["-c", code])
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "sentence_transformers.util.hard_negatives"


def test_plain_function_warns_when_its_cache_would_ignore_the_context(make_tiny_cde, tmp_path):
    from sentence_transformers.util import mine_hard_negatives

    from cde_st.hard_negatives import ContextCacheKeyWarning

    model = make_tiny_cde(context_size=4)
    model.set_context(TEXTS[:6], seed=0)
    with pytest.warns(ContextCacheKeyWarning, match="cde_st.mine_hard_negatives") as caught:
        _mine(mine_hard_negatives, model, cache_folder=str(tmp_path / "cache"))
    assert all(w.filename == __file__ for w in caught if w.category is ContextCacheKeyWarning)  # the user's line


def test_plain_function_without_a_cache_or_with_a_plain_model_does_not_warn(make_tiny_cde, tiny_bert_dir, tmp_path):
    import warnings

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from cde_st.hard_negatives import ContextCacheKeyWarning

    model = make_tiny_cde(context_size=4)
    model.set_context(TEXTS[:6], seed=0)
    plain = SentenceTransformer(tiny_bert_dir, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ContextCacheKeyWarning)
        _mine(mine_hard_negatives, model)  # no cache: nothing can be read back
        _mine(mine_hard_negatives, plain, cache_folder=str(tmp_path / "cache"))
        model.model_card_data.base_model  # noqa: B018 - any other reader of the name


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
