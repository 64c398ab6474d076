"""The pair clustering of a training dataset, computed once and cached: the clustered sampler's preparation.

From a dataset's (query, document) columns to a :class:`~cde_st.batching.PairClustering`: look the inputs up in
the on-disk cache (:mod:`~cde_st.batching.cache`); on a miss, embed the pairs with the surrogate
(:mod:`~cde_st.batching.surrogate`), cluster them (:func:`~cde_st.batching.cluster_pairs`) and store the result.
:class:`~cde_st.batching.ClusteredBatchSampler` calls it on one process and shares the result with the others.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sentence_transformers import SentenceTransformer

from cde_st.batching.cache import clustering_key, embedding_cache_key, load_clustering, save_clustering
from cde_st.batching.clustering import PairClustering, cluster_pairs, encode_domains
from cde_st.batching.static_surrogate import StaticSurrogate
from cde_st.batching.surrogate import (
    SurrogateKind,
    embed_pairs,
    fit_static_surrogate,
    import_model2vec,
    load_transformer_surrogate,
)
from cde_st.data import column
from cde_st.defaults import default_surrogate_model_path

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

# Bump when the static surrogate's preparation (distillation, fit) changes: part of its clustering cache key.
_STATIC_VERSION = 1


@dataclass
class DatasetClustering:
    """The result of :func:`cluster_dataset`.

    Attributes:
        clustering: the pairs' clusters.
        cache_path: the cache file of this clustering (``None`` without a cache); it exists once stored.
        timings: seconds spent embedding (``embed_s``) and clustering (``cluster_s``); zeros when loaded.
    """

    clustering: PairClustering
    cache_path: Path | None
    timings: dict[str, float] = field(default_factory=lambda: {"embed_s": 0.0, "cluster_s": 0.0})


def surrogate_cache_key(
    surrogate: SentenceTransformer | StaticSurrogate | str | os.PathLike,
    surrogate_kind: SurrogateKind,
    static_fit_pairs: int,
    static_dims: int,
) -> str:
    """What identifies the surrogate in a clustering's cache key: its fingerprint, plus for a static surrogate
    distilled here the preparation settings and the model2vec version (the transformer key has no suffix, so
    clusterings cached before the static surrogate existed still load)."""
    if isinstance(surrogate, StaticSurrogate):
        return surrogate.fingerprint()
    key = embedding_cache_key(surrogate)
    if surrogate_kind == "static":
        version = import_model2vec().__version__
        key += f"|static:v{_STATIC_VERSION}:fit{static_fit_pairs}:d{static_dims}:model2vec{version}"
    return key


@dataclass(frozen=True)
class ClusteringOptions:
    """How :func:`cluster_dataset` embeds and clusters the pairs: the clustering options of
    :class:`~cde_st.batching.ClusteredBatchSampler` (documented there), declared once with their defaults.

    Example:
        >>> ClusteringOptions(cluster_size=32, surrogate_kind="static").niter
        20
    """

    cluster_size: int
    seed: int = 0
    query_column: str | None = None
    document_column: str | None = None
    surrogate: SentenceTransformer | StaticSurrogate | str | os.PathLike | None = None
    surrogate_kind: SurrogateKind = "transformer"
    static_fit_pairs: int = 4096
    static_dims: int = 128
    niter: int = 20
    max_points_per_centroid: int = 256
    use_gpu: bool | None = None
    device: str | None = None
    encode_batch_size: int = 64
    max_seq_length: int | None = None
    cache_dir: Path | None = None
    show_progress_bar: bool = False

    def kmeans_settings(self) -> dict[str, Any]:
        """The options of :func:`~cde_st.batching.cluster_pairs` (and of the cache key)."""
        return dict(
            cluster_size=self.cluster_size,
            seed=self.seed,
            niter=self.niter,
            max_points_per_centroid=self.max_points_per_centroid,
            use_gpu=self.use_gpu,
            show_progress_bar=self.show_progress_bar,
        )


def cluster_dataset(
    dataset: Dataset,
    options: ClusteringOptions | None = None,
    *,
    embeddings: tuple[np.ndarray, np.ndarray] | None = None,
    domains: list[Hashable] | None = None,
    **fields: Any,
) -> DatasetClustering:
    """Cluster the (query, document) pairs of ``dataset``, or load the clustering cached for the same inputs.

    ``options`` (or its fields as keywords, e.g. ``cluster_size=32``) are :class:`ClusteringOptions`, already checked
    by :class:`~cde_st.batching.ClusteredBatchSampler`: either precomputed ``embeddings`` or the text columns and a
    ``surrogate`` (``None``: the offline all-MiniLM-L6-v2) of kind ``surrogate_kind``. The texts are read only when
    there are no ``embeddings``. ``cache_dir=None`` neither reads nor writes a cache.
    """
    if options is None:
        options = ClusteringOptions(**fields)
    elif fields:
        options = dataclasses.replace(options, **fields)
    num_rows = len(dataset)
    codes, names = encode_domains(domains, num_rows)
    settings = options.kmeans_settings()
    queries = documents = None
    surrogate = options.surrogate
    if embeddings is not None:
        key = clustering_key(num_rows, settings, codes, names, embeddings=embeddings)
    else:
        if surrogate is None:
            surrogate = default_surrogate_model_path()
        queries = ["" if t is None else t for t in column(dataset, options.query_column)]
        documents = ["" if t is None else t for t in column(dataset, options.document_column)]
        surrogate_key = surrogate_cache_key(
            surrogate, options.surrogate_kind, options.static_fit_pairs, options.static_dims
        )
        key = clustering_key(
            num_rows,
            settings,
            codes,
            names,
            surrogate_key=surrogate_key,
            max_seq_length=options.max_seq_length,
            queries=queries,
            documents=documents,
        )
    cache_path = options.cache_dir / f"clusters-{key}.npz" if options.cache_dir is not None else None
    if cache_path is not None and cache_path.exists():
        clustering = load_clustering(cache_path, num_rows, names)
        if clustering is not None:
            logger.info("Loaded the pair clustering from %s", cache_path)
            return DatasetClustering(clustering, cache_path)

    start = time.perf_counter()
    q_emb, d_emb = embeddings if embeddings is not None else _embed(surrogate, queries, documents, options)
    embedded = time.perf_counter()
    clustering = cluster_pairs(q_emb, d_emb, domains=domains, **settings)
    timings = {"embed_s": embedded - start, "cluster_s": time.perf_counter() - embedded}
    logger.info(
        "Clustered %d pairs into %d clusters (embedding %.1fs, k-means %.1fs)",
        num_rows,
        clustering.num_clusters,
        timings["embed_s"],
        timings["cluster_s"],
    )
    if cache_path is not None:
        _store(cache_path, clustering, settings, num_rows, options)
    return DatasetClustering(clustering, cache_path, timings)


def _embed(
    surrogate: SentenceTransformer | StaticSurrogate | str | os.PathLike,
    queries: list[str],
    documents: list[str],
    options: ClusteringOptions,
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs embedded by the surrogate: a transformer (loaded when given by path), a given static surrogate, or
    one distilled and fitted here (``surrogate_kind="static"``)."""
    model = surrogate
    if options.surrogate_kind == "static" and not isinstance(surrogate, StaticSurrogate):
        model = fit_static_surrogate(
            surrogate,
            queries,
            documents,
            fit_pairs=options.static_fit_pairs,
            dims=options.static_dims,
            max_seq_length=options.max_seq_length,
            seed=options.seed,
            device=options.device,
            encode_batch_size=options.encode_batch_size,
            show_progress_bar=options.show_progress_bar,
        )
    elif isinstance(surrogate, (str, os.PathLike)):
        model = load_transformer_surrogate(surrogate, device=options.device)
    return embed_pairs(
        model,
        queries,
        documents,
        batch_size=options.encode_batch_size,
        max_seq_length=options.max_seq_length,
        show_progress_bar=options.show_progress_bar,
    )


def _store(
    cache_path: Path, clustering: PairClustering, settings: dict[str, Any], num_rows: int, options: ClusteringOptions
) -> None:
    """Write the clustering to the cache; a cache that cannot be written is a warning, not an error."""
    meta = {k: v for k, v in settings.items() if k != "show_progress_bar"}
    meta.update(rows=num_rows, query_column=options.query_column, document_column=options.document_column)
    try:
        save_clustering(cache_path, clustering, meta)
    except OSError as exc:
        logger.warning("Could not write the clustering cache %s (%s)", cache_path, exc)


__all__ = ["ClusteringOptions", "DatasetClustering", "cluster_dataset", "surrogate_cache_key"]
