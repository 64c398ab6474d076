"""The on-disk cache of clusterings: where it lives and what its keys are."""

from __future__ import annotations

import os

import numpy as np
from batching_helpers import pair_dataset, rows_of, structured_embeddings

from cde_st.batching import ClusteredBatchSampler, cluster_pairs
from cde_st.batching.cache import save_clustering


def test_cache_dir_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("CDE_ST_CACHE", str(tmp_path))
    sampler = ClusteredBatchSampler(
        pair_dataset(50), 8, False, embeddings=structured_embeddings(50)[:2], show_progress_bar=False
    )
    assert sampler.cache_path.parent == tmp_path / "clusters" and sampler.cache_path.exists()


def _fixed_pairs(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    q = (np.arange(n * 6, dtype=np.float32).reshape(n, 6) % 7) - 3.0
    d = (np.arange(n * 6, dtype=np.float32).reshape(n, 6) % 5) - 2.0
    return q, d


def test_cache_keys_are_those_of_the_code_before_the_split(tmp_path, monkeypatch):
    """Clusterings cached before the batching code was split are found again: the keys below were
    computed by that code (commit 02b9c3b) for the same inputs."""
    q, d = _fixed_pairs()
    ds = pair_dataset(40)
    kwargs = dict(cache_dir=tmp_path / "clusters", show_progress_bar=False)
    precomputed = ClusteredBatchSampler(ds, 8, False, embeddings=(q, d), domains=["a", "b"] * 20, **kwargs)
    assert precomputed.cache_path.name == "clusters-624252d6317dbadb54d4c1ecabb9af6f.npz"

    # A surrogate given by path: the key hashes the path and its files' sizes and modification times. A cache
    # file stored under the old key must be loaded as is (nothing is embedded: the folder holds no model).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "surrogate").mkdir()
    weights = tmp_path / "surrogate" / "weights.bin"
    weights.write_bytes(b"x" * 10)
    os.utime(weights, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    old_key = tmp_path / "clusters" / "clusters-e96b954f105916f42a8760cd43728c21.npz"
    save_clustering(old_key, cluster_pairs(q, d, cluster_size=8, seed=2), meta={})
    by_path = ClusteredBatchSampler(ds, 8, False, surrogate="surrogate", max_seq_length=16, seed=2, **kwargs)
    assert by_path.cache_path == old_key and by_path.timings == {"embed_s": 0.0, "cluster_s": 0.0}
    assert rows_of(by_path) == list(range(40))


def test_a_contextual_surrogate_is_keyed_by_its_context(make_tiny_cde):
    """A contextual model given as the surrogate embeds the pairs with its context: two contexts are two cache
    keys (its context is no weight, so a key of the weights alone would reuse the other context's clustering)."""
    from cde_st.batching.cache import embedding_cache_key

    model = make_tiny_cde(context_size=4)
    model.set_context(["rain falls", "stocks fell", "cats sleep", "tea leaves"], seed=0)
    first = embedding_cache_key(model)
    model.set_context(["mars is red", "ice melts", "birds sing", "rivers run"], seed=0)
    assert embedding_cache_key(model) != first
    model.set_context(["rain falls", "stocks fell", "cats sleep", "tea leaves"], seed=0)
    assert embedding_cache_key(model) == first
