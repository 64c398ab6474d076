"""The evaluated model's name and revision in mteb results."""

from __future__ import annotations

import pytest
from evaluation_helpers import (
    TOPICS,
)

from cde_st.evaluation.local_tasks import load_local_task


def test_mteb_direct_results_are_keyed_by_the_context(data_dir, tmp_path, make_tiny_cde):
    """Issue: mteb stores a local model's results under ``no_model_name/available``, so after ``set_context`` a
    second ``mteb.evaluate`` returned the old score without encoding. ``mteb_model_meta`` gives a name/revision that
    includes the context fingerprint; set on the model card, two contexts never collide (the README snippet)."""
    import mteb

    from cde_st import set_context
    from cde_st.evaluation import mteb_model_meta

    model = make_tiny_cde(context_size=4)
    task = load_local_task(data_dir / "sts" / "tinysts")
    docs_a = [f"{TOPICS[i % 4]} context a{i}" for i in range(4)]
    docs_b = [f"something else entirely {i}" for i in range(4)]

    def score(cache) -> float:
        result = mteb.evaluate(model, task, cache=cache, show_progress_bar=False, co2_tracker=False)
        return result.task_results[0].scores["test"][0]["cosine_pearson"]  # spearman: too few pairs to move

    # what mteb does on its own: both contexts share one cache entry, the second score is the first one
    naive = mteb.ResultCache(cache_path=str(tmp_path / "naive"))
    set_context(model, docs_a)
    first = score(naive)
    set_context(model, docs_b)
    assert score(naive) == pytest.approx(first, abs=2e-6)  # cached (stored rounded), nothing encoded
    assert score(None) != pytest.approx(first, abs=1e-5)  # what context b really scores
    assert [p.parts[-3:-1] for p in (tmp_path / "naive").rglob("tinysts.json")] == [
        ("no_model_name__available", "no_revision_available")
    ]

    cache = mteb.ResultCache(cache_path=str(tmp_path / "keyed"))
    scores = {}
    for name, docs in (("a", docs_a), ("b", docs_b)):
        info = set_context(model, docs)
        meta = mteb_model_meta(model, name="test/tiny-cde")
        assert info.fingerprint in meta.revision and meta.name == "test/tiny-cde"
        model.model_card_data.model_name = meta.name
        model.model_card_data.base_model_revision = meta.revision
        scores[name] = score(cache)
        assert scores[name] == pytest.approx(score(None), abs=2e-6)  # not a cached score of the other context
    assert scores["a"] != pytest.approx(scores["b"], abs=1e-5)
    assert len(list((tmp_path / "keyed").rglob("tinysts.json"))) == 2
    model.clear_context()
    assert mteb_model_meta(model, name="test/tiny-cde").revision.endswith("ctx-none")
    assert mteb_model_meta(model).name == "test/tiny-cde"  # default: the model card name
