"""Batch hardness: how similar a query is to the other documents of its batch (the in-batch negatives)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cde_st.batching.clustering import normalize_rows


def in_batch_negative_similarity(batches: Sequence[Sequence[int]], q_emb: np.ndarray, d_emb: np.ndarray) -> float:
    """Batch hardness: the mean cosine similarity between each query and the *other* documents of its batch.

    Averaged over all (query, other document) pairs of all batches; batches of one row contribute nothing.

    Args:
        batches: row indices of each batch.
        q_emb: (N, D) query embeddings (any scale; normalised here).
        d_emb: (N, D) document embeddings.
    """
    q, d = normalize_rows(q_emb), normalize_rows(d_emb)
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


__all__ = ["in_batch_negative_similarity"]
