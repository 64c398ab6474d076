"""BM25 over whitespace-separated words with the IDF given from outside: the corpus-statistics benchmark's ceiling
and floor, which differ only in where a word's weight comes from (this corpus, other corpora, or nowhere).

Okapi BM25 (k1 = 1.2, b = 0.75; Lucene's IDF ``ln(1 + (N - n + 0.5) / (n + 0.5))``), dense over a small vocabulary.
The IDF is a parameter because the point is to swap it; a BM25 library fixes it to the scored corpus.

    >>> vocab = {"a": 0, "b": 1, "c": 2}
    >>> counts = term_counts(["a a b", "c c"], vocab)
    >>> scores = bm25_scores(term_counts(["c"], vocab), counts, idf=np.ones(3))
    >>> int(scores.argmax())
    1
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["bm25_scores", "document_frequency", "idf", "ndcg_at_10", "term_counts"]


def term_counts(texts: Sequence[str], vocab: dict[str, int]) -> np.ndarray:
    """(len(texts), V) word counts; a word outside ``vocab`` is an error (every generated word is in it)."""
    counts = np.zeros((len(texts), len(vocab)), dtype=np.float64)
    for row, text in enumerate(texts):
        for word in text.split():
            counts[row, vocab[word]] += 1
    return counts


def document_frequency(counts: np.ndarray) -> np.ndarray:
    """(V,) how many of the documents hold each word."""
    return (counts > 0).sum(axis=0).astype(np.float64)


def idf(doc_freq: np.ndarray, documents: int) -> np.ndarray:
    """Lucene's BM25 IDF of each word from its document frequency among ``documents`` documents."""
    return np.log1p((documents - doc_freq + 0.5) / (doc_freq + 0.5))


def bm25_scores(
    query_counts: np.ndarray, doc_counts: np.ndarray, idf: np.ndarray, k1: float = 1.2, b: float = 0.75
) -> np.ndarray:
    """(Q, N) BM25 scores of every query against every document under the given (V,) ``idf``."""
    lengths = doc_counts.sum(axis=1, keepdims=True)
    norm = k1 * (1 - b + b * lengths / lengths.mean())
    saturated = doc_counts * (k1 + 1) / (doc_counts + norm)  # (N, V)
    return (query_counts * idf) @ saturated.T


def ndcg_at_10(scores: np.ndarray, targets: Sequence[int]) -> float:
    """Mean NDCG@10 (0-100) of one relevant document per query (``targets[i]`` for row i); ties ranked against the
    target (the pessimistic rule: a tie never helps)."""
    target_scores = scores[np.arange(len(targets)), np.asarray(targets)]
    rank = (scores >= target_scores[:, None]).sum(axis=1) - 1  # 0-based, ties counted ahead
    gains = np.where(rank < 10, 1.0 / np.log2(rank + 2.0), 0.0)
    return 100.0 * float(gains.mean())
