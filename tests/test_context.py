"""The one corpus sampling rule (cde_st.context): which documents of a corpus become the context, everywhere."""

from __future__ import annotations

import numpy as np
import pytest

from cde_st.context import check_seed, context_documents, is_seed, sample_context, sample_indices


def _sample_before_the_rule(texts, size, seed, keep_order=False):
    """sample_context as it was before duplicate and blank documents were dropped (a frozen copy): a corpus without
    either must give exactly this."""
    texts = list(texts)
    if keep_order:
        return [texts[i] for i in sample_indices(len(texts), size, seed)]
    by_text = sorted(range(len(texts)), key=texts.__getitem__)
    return [texts[by_text[i]] for i in sample_indices(len(texts), size, seed)]


def _corpus(rng, n):
    return [f"doc {i} " + " ".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 6))) for i in range(n)]


@pytest.mark.parametrize("keep_order", [False, True])
def test_corpora_without_duplicates_sample_as_before(keep_order):
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 17, 64):
        corpus = list(rng.permutation(_corpus(rng, n)))
        for size in (0, 1, 3, 16, 100):
            for seed in (0, 1, 7):
                assert sample_context(corpus, size, seed, keep_order=keep_order) == _sample_before_the_rule(
                    corpus, size, seed, keep_order
                )


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
