"""ClusteredBatchSampler and the contextual-batching functions (DESIGN.md sections 1.4 and 2, "Sampler")."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from cde_st.batching import (
    ClusteredBatchSampler,
    StaticSurrogate,
    cluster_pairs,
    distill_static_surrogate,
    embed_pairs,
    in_batch_negative_similarity,
    load_static_surrogate,
    order_clusters,
    pack_clusters,
)

REPO = Path(__file__).resolve().parents[1]


# ---- helpers --------------------------------------------------------------------------------------------------


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


# ---- plain functions ------------------------------------------------------------------------------------------


def test_public_names_importable_from_their_old_homes():
    """cde_st/sampler.py was split into cde_st/batching/; old imports (and pickled checkpoint options) still work."""
    import pickle

    import cde_st
    import cde_st.batching as batching
    import cde_st.sampler as compat

    assert cde_st.ClusteredBatchSampler is batching.ClusteredBatchSampler
    assert len(compat.__all__) == 10
    for name in compat.__all__:
        assert getattr(compat, name) is getattr(batching, name), name
    # A checkpoint written before the split pickled the class by its old path.
    old = pickle.dumps(compat.ClusteredBatchSampler, protocol=0)  # text opcodes: the path can be edited
    assert pickle.loads(old.replace(b"cde_st.batching.sampler", b"cde_st.sampler")) is batching.ClusteredBatchSampler


def test_cluster_pairs_recovers_topics_and_is_deterministic():
    q, d, topic = structured_embeddings(1200, topics=12, noise=0.2)
    # k = 24 > 12 topics: k-means may split a topic but should not merge two.
    clustering = cluster_pairs(q, d, cluster_size=50, seed=3)
    assert clustering.num_clusters == 24
    assert clustering.labels.shape == (1200,)
    np.testing.assert_allclose(np.linalg.norm(clustering.centroids, axis=1), 1.0, atol=1e-4)
    # Purity: each cluster is dominated by one topic.
    purity = sum(Counter(topic[clustering.labels == c]).most_common(1)[0][1] for c in set(clustering.labels))
    assert purity / len(topic) > 0.95
    again = cluster_pairs(q, d, cluster_size=50, seed=3)
    np.testing.assert_array_equal(clustering.labels, again.labels)
    np.testing.assert_array_equal(clustering.centroids, again.centroids)


def test_cluster_pairs_uses_both_orientations():
    # A pair's [q;d] point and its [d;q] point are both training points: with q/d from disjoint topic sets,
    # the k-means centroids must cover the flipped points too (else half of the centroid would be q-like only).
    q, d, _ = structured_embeddings(400, topics=4, noise=0.1, seed=1)
    clustering = cluster_pairs(q, d, cluster_size=200, seed=0)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    dn = d / np.linalg.norm(d, axis=1, keepdims=True)
    qd = np.concatenate([qn, dn], axis=1) / np.sqrt(2)
    dq = np.concatenate([dn, qn], axis=1) / np.sqrt(2)
    # Assignment is by [q;d]: it matches the nearest centroid of the [q;d] point.
    np.testing.assert_array_equal(clustering.labels, np.argmax(qd @ clustering.centroids.T, axis=1))
    assert (dq @ clustering.centroids.T).max(axis=1).mean() > 0.5


def test_cluster_pairs_within_domains():
    q, d, _ = structured_embeddings(600, topics=6)
    domains = ["a" if i % 3 else "b" for i in range(600)]
    clustering = cluster_pairs(q, d, cluster_size=50, domains=domains)
    assert clustering.domain_names == ["b", "a"]
    codes = np.array([clustering.domain_names.index(x) for x in domains])
    np.testing.assert_array_equal(clustering.cluster_domains[clustering.labels], codes)
    assert clustering.num_clusters == round(400 / 50) + round(200 / 50)


def test_order_clusters_greedy_tour_beats_random():
    rng = np.random.default_rng(0)
    centroids = rng.normal(size=(200, 8)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)

    def tour_similarity(tour):
        return float(np.mean(np.sum(centroids[tour[:-1]] * centroids[tour[1:]], axis=1)))

    greedy = order_clusters(centroids, "greedy", seed=0)
    random = order_clusters(centroids, "random", seed=0)
    assert sorted(greedy.tolist()) == list(range(200)) == sorted(random.tolist())
    assert tour_similarity(greedy) > tour_similarity(random) + 0.3
    np.testing.assert_array_equal(greedy, order_clusters(centroids, "greedy", seed=0))
    with pytest.raises(ValueError, match="order"):
        order_clusters(centroids, "tsp")


def test_pack_clusters_exact_batches_and_every_row_once():
    rng = np.random.default_rng(0)
    # Cluster sizes from 1 to 90 around a batch size of 16: big ones must be split, small ones merged.
    sizes = rng.integers(1, 90, size=30)
    labels = rng.permutation(np.repeat(np.arange(30), sizes))
    centroids = rng.normal(size=(31, 4)).astype(np.float32)  # cluster 30 is empty
    domains = np.arange(31) % 2
    batches = pack_clusters(labels, centroids, 16, cluster_domains=domains, order="greedy", seed=1)
    assert rows_of(batches) == list(range(len(labels)))
    short = [b for b in batches if len(b) != 16]
    assert len(short) <= 2 and all(0 < len(b) < 16 for b in short)
    for batch in batches:
        assert len(set(domains[labels[batch]])) == 1
    # A batch holds rows of few clusters: contiguous stretches of the cluster tour, not a random mix.
    clusters_per_batch = np.mean([len(set(labels[b])) for b in batches])
    assert clusters_per_batch < 3
    assert [b.tolist() for b in batches] == [
        b.tolist() for b in pack_clusters(labels, centroids, 16, cluster_domains=domains, seed=1)
    ]


def test_in_batch_negative_similarity():
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    d = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    # Batch (0, 2): both off-diagonal sims are 1; batch (1,): ignored.
    assert in_batch_negative_similarity([[0, 2], [1]], q, d) == pytest.approx(1.0)
    # Batch (0, 1, 2): off-diagonal sims q0.d1=0, q0.d2=1, q1.d0=0, q1.d2=0, q2.d0=1, q2.d1=0 -> 2/6.
    assert in_batch_negative_similarity([[0, 1, 2]], q, d) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        in_batch_negative_similarity([[0], [1]], q, d)


def test_embed_pairs_normalised_and_restores_max_length(tiny_st_model):
    before = tiny_st_model.max_seq_length
    q, d = embed_pairs(tiny_st_model, ["a query", "another"], ["a doc", "a second doc"], max_seq_length=8)
    assert q.shape == d.shape == (2, 32) and q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert tiny_st_model.max_seq_length == before


# ---- the sampler ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_row_once_per_epoch(drop_last):
    n, bs = 203, 16
    domains = ["x" if i < 150 else "y" for i in range(n)]
    sampler = make_sampler(pair_dataset(n), bs, drop_last, domains=domains, cluster_size=20)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        rows = rows_of(batches)
        assert len(rows) == len(set(rows)), "a row appeared twice in one epoch"
        if drop_last:
            # Only each domain's short tail is left out.
            assert len(rows) == 150 // bs * bs + 53 // bs * bs
            assert all(len(b) == bs for b in batches)
        else:
            assert rows == list(range(n))
            assert sum(len(b) != bs for b in batches) == 2  # one short batch per domain, at the end
            assert all(len(b) == bs for b in batches[:-2])


def test_deterministic_for_a_seed_and_varies_with_seed():
    ds = pair_dataset(300)
    a, b = make_sampler(ds, seed=5), make_sampler(ds, seed=5)
    assert list(a) == list(b)
    a.set_epoch(2), b.set_epoch(2)
    assert list(a) == list(b)
    c = make_sampler(ds, seed=6)
    assert list(c) != list(a)


def test_batch_order_changes_across_epochs_but_composition_does_not():
    sampler = make_sampler(pair_dataset(320), batch_size=16)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch0 != epoch1
    assert sorted(map(tuple, epoch0)) == sorted(map(tuple, epoch1))
    sampler.set_epoch(0)
    assert list(sampler) == epoch0


def test_generator_state_does_not_change_the_order():
    import torch

    ds = pair_dataset(160)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    torch.randperm(10, generator=g2)  # another sampler consumed the shared generator
    a = make_sampler(ds, generator=g1)
    b = make_sampler(ds, generator=g2)
    assert list(a) == list(b)


def test_clustered_batches_are_harder_than_random():
    q, d, topic = structured_embeddings(640, topics=20, noise=0.5)
    sampler = make_sampler(pair_dataset(640), batch_size=32, embeddings=(q, d), cluster_size=32)
    clustered = in_batch_negative_similarity(list(sampler), q, d)
    perm = np.random.default_rng(0).permutation(640)
    random = in_batch_negative_similarity([perm[i : i + 32] for i in range(0, 640, 32)], q, d)
    assert clustered > random + 0.3
    # Greedy tour packing beats a random cluster order when clusters are smaller than batches.
    small = make_sampler(pair_dataset(640), batch_size=32, embeddings=(q, d), cluster_size=8)
    small_random = make_sampler(pair_dataset(640), batch_size=32, embeddings=(q, d), cluster_size=8, order="random")
    assert in_batch_negative_similarity(list(small), q, d) > in_batch_negative_similarity(list(small_random), q, d)


def test_domains_from_list_domain_dataset_or_column():
    n = 240
    names = [("news", "qa", "chat")[i % 3] for i in range(n)]
    full = pair_dataset(n, domain=names)
    train = full.remove_columns("domain")
    from_list = make_sampler(train, domains=names)
    from_dataset = make_sampler(train, domain_dataset=full)
    with pytest.warns(UserWarning, match="collator"):
        from_column = make_sampler(full)
    assert list(from_list) == list(from_dataset) == list(from_column)
    for batch in from_list:
        assert len({names[i] for i in batch}) == 1
    # Without domains, clusters may (and with random embeddings do) mix the three groups.
    mixed = make_sampler(train)
    assert any(len({names[i] for i in batch}) > 1 for batch in mixed)


def test_text_columns_detected_and_configurable(tiny_st_model, tmp_path):
    texts = [f"text {i}" for i in range(40)]
    ds = Dataset.from_dict({"score": [0.5] * 40, "anchor": texts, "positive": texts, "negative": texts})
    kwargs = dict(model=tiny_st_model, cache_dir=tmp_path, show_progress_bar=False)
    detected = ClusteredBatchSampler(ds, 8, False, **kwargs)  # label columns are skipped
    assert (detected.query_column, detected.document_column) == ("anchor", "positive")
    explicit = ClusteredBatchSampler(ds, 8, False, query_column="anchor", document_column="negative", **kwargs)
    assert (explicit.query_column, explicit.document_column) == ("anchor", "negative")
    assert rows_of(explicit) == list(range(40))


def test_clustering_is_cached_on_disk(tiny_st_model, tmp_path, monkeypatch):
    ds = pair_dataset(64)
    first = ClusteredBatchSampler(ds, 8, False, model=tiny_st_model, cache_dir=tmp_path, show_progress_bar=False)
    assert first.cache_path.exists() and first.cache_path.parent == tmp_path

    import cde_st.batching.sampler as sampler_module

    def fail(*args, **kwargs):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(sampler_module, "cluster_pairs", fail)
    monkeypatch.setattr(sampler_module, "embed_pairs", fail)
    second = ClusteredBatchSampler(ds, 8, False, model=tiny_st_model, cache_dir=tmp_path, show_progress_bar=False)
    assert second.cache_path == first.cache_path
    assert list(second) == list(first)
    # Any change of data or parameters is a different key (and so recomputes).
    for other in (
        dict(dataset=pair_dataset(63)),
        dict(cluster_size=4),
        dict(seed=1),
        dict(domains=["a", "b"] * 32),
    ):
        kwargs = dict(dataset=ds, batch_size=8, drop_last=False, model=tiny_st_model, cache_dir=tmp_path)
        kwargs.update(other)
        with pytest.raises(AssertionError, match="recomputed"):
            ClusteredBatchSampler(show_progress_bar=False, **kwargs)


def test_cache_dir_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("CDE_ST_CACHE", str(tmp_path))
    sampler = ClusteredBatchSampler(
        pair_dataset(50), 8, False, embeddings=structured_embeddings(50)[:2], show_progress_bar=False
    )
    assert sampler.cache_path.parent == tmp_path / "clusters" and sampler.cache_path.exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(cluster_size=0), "cluster_size must be between 1"),
        (dict(cluster_size=41), "cluster_size must be between 1"),
        (dict(batch_size=0), "batch_size must be a positive integer"),
        (dict(query_column="question"), "query_column='question' is not a column"),
        (dict(document_column="answer"), "document_column='answer' is not a column"),
        (dict(domains=["a"] * 39), "domains for a dataset of 40 rows"),
        (dict(domain_dataset=pair_dataset(40)), "domain_dataset has no column 'domain'"),
        (dict(domain_dataset=pair_dataset(41, domain=["a"] * 41)), "row-aligned"),
        (dict(domains=["a"] * 40, domain_dataset=pair_dataset(40, domain=["a"] * 40)), "not both"),
        (dict(order="tsp"), "order must be"),
        (dict(embeddings=(np.zeros((40, 4)), np.zeros((40, 5)))), "embeddings must be two arrays"),
        (dict(embeddings=(np.zeros((39, 4)), np.zeros((39, 4)))), "one row per dataset row"),
        (dict(rank=2, num_replicas=2), "rank must be in"),
    ],
)
def test_bad_inputs_raise(kwargs, message):
    kwargs = dict(kwargs)
    batch_size = kwargs.pop("batch_size", 8)
    embeddings = kwargs.pop("embeddings", structured_embeddings(40)[:2])
    with pytest.raises(ValueError, match=message):
        ClusteredBatchSampler(
            pair_dataset(40), batch_size, False, embeddings=embeddings, cache=False, show_progress_bar=False, **kwargs
        )


def test_non_finite_surrogate_embeddings_are_named_not_left_to_faiss():
    q, d, _ = structured_embeddings(40)
    q = q.copy()
    q[7] = np.nan
    with pytest.raises(ValueError, match=r"1 of 40 query embeddings hold NaN or inf \(first: pair 7\).*surrogate"):
        ClusteredBatchSampler(pair_dataset(40), 8, False, embeddings=(q, d), cache=False, show_progress_bar=False)
    d = d.copy()
    d[3] = np.inf
    with pytest.raises(ValueError, match="document embeddings hold NaN or inf"):
        cluster_pairs(structured_embeddings(40)[0], d, cluster_size=8)


def test_bad_datasets_raise():
    with pytest.raises(ValueError, match="empty dataset"):
        ClusteredBatchSampler(pair_dataset(0), 8, False, cache=False)
    one_text = Dataset.from_dict({"text": ["a"] * 10, "label": [1] * 10})
    with pytest.raises(ValueError, match="second text column"):
        ClusteredBatchSampler(one_text, 4, False, cache=False)
    with pytest.raises(ValueError, match="cluster_size must be between 1"):
        cluster_pairs(np.ones((5, 3)), np.ones((5, 3)), cluster_size=6)
    with pytest.raises(ValueError, match="same shape"):
        cluster_pairs(np.ones((5, 3)), np.ones((4, 3)), cluster_size=2)
    with pytest.raises(ValueError, match="empty"):
        cluster_pairs(np.ones((0, 3)), np.ones((0, 3)), cluster_size=1)


def test_default_cluster_size_is_batch_size_clamped_to_rows():
    assert make_sampler(pair_dataset(100), batch_size=16).cluster_size == 16
    small = make_sampler(pair_dataset(10), batch_size=16)  # e.g. a small eval split
    assert small.cluster_size == 10 and rows_of(small) == list(range(10))


# ---- the static (fast) surrogate -----------------------------------------------------------------------------

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


@pytest.fixture(scope="module")
def static_root(tmp_path_factory, tiny_bert_dir):
    """A $CDE_ST_CACHE holding the static surrogate distilled (once, seconds) from the tiny BERT."""
    pytest.importorskip("model2vec", reason="model2vec is not installed (pip install 'cde_st[fast-surrogate]')")
    root = tmp_path_factory.mktemp("cde_st_cache")
    distill_static_surrogate(tiny_bert_dir, cache_dir=root / "surrogates")
    return root


def test_static_surrogate_sampler_gives_a_valid_clustering(static_root, tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CDE_ST_CACHE", str(static_root))
    ds, _ = topic_dataset(96)
    domains = ["a", "b"] * 48
    kwargs = dict(
        model=tiny_bert_dir, surrogate_kind="static", static_fit_pairs=32, static_dims=8, cluster_size=8,
        domains=domains, cache_dir=tmp_path, show_progress_bar=False,
    )  # fmt: skip
    sampler = ClusteredBatchSampler(ds, 8, False, **kwargs)
    batches = list(sampler)
    assert rows_of(batches) == list(range(96))
    assert all(len(b) == 8 for b in batches)
    assert all(len({domains[i] for i in b}) == 1 for b in batches)
    assert sampler.clustering.num_clusters == 12
    assert sampler.clustering.centroids.shape == (12, 2 * 8)  # k-means ran on the static_dims embeddings
    assert sampler.timings["embed_s"] > 0 and sampler.cache_path.exists()

    import cde_st.batching.sampler as sampler_module

    def fail(*args, **kwargs):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(sampler_module, "fit_static_surrogate", fail)
    monkeypatch.setattr(sampler_module, "cluster_pairs", fail)
    again = ClusteredBatchSampler(ds, 8, False, **kwargs)
    assert again.cache_path == sampler.cache_path and list(again) == batches
    # The static settings are part of the clustering's key; the transformer surrogate's key is another.
    for other in (dict(static_dims=4), dict(static_fit_pairs=16), dict(surrogate_kind="transformer")):
        with pytest.raises(AssertionError, match="recomputed"):
            ClusteredBatchSampler(ds, 8, False, **{**kwargs, **other})


def test_static_surrogate_is_deterministic_and_harder_than_random(static_root, tiny_bert_dir, monkeypatch):
    monkeypatch.setenv("CDE_ST_CACHE", str(static_root))
    ds, topic = topic_dataset(128, seed=1)
    kwargs = dict(
        model=tiny_bert_dir, surrogate_kind="static", static_fit_pairs=64, static_dims=8, cluster_size=16,
        cache=False, show_progress_bar=False,
    )  # fmt: skip
    first = ClusteredBatchSampler(ds, 16, False, **kwargs)
    second = ClusteredBatchSampler(ds, 16, False, **kwargs)
    assert list(first) == list(second)
    # The topic words dominate the (random) tiny encoder's token table: batches share topics more than random.
    same_topic = np.mean([np.mean(topic[b] == np.bincount(topic[b]).argmax()) for b in first])
    assert same_topic > 0.5  # random batches of 16 over 4 topics: about 0.4


def test_distilled_surrogate_is_cached_and_reused(static_root, tiny_bert_dir, monkeypatch):
    import model2vec.distill

    from cde_st.batching.cache import _model_fingerprint

    cache_dir = static_root / "surrogates"
    folders = [p for p in cache_dir.iterdir() if p.is_dir()]
    assert len(folders) == 1 and folders[0].name.startswith(f"static-{_model_fingerprint(tiny_bert_dir)[:24]}-")

    def fail(*args, **kwargs):
        raise AssertionError("distilled again")

    monkeypatch.setattr(model2vec.distill, "distill", fail)
    assert distill_static_surrogate(tiny_bert_dir, cache_dir=cache_dir) == folders[0]
    surrogate = load_static_surrogate(tiny_bert_dir, cache_dir=cache_dir)
    assert surrogate.encode(["a query"]).shape == (1, surrogate.dim)
    # Another source model or dimension is another folder, distilled anew.
    with pytest.raises(AssertionError, match="distilled again"):
        distill_static_surrogate(tiny_bert_dir, dims=8, cache_dir=cache_dir)


def test_static_surrogate_without_model2vec_says_what_to_install(tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "model2vec", None)  # `import model2vec` now raises ImportError
    message = r"model2vec.*pip install 'cde_st\[fast-surrogate\]'"
    with pytest.raises(ImportError, match=message):
        ClusteredBatchSampler(
            pair_dataset(40), 8, False, model=tiny_bert_dir, surrogate_kind="static", cache_dir=tmp_path,
            show_progress_bar=False,
        )  # fmt: skip
    with pytest.raises(ImportError, match=message):
        distill_static_surrogate(tiny_bert_dir, cache_dir=tmp_path)


def test_static_surrogate_bad_options_raise(tiny_bert_dir, tiny_st_model):
    kwargs = dict(cache=False, show_progress_bar=False)
    with pytest.raises(ValueError, match="surrogate_kind must be one of"):
        ClusteredBatchSampler(pair_dataset(40), 8, False, surrogate_kind="fast", **kwargs)
    with pytest.raises(ValueError, match="static_dims must be a positive integer"):
        ClusteredBatchSampler(pair_dataset(40), 8, False, surrogate_kind="static", static_dims=0, **kwargs)
    with pytest.raises(ValueError, match="static_fit_pairs must be >= 0"):
        ClusteredBatchSampler(pair_dataset(40), 8, False, surrogate_kind="static", static_fit_pairs=-1, **kwargs)
    with pytest.raises(ValueError, match="not a loaded SentenceTransformer"):
        ClusteredBatchSampler(pair_dataset(40), 8, False, model=tiny_st_model, surrogate_kind="static", **kwargs)


def test_static_surrogate_encode_matches_model2vec(static_root):
    from model2vec import StaticModel

    (folder,) = [p for p in (static_root / "surrogates").iterdir() if p.is_dir()]
    model = StaticModel.from_pretrained(str(folder))
    surrogate = StaticSurrogate.from_model2vec(model)
    texts = ["a short query", "a longer document about rockets and orbits " * 20, "", "\u2603 snow"]
    ours = surrogate.encode(texts)
    reference = np.asarray(model.encode(texts, max_length=None), dtype=np.float32)
    reference /= np.maximum(np.linalg.norm(reference, axis=1, keepdims=True), 1e-12)
    np.testing.assert_allclose(ours, reference, atol=2e-3)  # model2vec pools in float16
    assert not ours[2].any()  # no tokens: zeros (k-means normalises them away)
    flat, lengths = surrogate.tokenize(texts, max_seq_length=5)
    assert lengths.tolist() == [3, 5, 0, 1]  # the unknown snowman is dropped, as model2vec does
    assert len(flat) == lengths.sum()


def test_fit_to_moves_toward_the_teacher_and_reduces_dims(static_root, tiny_bert_dir, tiny_st_model):
    surrogate = load_static_surrogate(tiny_bert_dir, cache_dir=static_root / "surrogates")
    ds, _ = topic_dataset(256, seed=2)
    texts = list(ds["query"]) + list(ds["document"])
    targets = tiny_st_model.encode(texts, normalize_embeddings=True)

    def distance(fitted):  # mean cosine distance to the teacher
        return float(np.mean(1.0 - np.sum(fitted.encode(texts) * targets, axis=1)))

    ridge_only = surrogate.fit_to(texts, targets, epochs=0)
    trained = surrogate.fit_to(texts, targets, epochs=20, lr=1e-2)
    assert ridge_only.dim == trained.dim == targets.shape[1]
    # (The random tiny teacher's embeddings are all alike, so distances are small; training still halves them.)
    assert distance(trained) < 0.5 * distance(ridge_only)
    reduced = surrogate.fit_to(texts, targets, dims=4, epochs=2)
    embeddings = reduced.encode(texts)
    assert embeddings.shape == (len(texts), 4)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(embeddings, surrogate.fit_to(texts, targets, dims=4, epochs=2).encode(texts))
    pca_only = surrogate.fit_to(texts, None, dims=4)
    assert pca_only.encode(texts[:3]).shape == (3, 4)


# ---- distributed ----------------------------------------------------------------------------------------------


def shard(sampler, rank, world):
    """What accelerate does under SentenceTransformerTrainer (even_batches=False, split_batches=False)."""
    from accelerate.data_loader import BatchSamplerShard

    return list(BatchSamplerShard(sampler, num_processes=world, process_index=rank, even_batches=False))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [2, 3])
def test_distributed_each_rank_its_own_full_batches(drop_last, world, tmp_path):
    n, bs = 250, 16
    names = ["a" if i < 170 else "b" for i in range(n)]
    make = partial(make_sampler, pair_dataset(n), bs, drop_last, domains=names, num_replicas=world, tmp_path=tmp_path)
    sampler = make()
    per_rank = [shard(sampler, r, world) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1, "ranks must run the same number of steps"
    assert all(len(b) == len(sampler) // world for b in per_rank)
    all_batches = [b for batches in per_rank for b in batches]
    assert all(len(b) == bs for b in all_batches)
    assert all(len({names[i] for i in b}) == 1 for b in all_batches)
    # Batches are whole clustered batches of the global order, handed round-robin to the ranks.
    global_order = sampler.epoch_batches()
    for r in range(world):
        assert per_rank[r] == global_order[r::world]
    rows = Counter(i for b in all_batches for i in b)
    if drop_last:
        assert max(rows.values()) == 1
    else:
        assert set(rows) == set(range(n)), "every row must be seen by some rank"
        # Repeats only top up the short domain tails and pad the batch count, as DistributedSampler does.
        assert sum(rows.values()) - n < (2 + world) * bs
    # Outside accelerate, rank= selects the same batches itself.
    for r in range(world):
        own = make(rank=r)
        assert list(own) == per_rank[r] and len(own) == len(per_rank[r])


DIST_SCRIPT = """
import json, os, sys
import numpy as np, torch, torch.distributed as dist
from accelerate.data_loader import prepare_data_loader
from datasets import Dataset
from torch.utils.data import DataLoader
from cde_st.batching import ClusteredBatchSampler

dist.init_process_group("gloo")
rank = dist.get_rank()
n = 150
ds = Dataset.from_dict({"idx": list(range(n)), "query": [f"q{i}" for i in range(n)], "document": [f"d{i}" for i in range(n)]})
rng = np.random.default_rng(0)
q = rng.normal(size=(n, 8)).astype(np.float32)
if rank == 1:
    q = q[::-1].copy()  # rank 1 would cluster differently on its own: the broadcast from rank 0 must win
sampler = ClusteredBatchSampler(ds, 10, False, seed=0, embeddings=(q, q), cache=False, show_progress_bar=False)
loader = prepare_data_loader(
    DataLoader(ds, batch_sampler=sampler, collate_fn=lambda rows: [r["idx"] for r in rows]),
    num_processes=dist.get_world_size(), process_index=rank, even_batches=False, put_on_device=False,
)
loader.set_epoch(1)
loader.batch_sampler.batch_sampler.set_epoch(1)  # as transformers' Trainer does for a sharded batch sampler
out = {"labels": sampler.clustering.labels.tolist(), "num_replicas": sampler.num_replicas, "batches": list(loader)}
with open(sys.argv[1] + f"/rank{rank}.json", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.mark.slow  # two fresh Python processes: import time dominates
def test_two_process_gloo_run_broadcasts_clustering_and_shards(tmp_path):
    """Two real processes: rank 0's clustering is broadcast; accelerate gives each rank disjoint batches."""
    script = tmp_path / "dist_sampler.py"
    script.write_text(textwrap.dedent(DIST_SCRIPT))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        env["OMP_NUM_THREADS"] = "1"
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, stderr=subprocess.PIPE))
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["num_replicas"] == r1["num_replicas"] == 2
    assert r0["labels"] == r1["labels"]
    assert len(r0["batches"]) == len(r1["batches"]) == 8  # 150 rows -> 15 batches of 10 -> padded to 16
    assert all(len(b) == 10 for b in r0["batches"] + r1["batches"])
    seen0 = {tuple(b) for b in r0["batches"]}
    seen1 = {tuple(b) for b in r1["batches"]}
    assert len(seen0 & seen1) <= 1  # only the one padding batch may repeat a batch of the other rank
    assert {i for b in r0["batches"] + r1["batches"] for i in b} == set(range(150))


# ---- with SentenceTransformerTrainer --------------------------------------------------------------------------


@pytest.fixture
def tiny_st_model(tiny_bert_dir):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    torch.manual_seed(0)
    transformer = Transformer(tiny_bert_dir, max_seq_length=32)
    return SentenceTransformer(modules=[transformer, Pooling(32, "mean")], device="cpu")


def _trainer(model, train_dataset, tmp_path, batch_sampler, **args):
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    training_args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        max_steps=3,
        learning_rate=1e-3,
        batch_sampler=batch_sampler,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        seed=0,
        **args,
    )
    return SentenceTransformerTrainer(
        model=model, args=training_args, train_dataset=train_dataset, loss=MultipleNegativesRankingLoss(model)
    )


def _train_and_check(trainer, model):
    import torch

    before = [p.detach().clone() for p in model.parameters()]
    result = trainer.train()
    assert result.global_step == 3
    assert np.isfinite(result.training_loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_trains_with_sentence_transformer_trainer(tiny_st_model, tmp_path):
    n = 48
    full = pair_dataset(n, domain=["a" if i % 2 else "b" for i in range(n)])
    train = full.remove_columns("domain")
    sampler_fn = partial(
        ClusteredBatchSampler, model=tiny_st_model, domain_dataset=full, cache_dir=tmp_path, show_progress_bar=False
    )
    trainer = _trainer(tiny_st_model, train, tmp_path, sampler_fn)
    loader = trainer.get_train_dataloader()
    sampler = loader.batch_sampler
    assert isinstance(sampler, ClusteredBatchSampler) and sampler.batch_size == 8
    # accelerate's DataLoaderShard forwards set_epoch to the sampler: the order changes between epochs.
    loader.set_epoch(0)
    epoch0 = list(loader.batch_sampler)
    loader.set_epoch(1)
    epoch1 = list(loader.batch_sampler)
    assert epoch0 != epoch1 and rows_of(epoch0) == rows_of(epoch1) == list(range(n))
    assert all(len({full[i]["domain"] for i in b}) == 1 for b in epoch0)
    _train_and_check(trainer, tiny_st_model)


def test_trains_with_a_dataset_dict(tiny_st_model, tmp_path):
    from sentence_transformers.base.sampler import ProportionalBatchSampler

    splits = DatasetDict(
        {
            "small": Dataset.from_dict({"q": [f"s q {i}" for i in range(20)], "d": [f"s d {i}" for i in range(20)]}),
            "large": Dataset.from_dict({"q": [f"l q {i}" for i in range(44)], "d": [f"l d {i}" for i in range(44)]}),
        }
    )
    sampler_fn = partial(ClusteredBatchSampler, model=tiny_st_model, cache_dir=tmp_path, show_progress_bar=False)
    trainer = _trainer(tiny_st_model, splits, tmp_path, sampler_fn)
    multi = trainer.get_train_dataloader().batch_sampler
    assert isinstance(multi, ProportionalBatchSampler)
    assert all(isinstance(s, ClusteredBatchSampler) for s in multi.batch_samplers)
    batches = list(multi)
    assert len(batches) == len(multi)
    assert rows_of(batches) == list(range(64))  # concatenated indices: every row of every split once
    assert all(max(b) < 20 or min(b) >= 20 for b in batches), "a batch mixed two splits"
    _train_and_check(trainer, tiny_st_model)


# ---- real data (shared/data/pairs) and the real MiniLM surrogate ----------------------------------------------


def load_pairs(shared_data: Path, per_domain: int, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    rows = []
    for file in sorted((shared_data / "pairs").glob("*.jsonl.gz")):
        with gzip.open(file, "rt", encoding="utf-8") as f:
            lines = f.readlines()
        for i in sorted(rng.choice(len(lines), min(per_domain, len(lines)), replace=False)):
            rows.append(json.loads(lines[i]))
    if not rows:
        pytest.skip(f"no pairs/*.jsonl.gz under {shared_data}")
    return Dataset.from_list(rows)


@pytest.mark.slow
def test_real_pairs_clustered_batches_are_harder_than_random(shared_data, minilm, tmp_path):
    from cde_st._defaults import load_default_surrogate

    pairs = load_pairs(shared_data, per_domain=48)  # 384 pairs from the 8 domains; short texts keep it fast
    q, d = embed_pairs(load_default_surrogate(), pairs["query"], pairs["document"], max_seq_length=32)
    train = pairs.remove_columns("domain")
    sampler = ClusteredBatchSampler(
        train, 16, False, embeddings=(q, d), domain_dataset=pairs, cluster_size=16, cache_dir=tmp_path,
        show_progress_bar=False,
    )  # fmt: skip
    batches = list(sampler)
    assert rows_of(batches) == list(range(len(pairs)))
    domains = np.array(pairs["domain"])
    assert all(len(set(domains[b])) == 1 for b in batches)
    clustered = in_batch_negative_similarity(batches, q, d)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(pairs))
    random = in_batch_negative_similarity([perm[i : i + 16] for i in range(0, len(pairs), 16)], q, d)
    same_domain = [rng.permutation(np.flatnonzero(domains == x)) for x in sorted(set(domains))]
    random_in_domain = in_batch_negative_similarity(
        [r[i : i + 16] for r in same_domain for i in range(0, len(r), 16)], q, d
    )
    print(
        f"real-pairs hardness: clustered {clustered:.3f}, random {random:.3f}, random in domain {random_in_domain:.3f}"
    )
    # Measured here: clustered 0.122, random 0.022, random within domain 0.095 (all 31k pairs at batch size 64 and
    # full length: 0.283 / 0.022 / 0.090, benchmarks/RESULTS_sampler.md).
    assert clustered > random + 0.07
    assert clustered > random_in_domain + 0.01  # the clustering adds hardness beyond batching by domain


@pytest.mark.slow
def test_default_surrogate_end_to_end_with_cache(shared_data, minilm, tmp_path, monkeypatch):
    """The class itself (no partial) as the trainer calls it: default MiniLM surrogate, default cache dir."""
    monkeypatch.setenv("CDE_ST_CACHE", str(tmp_path))
    pairs = load_pairs(shared_data, per_domain=6, seed=1)
    train = pairs.remove_columns("domain")
    sampler = ClusteredBatchSampler(train, batch_size=4, drop_last=False, valid_label_columns=["label"], seed=0)
    assert (sampler.query_column, sampler.document_column) == ("query", "document")
    assert sampler.timings["embed_s"] > 0 and sampler.cache_path.parent == tmp_path / "clusters"
    assert rows_of(sampler) == list(range(len(pairs)))
    again = ClusteredBatchSampler(train, batch_size=4, drop_last=False, seed=0)
    assert again.timings == {"embed_s": 0.0, "cluster_s": 0.0}  # loaded from the cache
    assert list(again) == list(sampler)
