"""cluster_dataset: a dataset's pairs embedded by the surrogate and clustered once, then loaded from the cache."""

from __future__ import annotations

import pytest
from batching_helpers import pair_dataset, rows_of, topic_dataset

from cde_st.batching import ClusteredBatchSampler


def test_clustering_is_cached_on_disk(tiny_st_model, tmp_path, monkeypatch):
    ds = pair_dataset(64)
    first = ClusteredBatchSampler(ds, 8, False, surrogate=tiny_st_model, cache_dir=tmp_path, show_progress_bar=False)
    assert first.cache_path.exists() and first.cache_path.parent == tmp_path

    import cde_st.batching.dataset_clustering as clustering_module

    def fail(*args, **kwargs):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(clustering_module, "cluster_pairs", fail)
    monkeypatch.setattr(clustering_module, "embed_pairs", fail)
    second = ClusteredBatchSampler(ds, 8, False, surrogate=tiny_st_model, cache_dir=tmp_path, show_progress_bar=False)
    assert second.cache_path == first.cache_path
    assert list(second) == list(first)
    # Any change of data or parameters is a different key (and so recomputes).
    for other in (
        dict(dataset=pair_dataset(63)),
        dict(cluster_size=4),
        dict(seed=1),
        dict(domains=["a", "b"] * 32),
    ):
        kwargs = dict(dataset=ds, batch_size=8, drop_last=False, surrogate=tiny_st_model, cache_dir=tmp_path)
        kwargs.update(other)
        with pytest.raises(AssertionError, match="recomputed"):
            ClusteredBatchSampler(show_progress_bar=False, **kwargs)


def test_static_surrogate_sampler_gives_a_valid_clustering(static_root, topic_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CDE_ST_CACHE", str(static_root))
    ds, _ = topic_dataset(96)
    domains = ["a", "b"] * 48
    kwargs = dict(
        surrogate=topic_bert_dir, surrogate_kind="static", static_fit_pairs=32, static_dims=8, cluster_size=8,
        domains=domains, cache_dir=tmp_path, show_progress_bar=False,
    )  # fmt: skip
    sampler = ClusteredBatchSampler(ds, 8, False, **kwargs)
    batches = list(sampler)
    assert rows_of(batches) == list(range(96))
    assert all(len(b) == 8 for b in batches)
    assert all(len({domains[i] for i in b}) == 1 for b in batches)
    assert sampler.clustering.num_clusters == 12
    assert sampler.clustering.centroids.shape == (12, 2 * 8)  # k-means ran on the static_dims embeddings
    assert sampler.timings["embed_s"] > 0 and sampler.cache_path.exists()

    import cde_st.batching.dataset_clustering as clustering_module

    def fail(*args, **kwargs):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(clustering_module, "fit_static_surrogate", fail)
    monkeypatch.setattr(clustering_module, "cluster_pairs", fail)
    again = ClusteredBatchSampler(ds, 8, False, **kwargs)
    assert again.cache_path == sampler.cache_path and list(again) == batches
    # The static settings are part of the clustering's key; the transformer surrogate's key is another.
    for other in (dict(static_dims=4), dict(static_fit_pairs=16), dict(surrogate_kind="transformer")):
        with pytest.raises(AssertionError, match="recomputed"):
            ClusteredBatchSampler(ds, 8, False, **{**kwargs, **other})


def test_options_are_declared_once_and_the_sampler_defaults_come_from_them(tiny_st_model, tmp_path):
    """ClusteringOptions holds the clustering options' defaults; the sampler's signature reads them from it, and
    cluster_dataset takes the options object or its fields as keywords (the same clustering)."""
    import inspect

    from cde_st.batching import ClusteringOptions, cluster_dataset

    params = inspect.signature(ClusteredBatchSampler).parameters
    for name in ("surrogate_kind", "static_fit_pairs", "static_dims", "niter", "max_points_per_centroid"):
        assert params[name].default == getattr(ClusteringOptions, name), name
    ds = pair_dataset(32)
    common = dict(cluster_size=8, query_column="query", document_column="document", surrogate=tiny_st_model)
    by_object = cluster_dataset(ds, ClusteringOptions(**common))
    by_keywords = cluster_dataset(ds, **common)
    assert (
        by_object.cache_path is None and by_object.clustering.labels.tolist() == by_keywords.clustering.labels.tolist()
    )


def test_the_texts_are_read_a_column_at_a_time(tiny_st_model, tmp_path, monkeypatch):
    """Reading the pairs' texts row by row (a datasets >= 4 Column iterated) cost 38 s of set-up for 287k pairs."""
    from cde_st.batching import cluster_dataset

    ds = pair_dataset(32)
    column_type = type(ds["query"])
    if column_type is not list:
        monkeypatch.setattr(column_type, "__iter__", lambda self: (_ for _ in ()).throw(AssertionError("row by row")))
    result = cluster_dataset(
        ds, cluster_size=8, query_column="query", document_column="document", surrogate=tiny_st_model
    )
    assert result.clustering.labels.shape == (32,)
