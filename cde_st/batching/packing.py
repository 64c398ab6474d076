"""Packing clusters into batches of exactly ``batch_size`` rows along a nearest-centroid tour."""

from __future__ import annotations

from typing import Literal

import numpy as np

# Neighbours pre-computed per centroid for the greedy tour; a full scan is the fallback when all are visited.
_TOUR_NEIGHBOURS = 32

ClusterOrder = Literal["greedy", "random"]


def order_clusters(centroids: np.ndarray, order: ClusterOrder = "greedy", seed: int = 0) -> np.ndarray:
    """A visiting order of the clusters: a greedy nearest-centroid tour (``"greedy"``) or a random permutation.

    The greedy tour starts at a seeded random cluster and repeatedly moves to the most similar (inner product)
    unvisited centroid, so consecutive clusters, which share batches when packed, are neighbours.

    Args:
        centroids: (K, D) cluster centroids (unit norm for spherical k-means).
        order: ``"greedy"`` or ``"random"``.
        seed: picks the start cluster (greedy) or the permutation (random).

    Returns:
        (K,) int64 permutation of ``range(K)``.
    """
    if order not in ("greedy", "random"):
        raise ValueError(f"order must be 'greedy' or 'random', got {order!r}.")
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    k = len(centroids)
    rng = np.random.default_rng(seed)
    if order == "random" or k <= 2:
        return rng.permutation(k).astype(np.int64)

    import faiss  # deferred: faiss loads its native libraries, needed only for a greedy tour of 3+ clusters

    index = faiss.IndexFlatIP(centroids.shape[1])
    index.add(centroids)
    _, neighbours = index.search(centroids, min(k, _TOUR_NEIGHBOURS + 1))  # includes the centroid itself

    visited = np.zeros(k, dtype=bool)
    tour = np.empty(k, dtype=np.int64)
    current = int(rng.integers(k))
    for step in range(k):
        tour[step] = current
        visited[current] = True
        if step == k - 1:
            break
        candidates = neighbours[current]
        candidates = candidates[(candidates >= 0) & ~visited[np.maximum(candidates, 0)]]
        if len(candidates):
            current = int(candidates[0])
        else:  # all precomputed neighbours taken: scan the remaining clusters
            remaining = np.flatnonzero(~visited)
            current = int(remaining[np.argmax(centroids[remaining] @ centroids[current])])
    return tour


def pack_clusters(
    labels: np.ndarray,
    centroids: np.ndarray,
    batch_size: int,
    *,
    cluster_domains: np.ndarray | None = None,
    order: ClusterOrder = "greedy",
    seed: int = 0,
) -> list[np.ndarray]:
    """Pack clustered rows into batches of exactly ``batch_size`` rows, never mixing domains.

    Within each domain the non-empty clusters are visited in :func:`order_clusters` order, each cluster's rows
    in a seeded random order, and the resulting stream is cut every ``batch_size`` rows: a big cluster is split
    over several batches and small neighbouring clusters share one. Only the last batch of each domain can be
    smaller than ``batch_size``.

    Args:
        labels: (N,) cluster id of every row.
        centroids: (K, D) centroids, indexed by cluster id.
        batch_size: rows per batch.
        cluster_domains: (K,) domain of each cluster; ``None`` means one domain.
        order: cluster visiting order, ``"greedy"`` (nearest centroid) or ``"random"``.
        seed: seeds the cluster order and the order of rows within each cluster.

    Returns:
        A list of int64 arrays of row indices, domain after domain, every row exactly once.

    Example:
        >>> labels = np.array([0, 1, 0, 1, 2])
        >>> centroids = np.eye(3, dtype=np.float32)
        >>> [len(b) for b in pack_clusters(labels, centroids, batch_size=2)]
        [2, 2, 1]
    """
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    labels = np.asarray(labels, dtype=np.int64)
    k = len(centroids)
    if len(labels) and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"labels must lie in [0, {k}) to index the {k} centroids.")
    if cluster_domains is None:
        cluster_domains = np.zeros(k, dtype=np.int64)
    cluster_domains = np.asarray(cluster_domains)
    if len(cluster_domains) != k:
        raise ValueError(f"cluster_domains has {len(cluster_domains)} entries for {k} centroids.")

    rng = np.random.default_rng(seed)
    by_cluster = np.argsort(labels, kind="stable")
    sizes = np.bincount(labels, minlength=k)
    starts = np.concatenate([[0], np.cumsum(sizes)])

    batches: list[np.ndarray] = []
    for domain in dict.fromkeys(cluster_domains.tolist()):  # domains in order of appearance
        clusters = np.flatnonzero((cluster_domains == domain) & (sizes > 0))
        if len(clusters) == 0:
            continue
        tour = clusters[order_clusters(centroids[clusters], order, int(rng.integers(2**31)))]
        stream = np.concatenate([rng.permutation(by_cluster[starts[c] : starts[c + 1]]) for c in tour])
        batches.extend(stream[i : i + batch_size] for i in range(0, len(stream), batch_size))
    return batches


__all__ = ["ClusterOrder", "order_clusters", "pack_clusters"]
