"""Data and sampler factories shared by the tests of cde_st.batching (tests/batching/test_*.py)."""

from __future__ import annotations

import numpy as np
from datasets import Dataset

from cde_st.batching import ClusteredBatchSampler


def structured_embeddings(n: int, dim: int = 16, topics: int = 12, noise: float = 0.3, seed: int = 0):
    """Pairs drawn around ``topics`` random directions: (q, d, topic of each pair)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(topics, dim))
    topic = rng.integers(topics, size=n)
    q = centres[topic] + noise * rng.normal(size=(n, dim))
    d = centres[topic] + noise * rng.normal(size=(n, dim))
    return q.astype(np.float32), d.astype(np.float32), topic


def pair_dataset(n: int, **extra_columns) -> Dataset:
    data = {"query": [f"query {i}" for i in range(n)], "document": [f"document {i}" for i in range(n)]}
    data.update(extra_columns)
    return Dataset.from_dict(data)


def make_sampler(dataset, batch_size=16, drop_last=False, seed=0, embeddings=None, tmp_path=None, **kwargs):
    if embeddings is None:
        q, d, _ = structured_embeddings(len(dataset))
        embeddings = (q, d)
    kwargs.setdefault("show_progress_bar", False)
    if tmp_path is not None:
        kwargs.setdefault("cache_dir", tmp_path / "clusters")
    else:
        kwargs.setdefault("cache", False)
    return ClusteredBatchSampler(dataset, batch_size, drop_last, seed=seed, embeddings=embeddings, **kwargs)


def rows_of(batches) -> list[int]:
    return sorted(i for batch in batches for i in batch)


TOPICS = {
    "space": "rocket orbit planet launch satellite moon",
    "food": "bread cheese recipe oven kitchen flour",
    "music": "guitar song concert band melody drums",
    "law": "court judge lawyer trial verdict appeal",
}


def topic_dataset(n: int, seed: int = 0) -> tuple[Dataset, np.ndarray]:
    """Pairs whose query and document share a topic's words; (dataset, topic of each pair)."""
    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    topic = rng.integers(len(names), size=n)
    words = {name: TOPICS[name].split() for name in names}
    queries = [" ".join(rng.choice(words[names[t]], 3)) + f" question {i}" for i, t in enumerate(topic)]
    documents = [" ".join(rng.choice(words[names[t]], 8)) + f" answer {i}" for i, t in enumerate(topic)]
    return Dataset.from_dict({"query": queries, "document": documents}), topic
