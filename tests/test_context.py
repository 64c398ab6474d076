"""The one corpus sampling rule (cde_st.context): which documents of a corpus become the context, in process and
streaming (BottomKSample, cde-st-embed), and the seed rule."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
import torch

from cde_st.context import (
    BottomKSample,
    bottom_k,
    check_seed,
    context_documents,
    is_seed,
    sample_context,
    sample_indices,
    text_hash,
    tile_sample,
)


def _hash(text, seed):
    """The ranking hash written out independently of the module (blake2b-64, keyed with the seed's 8 bytes)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=seed.to_bytes(8, "little")).digest()
    return int.from_bytes(digest, "little")


def _corpus(rng, n):
    return [f"doc {i} " + " ".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 6))) for i in range(n)]


def test_the_sample_is_the_documents_with_the_smallest_seeded_hash_in_hash_order():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 17, 64):
        corpus = list(rng.permutation(_corpus(rng, n)))
        for size in (0, 1, 3, 16):
            for seed in (0, 1, 7, 2**40 + 3):
                expected = sorted(corpus, key=lambda t: _hash(t, seed))[: min(size, n)]
                chosen = sample_context(corpus, size, seed)
                assert chosen[: len(expected)] == expected
                assert len(chosen) == size


def test_which_documents_a_seed_picks():
    corpus = [f"document {i}" for i in range(10)]
    assert sample_context(corpus, 3, seed=0) == ["document 2", "document 3", "document 9"]
    assert sample_context(corpus, 3, seed=2) == ["document 7", "document 5", "document 2"]
    assert sample_context(corpus, 3, seed=2, keep_order=True) == ["document 2", "document 5", "document 7"]


def test_keep_order_gives_the_same_documents_in_corpus_order():
    rng = np.random.default_rng(1)
    corpus = list(rng.permutation(_corpus(rng, 40)))
    for size in (1, 8, 40):
        for seed in range(4):
            chosen = sample_context(corpus, size, seed, keep_order=True)
            assert sorted(chosen) == sorted(sample_context(corpus, size, seed))
            assert chosen == sorted(chosen, key=corpus.index)


@pytest.mark.parametrize("keep_order", [False, True])
def test_a_corpus_smaller_than_the_context_is_tiled_evenly(keep_order):
    corpus = ["d", "c", "b", "a"]
    once = sample_context(corpus, 4, seed=3, keep_order=keep_order)
    for size in (5, 6, 9, 11):
        tiled = sample_context(corpus, size, seed=3, keep_order=keep_order)
        assert tiled[: 4 * (size // 4)] == once * (size // 4)  # whole copies first, in the sample's order
        assert {tiled.count(t) for t in corpus} <= {size // 4, size // 4 + 1}
        assert len(set(tiled[4 * (size // 4) :])) == size % 4  # the extra documents, each once
    assert tile_sample(["x"], 3, seed=0) == ["x", "x", "x"]
    with pytest.raises(ValueError, match="empty corpus"):
        tile_sample([], 2)


@pytest.mark.parametrize("keep_order", [False, True])
def test_the_corpus_is_a_set_of_documents(keep_order):
    """A document repeated in the corpus is not more likely to be chosen, nor chosen twice."""
    corpus = [f"document {i}" for i in range(10)]
    repeated = corpus[:3] * 5 + corpus
    for size in (4, 10, 25):
        for seed in range(5):
            assert sample_context(repeated, size, seed, keep_order=keep_order) == sample_context(
                corpus[:3] + corpus[3:], size, seed, keep_order=keep_order
            )
            chosen = sample_context(repeated, size, seed, keep_order=keep_order)
            if size <= len(corpus):
                assert len(set(chosen)) == size


def test_context_documents_is_the_rule():
    corpus = ["b", "a", "b", "  ", "c", "a", ""]
    # duplicates dropped (first occurrence kept, in corpus order), blank documents dropped
    assert context_documents(corpus) == ["b", "a", "c"]
    with pytest.raises(ValueError, match="blank"):
        context_documents(["", " \n"])


def test_a_mapping_gives_its_texts_not_its_ids():
    corpus = {"d1": "rain falls", "d2": "stocks fell", "d3": "rain falls"}
    assert context_documents(corpus) == ["rain falls", "stocks fell"]
    assert sample_context(corpus, 2, seed=0) == sample_context(["rain falls", "stocks fell"], 2, seed=0)


def test_set_context_of_a_mapping_samples_its_texts(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    texts = [f"passage {i} on topic {i % 3}" for i in range(6)]
    info = model.set_context({f"id{i}": t for i, t in enumerate(texts)}, seed=0)
    by_mapping = model.contextual_module.context_vectors.clone()
    assert info.corpus_size == 6
    model.set_context(texts, seed=0)
    assert (by_mapping == model.contextual_module.context_vectors).all()


def test_set_context_counts_duplicates_once(make_tiny_cde):
    model = make_tiny_cde(context_size=4)
    texts = [f"passage {i} on topic {i % 3}" for i in range(6)]
    info = model.set_context(texts[:1] * 20 + texts, seed=1)
    assert info.corpus_size == 6
    repeated = model.contextual_module.context_vectors.clone()
    model.set_context(texts, seed=1)
    assert (repeated == model.contextual_module.context_vectors).all()


@pytest.mark.parametrize("bad", [-1, 2**32, 1.0, True, "3", None])
def test_one_seed_rule_refuses_what_numpy_torch_or_faiss_would_misread_naming_the_argument(bad):
    with pytest.raises(ValueError, match=r"context_seed must be an integer in \[0, 2\*\*32\), got"):
        check_seed(bad, "context_seed")
    assert not is_seed(bad)


def test_one_seed_rule_accepts_numpy_integers_and_the_bounds():
    assert [check_seed(s) for s in (0, np.int64(5), 2**32 - 1)] == [0, 5, 2**32 - 1]


def test_sample_indices_takes_the_64_bit_seeds_the_training_loss_derives():
    assert len(sample_indices(10, 3, seed=2**64 - 1)) == 3
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
        sample_indices(10, 3, seed=2**64)


def test_sample_context_takes_the_64_bit_seeds_it_always_took():
    corpus = [f"document {i}" for i in range(10)]
    assert len(sample_context(corpus, 3, seed=2**64 - 1)) == 3
    for bad in (2**64, -1):
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
            sample_context(corpus, 3, seed=bad)
    with pytest.raises(ValueError, match="Context size must be >= 0"):
        sample_context(corpus, -1)


# ------------------------------------------------------------------ the streaming sample (cde-st-embed's)
TEXTS = [f"document {i}" for i in range(300)]


def test_the_streaming_sample_ignores_order_repeats_blanks_and_how_the_corpus_is_split():
    whole = BottomKSample(16, seed=3).offer_many(TEXTS).texts()
    shuffled = TEXTS * 2 + ["", "   "]
    random.Random(0).shuffle(shuffled)
    assert BottomKSample(16, seed=3).offer_many(shuffled).texts() == whole
    parts = [BottomKSample(16, seed=3).offer_many(shuffled[i::3]) for i in range(3)]
    assert parts[0].merge(parts[1]).merge(parts[2]).texts() == whole
    assert len(whole) == len(set(whole)) == 16
    assert whole == sorted(whole, key=lambda t: text_hash(t, 3))[:16]  # the smallest hashes, in hash order


def test_the_streaming_sample_is_the_in_process_sample():
    shuffled = TEXTS * 2 + ["", "   "]
    random.Random(1).shuffle(shuffled)
    for size in (1, 16, 300):
        for seed in (0, 5, 2**32 - 1):
            streamed = BottomKSample(size, seed).offer_many(shuffled).texts()
            assert streamed == sample_context(TEXTS, size, seed) == bottom_k(TEXTS, size, seed)
    small = BottomKSample(8, seed=2).offer_many(["b", "a", "c", "a"]).texts()
    assert tile_sample(small, 8, seed=2) == sample_context(["c", "b", "a"], 8, seed=2)


def test_the_streaming_sample_keeps_its_seed_rule_and_refuses_what_it_refused():
    assert BottomKSample(16, seed=0).offer_many(TEXTS).texts() != BottomKSample(16, seed=1).offer_many(TEXTS).texts()
    assert sorted(BottomKSample(16, seed=0).offer_many(["b", "a", "b"]).texts()) == ["a", "b"]
    with pytest.raises(ValueError, match="context size"):
        BottomKSample(0)
    for bad in (-1, 2**32):
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*32\)"):
            BottomKSample(4, seed=bad)
    with pytest.raises(ValueError, match="same size and seed"):
        BottomKSample(4, seed=0).merge(BottomKSample(4, seed=1))


def test_the_streaming_sample_in_corpus_order_is_the_in_process_one():
    """keep_order: the same documents, in the order of their first occurrence, tiled as sample_context tiles them."""
    rng = random.Random(2)
    stream = TEXTS[:40] * 2 + ["", "   "]
    rng.shuffle(stream)
    for size in (1, 8, 40, 50):
        for seed in (0, 5, 2**32 - 1):
            ordered = BottomKSample(size, seed, keep_order=True).offer_many(stream).texts()
            assert sorted(ordered) == sorted(BottomKSample(size, seed).offer_many(stream).texts())
            assert tile_sample(ordered, size, seed) == sample_context(stream, size, seed, keep_order=True)
    assert BottomKSample(4, keep_order=True).offer_many(["b", " ", "a", "b", "c"]).texts() == ["b", "a", "c"]


def test_samples_of_parts_merge_into_the_corpus_order_of_one_pass():
    """Workers sampling parts of a corpus offer global positions; a text in several parts keeps its first one."""
    stream = TEXTS[:60] * 2
    random.Random(3).shuffle(stream)
    whole = BottomKSample(16, seed=1, keep_order=True).offer_many(stream).texts()
    assert whole == sample_context(stream, 16, seed=1, keep_order=True)
    positions = range(len(stream))
    for parts in ([slice(i, None, 3) for i in range(3)], [slice(80, None), slice(0, 80)]):
        samples = [
            BottomKSample(16, seed=1, keep_order=True).offer_many(stream[part], positions[part]) for part in parts
        ]
        merged = samples[0]
        for sample in samples[1:]:
            merged = merged.merge(sample)
        assert merged.texts() == whole
    late, early = BottomKSample(4, keep_order=True), BottomKSample(4, keep_order=True)
    late.offer_many(["a", "b"], [5, 6])
    early.offer_many(["b"], [1])
    assert late.merge(early).texts() == ["b", "a"]
    with pytest.raises(ValueError):
        BottomKSample(4).offer_many(["a", "b"], [0])


@pytest.mark.parametrize("positions", [False, True], ids=["position-free", "rotary-context-rows"])
@pytest.mark.parametrize(("documents", "seed"), [(40, 0), (40, 3), (5, 7)])
def test_in_process_and_embed_tool_embeddings_are_identical(request, tmp_path, documents, seed, positions):
    """The same corpus and seed give the same context rows, hence bit-identical embeddings, in process and through
    cde-st-embed's job (5 documents for 8 slots: both tile them evenly), for a model whose context is a set (given
    in process in another order) and for one whose context rows carry positions (cde-small-v2: both keep the corpus
    order, first occurrences of a repeated document)."""
    from cde_st.corpus import embed_corpus, read_context_file, read_manifest, read_shard

    model = request.getfixturevalue("tiny_released_v2") if positions else request.getfixturevalue("make_tiny_cde")()
    assert model.context_size == 8
    texts = [f"passage {i} about {'rain' if i % 3 else 'markets'} {i % 7}" for i in range(documents)]
    in_file = list(reversed(texts)) + texts[:2]  # two documents again, under new ids
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(in_file)))
    manifest = embed_corpus(model, path, tmp_path / "out", seed=seed, batch_size=32, show_progress_bar=False)
    info = model.set_context(in_file if positions else texts, seed=seed)
    if positions:  # the order is what this case checks: hash order would give other rows
        assert sample_context(in_file, 8, seed) != sample_context(in_file, 8, seed, keep_order=True)
    assert manifest["context"]["texts_fingerprint"] == info.fingerprint
    stored = read_context_file(tmp_path / "out" / "context.safetensors").vectors
    assert torch.equal(torch.from_numpy(stored), model.contextual_module.context_vectors.cpu())
    (entry,) = read_manifest(tmp_path / "out")["shards"]
    ids, embedded = read_shard(tmp_path / "out" / entry["file"])
    in_process = model.encode_document(in_file, batch_size=32, convert_to_numpy=True)
    assert ids == [f"d{i}" for i in range(len(in_file))]
    assert float(np.abs(embedded - in_process).max()) == 0.0
