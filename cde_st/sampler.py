"""Kept for compatibility: the contextual-batching code now lives in :mod:`cde_st.batching`.

``from cde_st.sampler import ClusteredBatchSampler`` (and the other public names below) keeps working, and so do
training checkpoints whose pickled ``batch_sampler`` option refers to ``cde_st.sampler.ClusteredBatchSampler``.
New code should import from :mod:`cde_st.batching` (or ``cde_st`` for the sampler).
"""

from cde_st.batching import (
    ClusteredBatchSampler,
    ClusterOrder,
    PairClustering,
    cluster_pairs,
    default_cache_dir,
    embed_pairs,
    in_batch_negative_similarity,
    num_clusters_for,
    order_clusters,
    pack_clusters,
)

__all__ = [
    "ClusterOrder",
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
