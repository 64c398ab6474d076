"""ClusteredBatchSampler: options, epochs, domains, several processes, SentenceTransformerTrainer, real pairs
(DESIGN.md sections 1.4 and 2, "Sampler"). The steps it wires together have their own test files beside this one."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from batching_helpers import make_sampler, pair_dataset, rows_of, structured_embeddings
from datasets import Dataset, DatasetDict

from cde_st.batching import ClusteredBatchSampler, cluster_pairs, embed_pairs, in_batch_negative_similarity

REPO = Path(__file__).resolve().parents[2]


# ---- options and public names ----------------------------------------------------------------------------------------


def test_public_names_importable_from_cde_st_batching():
    """The batching code has one home, cde_st.batching (the cde_st.sampler shim that re-exported it is retired);
    the sampler is also exported from cde_st and pickles by its module's path (the trainer pickles its options
    into every checkpoint)."""
    import importlib.util
    import pickle

    import cde_st
    import cde_st.batching as batching

    assert cde_st.ClusteredBatchSampler is batching.ClusteredBatchSampler
    served_by_the_shim = [
        "ClusterOrder", "ClusteredBatchSampler", "PairClustering", "cluster_pairs", "default_cache_dir",
        "embed_pairs", "in_batch_negative_similarity", "num_clusters_for", "order_clusters", "pack_clusters",
    ]  # fmt: skip
    assert set(served_by_the_shim) <= set(batching.__all__)
    for name in batching.__all__:
        assert getattr(batching, name) is not None, name
    assert importlib.util.find_spec("cde_st.sampler") is None
    pickled = pickle.dumps(batching.ClusteredBatchSampler, protocol=0)
    assert b"cde_st.batching.sampler" in pickled and pickle.loads(pickled) is batching.ClusteredBatchSampler


def test_surrogate_argument_and_its_deprecated_old_name_model(tiny_st_model, tmp_path):
    """`surrogate=` is the model that embeds the pairs for the clustering; the old `model=` (which read as the
    model being trained) still works, with a DeprecationWarning naming the new argument."""
    ds = pair_dataset(40)
    kwargs = dict(cache_dir=tmp_path, show_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        new = ClusteredBatchSampler(ds, 8, False, surrogate=tiny_st_model, **kwargs)
    assert new.surrogate is tiny_st_model
    with pytest.warns(DeprecationWarning, match=r"model=.*deprecated.*use surrogate="):
        old = ClusteredBatchSampler(ds, 8, False, model=tiny_st_model, **kwargs)
    assert old.surrogate is tiny_st_model
    assert old.cache_path == new.cache_path and list(old) == list(new)  # the same clustering (from the cache)
    with pytest.raises(ValueError, match="once"):
        ClusteredBatchSampler(ds, 8, False, surrogate=tiny_st_model, model=tiny_st_model, **kwargs)


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


def test_domains_are_read_a_column_at_a_time(monkeypatch):
    """Domains given as a dataset column (``domains=ds["domain"]``), read from ``domain_dataset`` or from the dataset:
    each read in one piece, never row by row (datasets >= 4 Columns), with the same batches as a plain list."""
    n = 96
    names = [("news", "qa")[i % 2] for i in range(n)]
    full = pair_dataset(n, domain=names)
    train = full.remove_columns("domain")
    reference = list(make_sampler(train, domains=names))
    column_type = type(full["domain"])
    if column_type is not list:
        monkeypatch.setattr(column_type, "__iter__", lambda self: (_ for _ in ()).throw(AssertionError("row by row")))
    assert list(make_sampler(train, domains=full["domain"])) == reference
    assert list(make_sampler(train, domain_dataset=full)) == reference
    with pytest.warns(UserWarning, match="collator"):
        assert list(make_sampler(full)) == reference


def test_text_columns_detected_and_configurable(tiny_st_model, tmp_path):
    texts = [f"text {i}" for i in range(40)]
    ds = Dataset.from_dict({"score": [0.5] * 40, "anchor": texts, "positive": texts, "negative": texts})
    kwargs = dict(surrogate=tiny_st_model, cache_dir=tmp_path, show_progress_bar=False)
    detected = ClusteredBatchSampler(ds, 8, False, **kwargs)  # label columns are skipped
    assert (detected.query_column, detected.document_column) == ("anchor", "positive")
    explicit = ClusteredBatchSampler(ds, 8, False, query_column="anchor", document_column="negative", **kwargs)
    assert (explicit.query_column, explicit.document_column) == ("anchor", "negative")
    assert rows_of(explicit) == list(range(40))


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


def test_static_surrogate_bad_options_raise(tiny_bert_dir, tiny_st_model):
    kwargs = dict(cache=False, show_progress_bar=False)
    with pytest.raises(ValueError, match="surrogate_kind must be one of"):
        ClusteredBatchSampler(pair_dataset(40), 8, False, surrogate_kind="fast", **kwargs)
    with pytest.raises(ValueError, match="static_dims must be a positive integer"):
        ClusteredBatchSampler(pair_dataset(40), 8, False, surrogate_kind="static", static_dims=0, **kwargs)
    with pytest.raises(ValueError, match="static_fit_pairs must be >= 0"):
        ClusteredBatchSampler(pair_dataset(40), 8, False, surrogate_kind="static", static_fit_pairs=-1, **kwargs)
    with pytest.raises(ValueError, match="not a loaded SentenceTransformer"):
        ClusteredBatchSampler(pair_dataset(40), 8, False, surrogate=tiny_st_model, surrogate_kind="static", **kwargs)


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
        ClusteredBatchSampler, surrogate=tiny_st_model, domain_dataset=full, cache_dir=tmp_path, show_progress_bar=False
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
    sampler_fn = partial(ClusteredBatchSampler, surrogate=tiny_st_model, cache_dir=tmp_path, show_progress_bar=False)
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
    from cde_st.defaults import load_default_surrogate

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
    # full length: 0.283 / 0.022 / 0.090, benchmarks/speed/RESULTS_sampler.md).
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
