"""On-disk cache of pair clusterings: the cache folders, fingerprints of the inputs, the cache key, save and load."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from cde_st.atomic_files import write_atomically
from cde_st.batching.clustering import PairClustering
from cde_st.model import contextual_module, is_contextual

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

# Bump when the clustering algorithm changes in a way that invalidates cached results.
_CACHE_VERSION = 1


def _cache_root() -> Path:
    """``$CDE_ST_CACHE`` if set, else ``~/.cache/cde_st``."""
    return Path(os.environ.get("CDE_ST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cde_st"))


def default_cache_dir() -> Path:
    """``$CDE_ST_CACHE/clusters`` if set, else ``~/.cache/cde_st/clusters``."""
    return _cache_root() / "clusters"


def default_surrogate_cache_dir() -> Path:
    """Where distilled static surrogates are kept: ``$CDE_ST_CACHE/surrogates``, else ``~/.cache/cde_st/surrogates``."""
    return _cache_root() / "surrogates"


def _hash_texts(hasher: Any, texts: Sequence[Any]) -> None:
    for text in texts:
        hasher.update(b"\x00")
        hasher.update(str(text).encode("utf-8", "surrogatepass"))


def _hash_array(hasher: Any, array: np.ndarray) -> None:
    array = np.ascontiguousarray(array)
    hasher.update(f"{array.dtype.str}{array.shape}".encode())
    hasher.update(memoryview(array).cast("B"))


def embedding_cache_key(model: SentenceTransformer | str) -> str:
    """The cache key of a surrogate's embeddings: a path/hub id with its weight files' sizes and mtimes, or a model's
    every weight byte and its active context's embedding fingerprint.

    Not :func:`cde_st.fingerprints.model_fingerprint`: a cache must never hand back embeddings another input would
    change, so it keys every byte (not a sample), the context that changes each embedding, and for a folder the
    files themselves (read without loading the model)."""
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
    if is_contextual(model):  # its context is no weight, yet every embedding depends on it
        hasher.update(f"context:{contextual_module(model).embedding_fingerprint()}".encode())
    for name, tensor in model.state_dict().items():
        hasher.update(name.encode())
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        hasher.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return hasher.hexdigest()


def clustering_key(
    num_rows: int,
    settings: dict[str, Any],
    domain_codes: np.ndarray,
    domain_names: Sequence[Hashable],
    *,
    embeddings: tuple[np.ndarray, np.ndarray] | None = None,
    surrogate_key: str | None = None,
    max_seq_length: int | None = None,
    queries: Sequence[str] = (),
    documents: Sequence[str] = (),
) -> str:
    """The cache key of a clustering: a hash of the rows' domains, the clustering settings and either the
    precomputed ``embeddings`` or the surrogate (``surrogate_key``, ``max_seq_length``) with the texts.

    The byte layout is part of the cache format: a change makes every cached clustering unreachable (then bump
    ``_CACHE_VERSION`` rather than leave stale files that look valid).
    """
    hasher = hashlib.sha256()
    hasher.update(f"v{_CACHE_VERSION}:{num_rows}".encode())
    for key in ("cluster_size", "seed", "niter", "max_points_per_centroid"):
        hasher.update(f"|{key}={settings[key]}".encode())
    _hash_array(hasher, domain_codes)
    _hash_texts(hasher, [repr(name) for name in domain_names])
    if embeddings is not None:
        hasher.update(b"|precomputed")
        _hash_array(hasher, np.asarray(embeddings[0], dtype=np.float32))
        _hash_array(hasher, np.asarray(embeddings[1], dtype=np.float32))
    else:
        hasher.update(f"|model={surrogate_key}|max_seq_length={max_seq_length}".encode())
        _hash_texts(hasher, queries)
        hasher.update(b"|documents")
        _hash_texts(hasher, documents)
    return hasher.hexdigest()[:32]


def save_clustering(path: Path, clustering: PairClustering, meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(file) -> None:
        np.savez(
            file,
            labels=clustering.labels,
            centroids=clustering.centroids,
            cluster_domains=clustering.cluster_domains,
            domain_names=np.array(json.dumps([str(n) if n is not None else None for n in clustering.domain_names])),
            meta=np.array(json.dumps(meta)),
        )

    # A concurrent reader sees the old file or the complete new one; no fsync: a cache lost to a power cut is
    # recomputed.
    write_atomically(path, write, fsync=False)


def load_clustering(path: Path, num_rows: int, domain_names: list[Hashable]) -> PairClustering | None:
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


__all__ = [
    "clustering_key",
    "default_cache_dir",
    "default_surrogate_cache_dir",
    "load_clustering",
    "embedding_cache_key",
    "save_clustering",
]
