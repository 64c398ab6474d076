"""Spherical k-means of (query, document) pairs into pseudo-domains (Morris & Rush, 2025, section 3.1).

Each pair (q, d) becomes the two unit points [q;d] and [d;q]; faiss spherical k-means with
k = pairs / cluster_size runs within each domain, and each pair is assigned by its [q;d] point.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

# Rows per chunk when assigning pairs to centroids (bounds the memory of the (chunk, 2D) [q;d] block).
_ASSIGN_CHUNK = 65_536


@dataclass
class PairClustering:
    """The result of :func:`cluster_pairs`.

    Attributes:
        labels: (N,) int64, the cluster of each pair (global ids, unique across domains).
        centroids: (K, 2 * D) float32, unit-norm centroids in the [q;d] space.
        cluster_domains: (K,) int64, the domain code of each cluster (all 0 without domains).
        domain_names: the domain of each code, in order of first appearance in the data.
    """

    labels: np.ndarray
    centroids: np.ndarray
    cluster_domains: np.ndarray
    domain_names: list[Hashable]

    @property
    def num_clusters(self) -> int:
        return len(self.centroids)

    def cluster_sizes(self) -> np.ndarray:
        """(K,) number of pairs in each cluster."""
        return np.bincount(self.labels, minlength=self.num_clusters)


def normalize_rows(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def _check_pair_embeddings(q_emb: np.ndarray, d_emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q_emb = np.asarray(q_emb)
    d_emb = np.asarray(d_emb)
    if q_emb.ndim != 2 or d_emb.ndim != 2:
        raise ValueError(
            f"Query and document embeddings must be 2-D (pairs, dim); got shapes {q_emb.shape} and {d_emb.shape}."
        )
    if q_emb.shape != d_emb.shape:
        raise ValueError(
            f"Query and document embeddings must have the same shape; got {q_emb.shape} and {d_emb.shape}."
        )
    if len(q_emb) == 0:
        raise ValueError("No pairs to cluster: the embeddings are empty.")
    for side, emb in (("query", q_emb), ("document", d_emb)):
        bad = ~np.isfinite(emb).all(axis=1)
        if bad.any():
            raise ValueError(
                f"{int(bad.sum())} of {len(emb)} {side} embeddings hold NaN or inf (first: pair {int(np.argmax(bad))}),"
                " so they cannot be clustered. The surrogate model (`surrogate`, or the given embeddings) produced "
                "them: check that it loads and encodes finite vectors (e.g. not in float16 overflow)."
            )
    return normalize_rows(q_emb), normalize_rows(d_emb)


def _pair_points(q: np.ndarray, d: np.ndarray, rows: np.ndarray, flipped: np.ndarray | None = None) -> np.ndarray:
    """Unit-norm [q;d] points of ``rows`` (or [d;q] where ``flipped``); q and d are already unit-norm."""
    first = q[rows].copy()
    second = d[rows].copy()
    if flipped is not None:
        first[flipped], second[flipped] = d[rows[flipped]], q[rows[flipped]]
    # Both halves have norm 1, so the concatenation has norm sqrt(2).
    return np.concatenate([first, second], axis=1) * np.float32(1.0 / math.sqrt(2.0))


def faiss_use_gpu(use_gpu: bool | None) -> bool:
    """Whether k-means runs on the GPU. ``None``: when faiss is a GPU build and sees a device, else the CPU.
    ``True`` without one is an error naming what is missing (the GPU build, or a device it can see)."""
    import faiss  # deferred (here and below): faiss loads its native libraries, which `import cde_st` need not pay

    gpu_build = hasattr(faiss, "StandardGpuResources")  # absent from faiss-cpu
    available = faiss.get_num_gpus() if gpu_build else 0
    if use_gpu is None:
        return available > 0
    if use_gpu and not gpu_build:
        raise ValueError(
            f"use_gpu=True, but the installed faiss {faiss.__version__} is a CPU-only build (faiss-cpu). Install the "
            "GPU build in its place: pip uninstall faiss-cpu && pip install 'cde_st[faiss-gpu]' (faiss-gpu-cu12, "
            "CUDA 12). Or pass use_gpu=None to use a GPU only when there is one."
        )
    if use_gpu and available == 0:
        raise ValueError(
            f"use_gpu=True, but faiss {faiss.__version__} (a GPU build) sees no CUDA device "
            "(faiss.get_num_gpus() == 0): check the NVIDIA driver and CUDA_VISIBLE_DEVICES, or pass use_gpu=None "
            "to cluster on the CPU."
        )
    return bool(use_gpu)


def _spherical_kmeans(
    q: np.ndarray,
    d: np.ndarray,
    k: int,
    seed: int,
    niter: int,
    max_points_per_centroid: int,
    use_gpu: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster the 2N points [q;d], [d;q] of one domain; return (labels by [q;d], centroids)."""
    import faiss  # deferred: see faiss_use_gpu

    n, dim = q.shape
    rng = np.random.default_rng(seed)
    if k == 1:
        # One cluster: k-means is the normalised mean; no need to run faiss.
        centroid = _pair_points(q, d, np.arange(n)).mean(axis=0, keepdims=True)
        centroid /= max(float(np.linalg.norm(centroid)), 1e-12)
        return np.zeros(n, dtype=np.int64), centroid.astype(np.float32)

    # Subsample the training points ourselves (as faiss would) so that the 2N x 2D matrix is never built:
    # point i < N is [q_i; d_i], point N + i is [d_i; q_i].
    num_points = 2 * n
    max_points = max(k, k * max_points_per_centroid)
    chosen = np.arange(num_points) if num_points <= max_points else np.sort(rng.choice(num_points, max_points, False))
    train = _pair_points(q, d, chosen % n, flipped=chosen >= n)

    kmeans = faiss.Kmeans(
        2 * dim,
        k,
        niter=niter,
        seed=int(seed % (2**31 - 1)),
        spherical=True,
        gpu=use_gpu,
        verbose=False,
        min_points_per_centroid=1,
        max_points_per_centroid=len(train) // k + 1,  # already subsampled
    )
    kmeans.train(train)
    del train
    centroids = np.ascontiguousarray(kmeans.centroids, dtype=np.float32)

    labels = np.empty(n, dtype=np.int64)
    for start in range(0, n, _ASSIGN_CHUNK):
        rows = np.arange(start, min(start + _ASSIGN_CHUNK, n))
        _, nearest = kmeans.index.search(_pair_points(q, d, rows), 1)
        labels[rows] = nearest[:, 0]
    return labels, centroids


def encode_domains(domains: Sequence[Hashable] | None, n: int) -> tuple[np.ndarray, list[Hashable]]:
    """Map domain values to codes 0..M-1 in order of first appearance."""
    if domains is None:
        return np.zeros(n, dtype=np.int64), [None]
    domains = list(domains)
    if len(domains) != n:
        raise ValueError(f"Got {len(domains)} domain labels for {n} pairs; give exactly one domain per pair.")
    names: dict[Hashable, int] = {}
    codes = np.fromiter((names.setdefault(value, len(names)) for value in domains), dtype=np.int64, count=n)
    return codes, list(names)


def num_clusters_for(num_pairs: int, cluster_size: int) -> int:
    """k for a domain of ``num_pairs`` pairs: ``round(num_pairs / cluster_size)``, at least 1."""
    return int(min(num_pairs, max(1, round(num_pairs / cluster_size))))


def cluster_pairs(
    q_emb: np.ndarray,
    d_emb: np.ndarray,
    cluster_size: int,
    seed: int = 0,
    *,
    domains: Sequence[Hashable] | None = None,
    niter: int = 20,
    max_points_per_centroid: int = 256,
    use_gpu: bool | None = None,
    show_progress_bar: bool = False,
) -> PairClustering:
    """Spherical k-means over the [q;d] and [d;q] points of the pairs, within each domain.

    Each half is L2-normalised, so the concatenations are unit vectors after a constant scaling. Per domain of
    n pairs, k = round(n / cluster_size) (at least 1) clusters are trained on the 2n points (subsampled to
    ``max_points_per_centroid * k`` points when larger, as faiss does) and every pair is assigned by its [q;d]
    point. The run is deterministic for a seed (faiss CPU; GPU runs may differ in the last bits).

    Args:
        q_emb: (N, D) query embeddings.
        d_emb: (N, D) document embeddings of the matching positives.
        cluster_size: the target number of pairs per cluster (paper: equal to the batch size).
        seed: seeds the subsampling and faiss' centroid initialisation.
        domains: one hashable per pair; pairs are only clustered with pairs of the same domain.
        niter: k-means iterations.
        max_points_per_centroid: the training subsample per centroid (faiss' default is 256).
        use_gpu: run faiss on the GPU; ``None`` uses one when this faiss build sees any.
        show_progress_bar: one progress step per domain.

    Returns:
        A :class:`PairClustering` with (N,) labels and (K, 2D) centroids.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> q, d = rng.normal(size=(1000, 32)), rng.normal(size=(1000, 32))
        >>> clustering = cluster_pairs(q, d, cluster_size=100, seed=0)
        >>> clustering.num_clusters, clustering.labels.shape
        (10, (1000,))
    """
    q, d = _check_pair_embeddings(q_emb, d_emb)
    n = len(q)
    if not isinstance(cluster_size, (int, np.integer)) or isinstance(cluster_size, bool):
        raise ValueError(f"cluster_size must be an integer, got {cluster_size!r}.")
    if cluster_size < 1 or cluster_size > n:
        raise ValueError(f"cluster_size must be between 1 and the number of pairs ({n}), got {cluster_size}.")
    if niter < 1:
        raise ValueError(f"niter must be >= 1, got {niter}.")
    codes, names = encode_domains(domains, n)
    gpu = faiss_use_gpu(use_gpu)

    labels = np.empty(n, dtype=np.int64)
    centroids: list[np.ndarray] = []
    cluster_domains: list[np.ndarray] = []
    offset = 0
    bar = tqdm(range(len(names)), desc="Clustering pairs (k-means)", disable=not show_progress_bar)
    for code in bar:
        rows = np.flatnonzero(codes == code)
        k = num_clusters_for(len(rows), cluster_size)
        bar.set_postfix_str(f"{names[code]}: {len(rows)} pairs, k={k}")
        domain_labels, domain_centroids = _spherical_kmeans(
            q[rows], d[rows], k, seed + code, niter, max_points_per_centroid, gpu
        )
        labels[rows] = domain_labels + offset
        centroids.append(domain_centroids)
        cluster_domains.append(np.full(k, code, dtype=np.int64))
        offset += k
    return PairClustering(labels, np.concatenate(centroids), np.concatenate(cluster_domains), names)


__all__ = [
    "PairClustering",
    "cluster_pairs",
    "encode_domains",
    "faiss_use_gpu",
    "normalize_rows",
    "num_clusters_for",
]
