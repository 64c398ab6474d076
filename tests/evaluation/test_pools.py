"""Context pools per task type and the seeded, cached context plan of a run."""

from __future__ import annotations

import pytest
from evaluation_helpers import (
    TOPICS,
    loaded,
)

from cde_st.context import sample_context
from cde_st.evaluation.pools import ContextPlan, context_pool


def test_retrieval_pool_is_the_corpus_never_the_queries(data_dir):
    task = loaded(data_dir / "retrieval" / "tinyret")
    pool = context_pool(task, "default", "test")
    assert len(pool) == 12
    assert pool[0] == "Doc 0 apples are red fruit variant 0"  # title + text, as mteb feeds documents
    assert not any("QUERY-ONLY" in text for text in pool)


def test_classification_pool_is_the_train_texts(data_dir):
    task = loaded(data_dir / "classification" / "tinycls")
    pool = context_pool(task, "default", "test")
    assert len(pool) == 16 and all(t.startswith("TRAIN") for t in pool)
    # the train-split encode call of mteb gets the same pool (and, below, the same context)
    assert context_pool(task, "default", "train") == pool


def test_own_text_pools_for_sts_pairs_and_clustering(data_dir):
    sts = loaded(data_dir / "sts" / "tinysts")
    pool = context_pool(sts, "default", "test")
    rows = sts.dataset["test"]
    assert set(pool) == set(rows["sentence1"]) | set(rows["sentence2"])
    assert len(pool) == len(set(pool)) == 20  # both columns, the repeated pair counted once
    pair = loaded(data_dir / "pair_classification" / "tinypair")
    rows = pair.dataset["test"]
    assert set(context_pool(pair, "default", "test")) == set(rows["sentence1"]) | set(rows["sentence2"])
    clu = loaded(data_dir / "clustering" / "tinyclu")
    assert context_pool(clu, "default", "test") == [f"{TOPICS[i % 4]} item {i}" for i in range(12)]


def test_context_plan_is_seeded_and_chosen_once_per_task_subset_split(data_dir):
    ret = loaded(data_dir / "retrieval" / "tinyret")
    cls = loaded(data_dir / "classification" / "tinycls")
    plan = ContextPlan(mode="corpus", size=5, seed=3)
    plan.register(ret)
    plan.register(cls)
    choice = plan.choose("tinyret", "default", "test")
    assert choice.texts == sample_context(context_pool(ret, "default", "test"), 5, 3)
    assert plan.choose("tinyret", "default", "test") is choice
    assert len(set(choice.texts)) == 5  # without replacement
    assert plan.choose("tinycls", "default", "train") is plan.choose("tinycls", "default", "test")
    other_seed = ContextPlan(mode="corpus", size=5, seed=4)
    other_seed.register(ret)
    assert other_seed.choose("tinyret", "default", "test").texts != choice.texts
    assert ContextPlan(mode="none", size=5).choose("tinyret", "default", "test") is None
    assert ContextPlan(mode="corpus", size=0).choose("tinyret", "default", "test") is None
    with pytest.raises(KeyError, match="not registered"):
        plan.choose("unknown", "default", "test")
    with pytest.raises(ValueError, match="random_pool"):
        ContextPlan(mode="random", size=4)
