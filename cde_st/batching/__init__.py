"""Contextual batching: a clustered batch sampler for ``SentenceTransformerTrainer``.

Contextual Document Embeddings (Morris & Rush, ICLR 2025, https://arxiv.org/abs/2410.02525), section 3.1:
training pairs are partitioned into pseudo-domains of similar pairs so that every batch holds hard in-batch
negatives. Each pair (q, d) is embedded with a small surrogate model, turned into the two points [q;d] and
[d;q], and clustered with spherical k-means (k = pairs / cluster_size) within its source dataset; each pair is
assigned by its [q;d] point. Clusters are then packed into batches of exactly ``batch_size``: big clusters
are split, small ones are merged with their nearest neighbours in a greedy nearest-centroid tour.

One file per step, each a plain function, so that the sampler, the training scripts and the benchmarks all run
the same code:

- :mod:`~cde_st.batching.surrogate`: :func:`embed_pairs`, the surrogate embeddings of the pairs, with a
  transformer or a fast static surrogate (:func:`load_static_surrogate`, :func:`distill_static_surrogate`,
  :func:`fit_static_surrogate`);
- :mod:`~cde_st.batching.static_surrogate`: :class:`StaticSurrogate`, the static-embedding model itself;
- :mod:`~cde_st.batching.clustering`: :func:`cluster_pairs` (faiss spherical k-means per domain),
  :class:`PairClustering`, :func:`num_clusters_for`;
- :mod:`~cde_st.batching.packing`: :func:`order_clusters`, :func:`pack_clusters` (clusters into batches);
- :mod:`~cde_st.batching.hardness`: :func:`in_batch_negative_similarity` (how hard the batches are);
- :mod:`~cde_st.batching.cache`: :func:`default_cache_dir` and the on-disk cache of clusterings (and
  :func:`default_surrogate_cache_dir`, where distilled static surrogates are kept);
- :mod:`~cde_st.batching.dataset_clustering`: :func:`cluster_dataset`, a dataset's pairs embedded and clustered
  once, through the cache, as :class:`ClusteringOptions` say (the sampler's clustering options, declared once);
- :mod:`~cde_st.batching.sampler`: :class:`ClusteredBatchSampler`, which wires them into a sentence-transformers
  batch sampler. Its ``surrogate=`` is the model that embeds the pairs for the clustering, not the model being
  trained.
  :mod:`~cde_st.batching.sampler_inputs` checks its options and reads its dataset's domains and text columns.
"""

from cde_st.batching.cache import default_cache_dir, default_surrogate_cache_dir
from cde_st.batching.clustering import PairClustering, cluster_pairs, num_clusters_for
from cde_st.batching.dataset_clustering import ClusteringOptions, DatasetClustering, cluster_dataset
from cde_st.batching.hardness import in_batch_negative_similarity
from cde_st.batching.packing import ClusterOrder, order_clusters, pack_clusters
from cde_st.batching.sampler import ClusteredBatchSampler
from cde_st.batching.static_surrogate import StaticSurrogate
from cde_st.batching.surrogate import (
    distill_static_surrogate,
    embed_pairs,
    fit_static_surrogate,
    load_static_surrogate,
)

__all__ = [
    "ClusterOrder",
    "ClusteredBatchSampler",
    "ClusteringOptions",
    "DatasetClustering",
    "PairClustering",
    "StaticSurrogate",
    "cluster_dataset",
    "cluster_pairs",
    "default_cache_dir",
    "default_surrogate_cache_dir",
    "distill_static_surrogate",
    "embed_pairs",
    "fit_static_surrogate",
    "in_batch_negative_similarity",
    "load_static_surrogate",
    "num_clusters_for",
    "order_clusters",
    "pack_clusters",
]
