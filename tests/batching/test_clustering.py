"""cluster_pairs: spherical k-means of the pairs' [q;d] / [d;q] points within each domain."""

from __future__ import annotations

from collections import Counter

import numpy as np
from batching_helpers import structured_embeddings

from cde_st.batching import cluster_pairs


def test_cluster_pairs_recovers_topics_and_is_deterministic():
    q, d, topic = structured_embeddings(1200, topics=12, noise=0.2)
    # k = 24 > 12 topics: k-means may split a topic but should not merge two.
    clustering = cluster_pairs(q, d, cluster_size=50, seed=3)
    assert clustering.num_clusters == 24
    assert clustering.labels.shape == (1200,)
    np.testing.assert_allclose(np.linalg.norm(clustering.centroids, axis=1), 1.0, atol=1e-4)
    # Purity: each cluster is dominated by one topic.
    purity = sum(Counter(topic[clustering.labels == c]).most_common(1)[0][1] for c in set(clustering.labels))
    assert purity / len(topic) > 0.95
    again = cluster_pairs(q, d, cluster_size=50, seed=3)
    np.testing.assert_array_equal(clustering.labels, again.labels)
    np.testing.assert_array_equal(clustering.centroids, again.centroids)


def test_cluster_pairs_uses_both_orientations():
    # A pair's [q;d] point and its [d;q] point are both training points: with q/d from disjoint topic sets,
    # the k-means centroids must cover the flipped points too (else half of the centroid would be q-like only).
    q, d, _ = structured_embeddings(400, topics=4, noise=0.1, seed=1)
    clustering = cluster_pairs(q, d, cluster_size=200, seed=0)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    dn = d / np.linalg.norm(d, axis=1, keepdims=True)
    qd = np.concatenate([qn, dn], axis=1) / np.sqrt(2)
    dq = np.concatenate([dn, qn], axis=1) / np.sqrt(2)
    # Assignment is by [q;d]: it matches the nearest centroid of the [q;d] point.
    np.testing.assert_array_equal(clustering.labels, np.argmax(qd @ clustering.centroids.T, axis=1))
    assert (dq @ clustering.centroids.T).max(axis=1).mean() > 0.5


def test_cluster_pairs_within_domains():
    q, d, _ = structured_embeddings(600, topics=6)
    domains = ["a" if i % 3 else "b" for i in range(600)]
    clustering = cluster_pairs(q, d, cluster_size=50, domains=domains)
    assert clustering.domain_names == ["b", "a"]
    codes = np.array([clustering.domain_names.index(x) for x in domains])
    np.testing.assert_array_equal(clustering.cluster_domains[clustering.labels], codes)
    assert clustering.num_clusters == round(400 / 50) + round(200 / 50)
