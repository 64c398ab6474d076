"""The one-pass context sample: a function of the corpus as a set and the seed only."""

from __future__ import annotations

import random

import pytest

from cde_st.corpus import BottomKSample
from cde_st.corpus.context_sample import text_hash

TEXTS = [f"document {i}" for i in range(300)]


def test_the_sample_ignores_order_repeats_blanks_and_how_the_corpus_is_split():
    whole = BottomKSample(16, seed=3).offer_many(TEXTS).texts()
    shuffled = TEXTS * 2 + ["", "   "]
    random.Random(0).shuffle(shuffled)
    assert BottomKSample(16, seed=3).offer_many(shuffled).texts() == whole
    parts = [BottomKSample(16, seed=3).offer_many(shuffled[i::3]) for i in range(3)]
    assert parts[0].merge(parts[1]).merge(parts[2]).texts() == whole
    assert len(whole) == len(set(whole)) == 16
    assert whole == sorted(whole, key=lambda t: text_hash(t, 3))[:16]  # the smallest hashes, in hash order


def test_the_seed_changes_the_sample_and_a_small_corpus_gives_all_its_texts():
    assert BottomKSample(16, seed=0).offer_many(TEXTS).texts() != BottomKSample(16, seed=1).offer_many(TEXTS).texts()
    assert sorted(BottomKSample(16, seed=0).offer_many(["b", "a", "b"]).texts()) == ["a", "b"]
    with pytest.raises(ValueError, match="context size"):
        BottomKSample(0)
    with pytest.raises(ValueError, match="seed"):
        BottomKSample(4, seed=-1)
    with pytest.raises(ValueError, match="same size and seed"):
        BottomKSample(4, seed=0).merge(BottomKSample(4, seed=1))
