"""The first stage's batching (cde_st.modules.first_stage_batches): batches of the longest texts first, in a stable
order, and the vectors put back in the texts' order."""

from __future__ import annotations

import numpy as np
import torch

from cde_st.modules.first_stage_batches import in_input_order, longest_first


def test_batches_hold_the_longest_texts_first_ties_in_input_order():
    texts = ["bb", "a", "dddd", "cc", "eeee", "f"]
    batches = list(longest_first(texts, batch_size=4))
    assert [list(positions) for positions, _ in batches] == [[2, 4, 0, 3], [1, 5]]
    assert [batch for _, batch in batches] == [["dddd", "eeee", "bb", "cc"], ["a", "f"]]
    assert list(longest_first([], batch_size=4)) == []


def test_vectors_return_to_the_texts_order():
    texts = ["a", "ccc", "bb", "dddd", "e"]
    done = []
    for positions, batch in longest_first(texts, batch_size=2):
        # a stand-in first stage: each text's vector is its length and its first letter's code
        done.append((positions, torch.tensor([[len(t), ord(t[0])] for t in batch], dtype=torch.float32)))
    vectors = in_input_order(done, width=2, device=torch.device("cpu"))
    assert vectors.tolist() == [[len(t), ord(t[0])] for t in texts]


def test_no_batches_give_an_empty_matrix_of_the_width():
    vectors = in_input_order([], width=7, device=torch.device("cpu"))
    assert vectors.shape == (0, 7) and vectors.dtype == torch.float32


def test_the_order_is_stable_for_equal_lengths():
    texts = [f"t{i}" for i in range(10)]  # all of one length
    (positions, batch), *_ = longest_first(texts, batch_size=10)
    assert np.array_equal(positions, np.arange(10)) and batch == texts
