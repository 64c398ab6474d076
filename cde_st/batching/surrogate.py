"""Surrogate embeddings of the pairs, the input of the clustering."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)


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


__all__ = ["embed_pairs"]
