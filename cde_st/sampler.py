"""Contextual batching: a clustered batch sampler for ``SentenceTransformerTrainer``.

Contextual Document Embeddings (Morris & Rush, ICLR 2025, https://arxiv.org/abs/2405.02779), section 3.1:
training pairs are partitioned into pseudo-domains of similar pairs so that every batch holds hard in-batch
negatives. Each pair (q, d) is embedded with a small surrogate model, turned into the two points [q;d] and
[d;q], and clustered with spherical k-means (k = pairs / cluster_size) within its source dataset; each pair is
assigned by its [q;d] point. Clusters are then packed into batches of exactly ``batch_size``: big clusters
are split, small ones are merged with their nearest neighbours in a greedy nearest-centroid tour.

The pieces are plain functions (:func:`embed_pairs`, :func:`cluster_pairs`, :func:`order_clusters`,
:func:`pack_clusters`, :func:`in_batch_negative_similarity`) so that the sampler, the training scripts and the
benchmarks all run the same code. :class:`ClusteredBatchSampler` wires them into a sentence-transformers batch
sampler, with an on-disk cache of the clustering.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
import time
import warnings
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from sentence_transformers.base.data_collator import DEFAULT_LABEL_COLUMNS
from sentence_transformers.base.sampler import DefaultBatchSampler
from tqdm.auto import tqdm

if TYPE_CHECKING:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

# Bump when the clustering algorithm changes in a way that invalidates cached results.
_CACHE_VERSION = 1
# Added by the trainer to multi-dataset inputs; never a text column.
_RESERVED_COLUMNS = ("dataset_name", "return_loss")
# Rows per chunk when assigning pairs to centroids (bounds the memory of the (chunk, 2D) [q;d] block).
_ASSIGN_CHUNK = 65_536
# Neighbours pre-computed per centroid for the greedy tour; a full scan is the fallback when all are visited.
_TOUR_NEIGHBOURS = 32

ClusterOrder = Literal["greedy", "random"]


# --------------------------------------------------------------------------------------------------------------
# Plain functions (the trainer, the tests and the benchmarks call these)
# --------------------------------------------------------------------------------------------------------------


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


def _normalize_rows(x: np.ndarray) -> np.ndarray:
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
    return _normalize_rows(q_emb), _normalize_rows(d_emb)


def _pair_points(q: np.ndarray, d: np.ndarray, rows: np.ndarray, flipped: np.ndarray | None = None) -> np.ndarray:
    """Unit-norm [q;d] points of ``rows`` (or [d;q] where ``flipped``); q and d are already unit-norm."""
    first = q[rows].copy()
    second = d[rows].copy()
    if flipped is not None:
        first[flipped], second[flipped] = d[rows[flipped]], q[rows[flipped]]
    # Both halves have norm 1, so the concatenation has norm sqrt(2).
    return np.concatenate([first, second], axis=1) * np.float32(1.0 / math.sqrt(2.0))


def _faiss_use_gpu(use_gpu: bool | None) -> bool:
    import faiss

    available = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if use_gpu is None:
        return available > 0
    if use_gpu and available == 0:
        raise ValueError("use_gpu=True but this faiss build sees no GPU (install faiss-gpu or pass use_gpu=None).")
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
    import faiss

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


def _encode_domains(domains: Sequence[Hashable] | None, n: int) -> tuple[np.ndarray, list[Hashable]]:
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
    codes, names = _encode_domains(domains, n)
    gpu = _faiss_use_gpu(use_gpu)

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

    import faiss

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


def in_batch_negative_similarity(batches: Sequence[Sequence[int]], q_emb: np.ndarray, d_emb: np.ndarray) -> float:
    """Batch hardness: the mean cosine similarity between each query and the *other* documents of its batch.

    Averaged over all (query, other document) pairs of all batches; batches of one row contribute nothing.

    Args:
        batches: row indices of each batch.
        q_emb: (N, D) query embeddings (any scale; normalised here).
        d_emb: (N, D) document embeddings.
    """
    q, d = _normalize_rows(q_emb), _normalize_rows(d_emb)
    total, count = 0.0, 0
    for batch in batches:
        rows = np.asarray(batch, dtype=np.int64)
        m = len(rows)
        if m < 2:
            continue
        sims = q[rows] @ d[rows].T  # (m, m); the diagonal holds the positives
        total += float(sims.sum(dtype=np.float64) - np.trace(sims, dtype=np.float64))
        count += m * (m - 1)
    if count == 0:
        raise ValueError("No batch has two or more rows: in-batch negative similarity is undefined.")
    return total / count


def embed_pairs(
    model: SentenceTransformer,
    queries: Sequence[str],
    documents: Sequence[str],
    *,
    batch_size: int = 64,
    max_seq_length: int | None = None,
    show_progress_bar: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Embed queries (``encode_query``) and documents (``encode_document``) with a surrogate model.

    Returns:
        Two (N, D) float32 arrays, L2-normalised.
    """
    if len(queries) != len(documents):
        raise ValueError(f"Got {len(queries)} queries but {len(documents)} documents.")
    previous = model.max_seq_length
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    try:
        kwargs = dict(
            batch_size=batch_size, show_progress_bar=show_progress_bar, convert_to_numpy=True, normalize_embeddings=True
        )
        if show_progress_bar:
            logger.info("Embedding %d queries and %d documents with the surrogate model", len(queries), len(documents))
        q_emb = model.encode_query(list(queries), **kwargs)
        d_emb = model.encode_document(list(documents), **kwargs)
    finally:
        model.max_seq_length = previous
    return np.asarray(q_emb, dtype=np.float32), np.asarray(d_emb, dtype=np.float32)


# --------------------------------------------------------------------------------------------------------------
# Cache and distributed helpers
# --------------------------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$CDE_ST_CACHE/clusters`` if set, else ``~/.cache/cde_st/clusters``."""
    root = os.environ.get("CDE_ST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cde_st")
    return Path(root) / "clusters"


def _hash_texts(hasher: Any, texts: Sequence[Any]) -> None:
    for text in texts:
        hasher.update(b"\x00")
        hasher.update(str(text).encode("utf-8", "surrogatepass"))


def _hash_array(hasher: Any, array: np.ndarray) -> None:
    array = np.ascontiguousarray(array)
    hasher.update(f"{array.dtype.str}{array.shape}".encode())
    hasher.update(memoryview(array).cast("B"))


def _model_fingerprint(model: SentenceTransformer | str) -> str:
    """Identify a surrogate: a path/hub id with its weight files' sizes and mtimes, or a model's parameters."""
    hasher = hashlib.sha256()
    if isinstance(model, (str, os.PathLike)):
        hasher.update(f"path:{os.fspath(model)}".encode())
        folder = Path(model)
        if folder.is_dir():
            for file in sorted(folder.rglob("*")):
                if file.is_file():
                    stat = file.stat()
                    hasher.update(f"{file.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        return hasher.hexdigest()
    hasher.update(f"instance:{type(model).__qualname__}:{getattr(model, 'max_seq_length', None)}".encode())
    for name, tensor in model.state_dict().items():
        hasher.update(name.encode())
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        hasher.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return hasher.hexdigest()


def _save_clustering(path: Path, clustering: PairClustering, meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp.npz")
    os.close(fd)
    try:
        np.savez(
            tmp,
            labels=clustering.labels,
            centroids=clustering.centroids,
            cluster_domains=clustering.cluster_domains,
            domain_names=np.array(json.dumps([str(n) if n is not None else None for n in clustering.domain_names])),
            meta=np.array(json.dumps(meta)),
        )
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the complete new one
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _load_clustering(path: Path, num_rows: int, domain_names: list[Hashable]) -> PairClustering | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            clustering = PairClustering(
                labels=data["labels"].astype(np.int64),
                centroids=data["centroids"].astype(np.float32),
                cluster_domains=data["cluster_domains"].astype(np.int64),
                domain_names=domain_names,  # the key covers them; keep the caller's (non-string) values
            )
    except (OSError, KeyError, ValueError) as exc:
        logger.warning("Ignoring unreadable clustering cache %s (%s)", path, exc)
        return None
    k = clustering.num_clusters
    if len(clustering.labels) != num_rows or len(clustering.cluster_domains) != k or clustering.labels.max() >= k:
        logger.warning("Ignoring clustering cache %s: it does not match the dataset", path)
        return None
    return clustering


def _dist_world() -> tuple[int, int]:
    """(world size, rank) of an initialised torch.distributed process group, else (1, 0)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


# --------------------------------------------------------------------------------------------------------------
# The batch sampler
# --------------------------------------------------------------------------------------------------------------


class ClusteredBatchSampler(DefaultBatchSampler):
    """Contextual batching (Morris & Rush, 2025, "Contextual Document Embeddings", section 3.1).

    Builds hard batches for contrastive losses with in-batch negatives (``MultipleNegativesRankingLoss``,
    ``CachedMultipleNegativesRankingLoss``, GIST, CDE's filtered InfoNCE): the (query, document) pairs are
    embedded by a surrogate model, clustered with faiss spherical k-means on their [q;d] / [d;q] points
    (k = pairs / ``cluster_size``) within each domain, and the clusters are packed into batches of exactly
    ``batch_size`` rows (big clusters split, small neighbouring ones merged, along a greedy nearest-centroid
    tour). Batch composition is fixed by ``seed``; the order of the batches is reshuffled every epoch from
    ``seed + epoch``. Every row appears exactly once per epoch; with ``drop_last=True`` the last, smaller batch
    of each domain is left out.

    Expected columns: the query and the positive document as text columns (by default the first two string
    columns, skipping label columns such as ``label``/``score``); further columns (e.g. hard negatives) are
    passed through untouched. Labels are not needed.

    Domains: pairs are only batched with pairs of the same domain. Give the domain of every row as
    ``domains=[...]`` or as ``domain_dataset=ds`` (a dataset with a ``domain_column``, row-aligned with the
    training dataset). Do **not** leave a domain column in the training dataset itself: the trainer's collator
    feeds every non-label column to the model as text. For a ``DatasetDict``, the trainer builds one sampler per
    split, so each split is a domain of its own (and ``multi_dataset_batch_sampler`` interleaves their
    batches); no option is needed.

    Distributed training: under ``SentenceTransformerTrainer``, accelerate hands batch ``i`` of this sampler
    to rank ``i % world_size``, so the sampler yields the *global* sequence of batches on every rank (the
    clustering is computed on rank 0 and broadcast, so all ranks agree) and every rank trains on its own,
    whole clustered batches. To keep the ranks in step, with more than one process the sampler yields only
    full batches, a multiple of ``world_size`` of them: with ``drop_last=True`` surplus batches are left out;
    otherwise each domain's short batch is topped up with other rows of its domain and the batch count is
    padded by repeating batches, as ``torch.utils.data.DistributedSampler`` does. Outside the trainer (a plain
    ``DataLoader`` per process), pass ``rank=`` to make the sampler keep only its own batches.

    Options passed with ``functools.partial`` live in ``args.batch_sampler``, which the trainer pickles into
    every checkpoint's ``training_args.bin``: prefer a model path (the default) to a model instance, and a plain
    ``domains`` list to a large in-memory ``domain_dataset``; precomputed ``embeddings`` are stored there too.

    Caching: the clustering is stored under ``cache_dir`` (default ``~/.cache/cde_st/clusters``, or
    ``$CDE_ST_CACHE/clusters``), keyed by a hash of the texts, domains, surrogate and clustering parameters,
    so a restarted run does not embed or cluster again.

    Args:
        dataset: the training dataset (``datasets.Dataset``).
        batch_size: rows per batch.
        drop_last: leave out the short batch of each domain.
        valid_label_columns: label columns, never used as text (the trainer passes the collator's).
        generator: accepted for API compatibility; the order is drawn from ``seed + epoch`` instead, so every
            rank draws the same order whatever else consumed the generator.
        seed: seeds the clustering, the packing and (with the epoch) the batch order.
        cluster_size: target pairs per cluster; ``None`` uses ``batch_size`` (the paper's setting), clamped to
            the dataset size.
        model: the surrogate: a ``SentenceTransformer`` or a path / hub id; ``None`` is the offline
            all-MiniLM-L6-v2 (``cde_st._defaults``). Loaded only when the clustering is not cached.
        embeddings: precomputed ``(query_embeddings, document_embeddings)``, each (N, D), instead of a model.
        query_column, document_column: the text columns; by default the first two string columns.
        domains: the domain of every row (a sequence of hashables).
        domain_dataset: a dataset, row-aligned with ``dataset``, whose ``domain_column`` holds the domains.
        domain_column: the domain column of ``domain_dataset`` (or of ``dataset`` itself, with a warning).
        order: ``"greedy"`` nearest-centroid cluster tour (paper) or ``"random"`` cluster order.
        niter: k-means iterations.
        max_points_per_centroid: k-means training subsample per centroid.
        encode_batch_size: surrogate encoding batch size.
        max_seq_length: truncate texts for the surrogate (faster; ``None`` keeps the model's).
        device: device to load a surrogate given by path on.
        use_gpu: faiss on GPU; ``None`` uses one when available.
        cache: read and write the on-disk clustering cache.
        cache_dir: where to keep it.
        num_replicas: number of processes; ``None`` reads the torch.distributed world size.
        rank: yield only this rank's batches (batch ``i`` belongs to rank ``i % num_replicas``); leave ``None``
            under the trainer, where accelerate does this.
        show_progress_bar: progress bars for embedding and clustering.

    Example:
        ::

            from functools import partial

            from datasets import Dataset
            from sentence_transformers import (
                SentenceTransformer,
                SentenceTransformerTrainer,
                SentenceTransformerTrainingArguments,
            )
            from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

            from cde_st._defaults import default_surrogate_model_path
            from cde_st.sampler import ClusteredBatchSampler

            model = SentenceTransformer(default_surrogate_model_path())
            data = Dataset.from_dict({
                "query": [f"question {i} about topic {i % 7}" for i in range(256)],
                "document": [f"an answer about topic {i % 7}, number {i}" for i in range(256)],
                "domain": ["forum" if i % 2 else "faq" for i in range(256)],
            })
            train_dataset = data.remove_columns("domain")  # the collator would feed it to the model
            args = SentenceTransformerTrainingArguments(
                output_dir="checkpoints",
                num_train_epochs=1,
                per_device_train_batch_size=32,
                # or domain_dataset=data: the same domains, read from its "domain" column
                batch_sampler=partial(ClusteredBatchSampler, cluster_size=32, domains=list(data["domain"])),
            )
            trainer = SentenceTransformerTrainer(
                model=model,
                args=args,
                train_dataset=train_dataset,
                loss=MultipleNegativesRankingLoss(model),
            )
            trainer.train()
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        drop_last: bool,
        valid_label_columns: list[str] | None = None,
        generator: torch.Generator | None = None,
        seed: int = 0,
        *,
        cluster_size: int | None = None,
        model: SentenceTransformer | str | os.PathLike | None = None,
        embeddings: tuple[np.ndarray, np.ndarray] | None = None,
        query_column: str | None = None,
        document_column: str | None = None,
        domains: Sequence[Hashable] | None = None,
        domain_dataset: Dataset | None = None,
        domain_column: str = "domain",
        order: ClusterOrder = "greedy",
        niter: int = 20,
        max_points_per_centroid: int = 256,
        encode_batch_size: int = 64,
        max_seq_length: int | None = None,
        device: str | None = None,
        use_gpu: bool | None = None,
        cache: bool = True,
        cache_dir: str | os.PathLike | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        show_progress_bar: bool = True,
    ) -> None:
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        super().__init__(
            dataset,
            batch_size=int(batch_size),
            drop_last=drop_last,
            valid_label_columns=valid_label_columns,
            generator=generator,
            seed=seed,
        )
        self.dataset = dataset
        self.seed = 0 if seed is None else int(seed)
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}.")
        if order not in ("greedy", "random"):
            raise ValueError(f"order must be 'greedy' or 'random', got {order!r}.")
        self.order = order

        num_rows = len(dataset)
        if num_rows == 0:
            raise ValueError("ClusteredBatchSampler got an empty dataset: there are no pairs to cluster.")
        if cluster_size is None:
            cluster_size = min(self.batch_size, num_rows)
        elif not isinstance(cluster_size, (int, np.integer)) or isinstance(cluster_size, bool):
            raise ValueError(f"cluster_size must be an integer, got {cluster_size!r}.")
        if cluster_size < 1 or cluster_size > num_rows:
            raise ValueError(
                f"cluster_size must be between 1 and the number of rows in the dataset ({num_rows}), "
                f"got {cluster_size}."
            )
        self.cluster_size = int(cluster_size)

        world_size, _ = _dist_world()
        self.num_replicas = world_size if num_replicas is None else int(num_replicas)
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}.")
        if rank is not None and not 0 <= rank < self.num_replicas:
            raise ValueError(f"rank must be in [0, {self.num_replicas}), got {rank}.")
        self.rank = rank

        label_columns = list(valid_label_columns or DEFAULT_LABEL_COLUMNS)
        domain_values = self._resolve_domains(dataset, domains, domain_dataset, domain_column, num_rows)
        if embeddings is not None and model is not None:
            raise ValueError("Give either a surrogate `model` or precomputed `embeddings`, not both.")
        if embeddings is not None:
            q_emb, d_emb = (np.asarray(e) for e in embeddings)
            if q_emb.ndim != 2 or q_emb.shape != d_emb.shape or len(q_emb) != num_rows:
                raise ValueError(
                    f"embeddings must be two arrays of shape ({num_rows}, dim), one row per dataset row; "
                    f"got {q_emb.shape} and {d_emb.shape}."
                )
            self.query_column = self.document_column = None
            if query_column is not None or document_column is not None:
                self._text_columns(dataset, query_column, document_column, label_columns, domain_column)
        else:
            q_emb = d_emb = None
            self.query_column, self.document_column = self._text_columns(
                dataset, query_column, document_column, label_columns, domain_column
            )

        settings = dict(
            cluster_size=self.cluster_size,
            seed=self.seed,
            niter=int(niter),
            max_points_per_centroid=int(max_points_per_centroid),
            use_gpu=use_gpu,
            show_progress_bar=show_progress_bar,
        )
        self.cache_path: Path | None = None  # set by whichever process computes or loads the clustering
        self.timings = {"embed_s": 0.0, "cluster_s": 0.0}
        self.clustering = self._get_clustering(
            dataset,
            q_emb,
            d_emb,
            domain_values,
            model=model,
            device=device,
            encode_batch_size=encode_batch_size,
            max_seq_length=max_seq_length,
            cache=cache,
            cache_dir=Path(cache_dir) if cache_dir is not None else default_cache_dir(),
            settings=settings,
        )
        self.batches = pack_clusters(
            self.clustering.labels,
            self.clustering.centroids,
            self.batch_size,
            cluster_domains=self.clustering.cluster_domains,
            order=self.order,
            seed=self.seed,
        )
        self._warned_padding = False

    # ---- construction helpers ------------------------------------------------------------------------------

    @staticmethod
    def _resolve_domains(
        dataset: Dataset,
        domains: Sequence[Hashable] | None,
        domain_dataset: Dataset | None,
        domain_column: str,
        num_rows: int,
    ) -> list[Hashable] | None:
        if domains is not None and domain_dataset is not None:
            raise ValueError("Give the domains either as `domains=` or through `domain_dataset=`, not both.")
        if domain_dataset is not None:
            if domain_column not in domain_dataset.column_names:
                raise ValueError(
                    f"domain_dataset has no column {domain_column!r} (columns: {domain_dataset.column_names}); "
                    "set domain_column= to the column holding the domains."
                )
            if len(domain_dataset) != num_rows:
                raise ValueError(
                    f"domain_dataset has {len(domain_dataset)} rows but the dataset to sample has {num_rows}; "
                    "they must be row-aligned (pass the dataset before removing its domain column)."
                )
            return list(domain_dataset[domain_column])
        if domains is not None:
            domains = list(domains)
            if len(domains) != num_rows:
                raise ValueError(f"Got {len(domains)} domains for a dataset of {num_rows} rows; give one per row.")
            return domains
        if domain_column in getattr(dataset, "column_names", []):
            warnings.warn(
                f"ClusteredBatchSampler reads domains from the dataset's {domain_column!r} column, but "
                "SentenceTransformerTrainer's collator would also feed that column to the model as text. "
                f"Remove it from the training dataset and pass `domain_dataset=` or `domains=` instead.",
                stacklevel=3,
            )
            return list(dataset[domain_column])
        return None

    @staticmethod
    def _text_columns(
        dataset: Dataset,
        query_column: str | None,
        document_column: str | None,
        label_columns: list[str],
        domain_column: str,
    ) -> tuple[str, str]:
        columns = list(getattr(dataset, "column_names", None) or [])
        for name, column in (("query_column", query_column), ("document_column", document_column)):
            if column is not None and column not in columns:
                raise ValueError(f"{name}={column!r} is not a column of the dataset (columns: {columns}).")
        features = getattr(dataset, "features", None) or {}
        skip = set(label_columns) | set(_RESERVED_COLUMNS) | {domain_column}
        text_columns = [
            c
            for c in columns
            if c not in skip and getattr(features.get(c), "dtype", None) in ("string", "large_string")
        ]
        if query_column is None:
            candidates = [c for c in text_columns if c != document_column]
            if not candidates:
                raise ValueError(f"Could not find a text column for the queries in the dataset (columns: {columns}).")
            query_column = candidates[0]
        if document_column is None:
            candidates = [c for c in text_columns if c != query_column]
            if not candidates:
                raise ValueError(
                    f"Could not find a second text column for the documents in the dataset (columns: {columns}); "
                    "the sampler needs (query, document) pairs."
                )
            document_column = candidates[0]
        if query_column == document_column:
            raise ValueError(f"query_column and document_column are both {query_column!r}.")
        return query_column, document_column

    def _get_clustering(
        self,
        dataset: Dataset,
        q_emb: np.ndarray | None,
        d_emb: np.ndarray | None,
        domain_values: list[Hashable] | None,
        *,
        model: SentenceTransformer | str | os.PathLike | None,
        device: str | None,
        encode_batch_size: int,
        max_seq_length: int | None,
        cache: bool,
        cache_dir: Path,
        settings: dict[str, Any],
    ) -> PairClustering:
        num_rows = len(dataset)
        world_size, rank = _dist_world()
        if world_size > 1:
            # One process clusters and the others receive the result, so that every rank packs the same batches
            # (independent k-means runs may differ in the last bits and so in a few assignments).
            payload: list[Any] = [None]
            if rank == 0:
                payload[0] = self._compute_or_load(
                    dataset, q_emb, d_emb, domain_values, model, device, encode_batch_size, max_seq_length,
                    cache, cache_dir, settings,
                )  # fmt: skip
            torch.distributed.broadcast_object_list(payload, src=0)
            clustering = payload[0]
        else:
            clustering = self._compute_or_load(
                dataset, q_emb, d_emb, domain_values, model, device, encode_batch_size, max_seq_length,
                cache, cache_dir, settings,
            )  # fmt: skip
        if len(clustering.labels) != num_rows:  # pragma: no cover - defensive
            raise RuntimeError("The clustering does not cover the dataset.")
        return clustering

    def _compute_or_load(
        self,
        dataset: Dataset,
        q_emb: np.ndarray | None,
        d_emb: np.ndarray | None,
        domain_values: list[Hashable] | None,
        model: SentenceTransformer | str | os.PathLike | None,
        device: str | None,
        encode_batch_size: int,
        max_seq_length: int | None,
        cache: bool,
        cache_dir: Path,
        settings: dict[str, Any],
    ) -> PairClustering:
        num_rows = len(dataset)
        codes, names = _encode_domains(domain_values, num_rows)

        queries = documents = None
        hasher = hashlib.sha256()
        hasher.update(f"v{_CACHE_VERSION}:{num_rows}".encode())
        for key in ("cluster_size", "seed", "niter", "max_points_per_centroid"):
            hasher.update(f"|{key}={settings[key]}".encode())
        _hash_array(hasher, codes)
        _hash_texts(hasher, [repr(name) for name in names])
        if q_emb is not None:
            hasher.update(b"|precomputed")
            _hash_array(hasher, np.asarray(q_emb, dtype=np.float32))
            _hash_array(hasher, np.asarray(d_emb, dtype=np.float32))
        else:
            if model is None:
                from cde_st._defaults import default_surrogate_model_path

                model = default_surrogate_model_path()
            queries = ["" if t is None else t for t in dataset[self.query_column]]
            documents = ["" if t is None else t for t in dataset[self.document_column]]
            hasher.update(f"|model={_model_fingerprint(model)}|max_seq_length={max_seq_length}".encode())
            _hash_texts(hasher, queries)
            hasher.update(b"|documents")
            _hash_texts(hasher, documents)
        key = hasher.hexdigest()[:32]
        self.cache_path = cache_dir / f"clusters-{key}.npz" if cache else None

        if self.cache_path is not None and self.cache_path.exists():
            clustering = _load_clustering(self.cache_path, num_rows, names)
            if clustering is not None:
                logger.info("Loaded the pair clustering from %s", self.cache_path)
                self.timings = {"embed_s": 0.0, "cluster_s": 0.0}
                return clustering

        start = time.perf_counter()
        if q_emb is None:
            surrogate = model
            if isinstance(model, (str, os.PathLike)):
                from sentence_transformers import SentenceTransformer

                surrogate = SentenceTransformer(os.fspath(model), device=device)
                surrogate.eval()
            q_emb, d_emb = embed_pairs(
                surrogate,
                queries,
                documents,
                batch_size=encode_batch_size,
                max_seq_length=max_seq_length,
                show_progress_bar=settings["show_progress_bar"],
            )
        embedded = time.perf_counter()
        clustering = cluster_pairs(q_emb, d_emb, domains=domain_values, **settings)
        self.timings = {"embed_s": embedded - start, "cluster_s": time.perf_counter() - embedded}
        logger.info(
            "Clustered %d pairs into %d clusters (embedding %.1fs, k-means %.1fs)",
            num_rows,
            clustering.num_clusters,
            self.timings["embed_s"],
            self.timings["cluster_s"],
        )
        if self.cache_path is not None:
            meta = {k: v for k, v in settings.items() if k != "show_progress_bar"}
            meta.update(rows=num_rows, query_column=self.query_column, document_column=self.document_column)
            try:
                _save_clustering(self.cache_path, clustering, meta)
            except OSError as exc:
                logger.warning("Could not write the clustering cache %s (%s)", self.cache_path, exc)
        return clustering

    # ---- iteration -----------------------------------------------------------------------------------------

    def epoch_batches(self, epoch: int | None = None) -> list[list[int]]:
        """The global batch order of an epoch (all ranks), before any ``rank=`` selection."""
        epoch = self.epoch if epoch is None else epoch
        rng = np.random.default_rng(self.seed + epoch)
        full = [b for b in self.batches if len(b) == self.batch_size]
        short = [b for b in self.batches if len(b) < self.batch_size]
        # Short batches go last: accelerate's BatchSamplerShard assumes only the final batch may be short.
        ordered = [full[i] for i in rng.permutation(len(full))]
        if self.num_replicas == 1:
            if not self.drop_last:
                ordered += [short[i] for i in rng.permutation(len(short))]
            return [b.tolist() for b in ordered]

        # Several processes: only full batches, a multiple of num_replicas of them, so no rank waits for another.
        if not self.drop_last:
            ordered += [self._top_up(short[i], rng) for i in rng.permutation(len(short))]
        surplus = len(ordered) % self.num_replicas
        if surplus and self.drop_last:
            ordered = ordered[: len(ordered) - surplus]
        elif surplus:
            missing = self.num_replicas - surplus
            ordered += [ordered[i % len(ordered)] for i in range(missing)]
        if not self.drop_last and not self._warned_padding and (short or surplus):
            self._warned_padding = True
            logger.warning(
                "ClusteredBatchSampler: to give %d processes equal numbers of full batches, some rows are repeated "
                "within an epoch (as torch's DistributedSampler does). Set drop_last=True to drop them instead.",
                self.num_replicas,
            )
        return [b.tolist() for b in ordered]

    def _top_up(self, batch: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Fill a short batch with other rows of its own domain (repeating rows only if the domain is too small)."""
        domain = self.clustering.cluster_domains[self.clustering.labels[batch[0]]]
        same_domain = np.flatnonzero(self.clustering.cluster_domains[self.clustering.labels] == domain)
        others = np.setdiff1d(same_domain, batch, assume_unique=True)
        need = self.batch_size - len(batch)
        if len(others) >= need:
            extra = rng.choice(others, need, replace=False)
        else:
            extra = rng.choice(same_domain, need, replace=True)
        return np.concatenate([batch, extra])

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.epoch_batches()
        if self.rank is not None:
            batches = batches[self.rank :: self.num_replicas]
        yield from batches

    def __len__(self) -> int:
        full = sum(len(b) == self.batch_size for b in self.batches)
        total = full if self.drop_last else len(self.batches)
        n = self.num_replicas
        if n > 1:
            total = total // n * n if self.drop_last else -(-total // n) * n
            if self.rank is not None:
                total //= n
        return total


__all__ = [
    "ClusteredBatchSampler",
    "PairClustering",
    "cluster_pairs",
    "default_cache_dir",
    "embed_pairs",
    "in_batch_negative_similarity",
    "num_clusters_for",
    "order_clusters",
    "pack_clusters",
]
