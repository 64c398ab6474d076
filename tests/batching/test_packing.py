"""order_clusters and pack_clusters: clusters into batches of exactly batch_size along a nearest-centroid tour."""

from __future__ import annotations

import numpy as np
import pytest
from batching_helpers import rows_of

from cde_st.batching import order_clusters, pack_clusters


def test_order_clusters_greedy_tour_beats_random():
    rng = np.random.default_rng(0)
    centroids = rng.normal(size=(200, 8)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)

    def tour_similarity(tour):
        return float(np.mean(np.sum(centroids[tour[:-1]] * centroids[tour[1:]], axis=1)))

    greedy = order_clusters(centroids, "greedy", seed=0)
    random = order_clusters(centroids, "random", seed=0)
    assert sorted(greedy.tolist()) == list(range(200)) == sorted(random.tolist())
    assert tour_similarity(greedy) > tour_similarity(random) + 0.3
    np.testing.assert_array_equal(greedy, order_clusters(centroids, "greedy", seed=0))
    with pytest.raises(ValueError, match="order"):
        order_clusters(centroids, "tsp")


def test_pack_clusters_exact_batches_and_every_row_once():
    rng = np.random.default_rng(0)
    # Cluster sizes from 1 to 90 around a batch size of 16: big ones must be split, small ones merged.
    sizes = rng.integers(1, 90, size=30)
    labels = rng.permutation(np.repeat(np.arange(30), sizes))
    centroids = rng.normal(size=(31, 4)).astype(np.float32)  # cluster 30 is empty
    domains = np.arange(31) % 2
    batches = pack_clusters(labels, centroids, 16, cluster_domains=domains, order="greedy", seed=1)
    assert rows_of(batches) == list(range(len(labels)))
    short = [b for b in batches if len(b) != 16]
    assert len(short) <= 2 and all(0 < len(b) < 16 for b in short)
    for batch in batches:
        assert len(set(domains[labels[batch]])) == 1
    # A batch holds rows of few clusters: contiguous stretches of the cluster tour, not a random mix.
    clusters_per_batch = np.mean([len(set(labels[b])) for b in batches])
    assert clusters_per_batch < 3
    assert [b.tolist() for b in batches] == [
        b.tolist() for b in pack_clusters(labels, centroids, 16, cluster_domains=domains, seed=1)
    ]
