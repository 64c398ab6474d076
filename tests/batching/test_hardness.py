"""in_batch_negative_similarity: how hard a set of batches is."""

from __future__ import annotations

import numpy as np
import pytest

from cde_st.batching import in_batch_negative_similarity


def test_in_batch_negative_similarity():
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    d = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    # Batch (0, 2): both off-diagonal sims are 1; batch (1,): ignored.
    assert in_batch_negative_similarity([[0, 2], [1]], q, d) == pytest.approx(1.0)
    # Batch (0, 1, 2): off-diagonal sims q0.d1=0, q0.d2=1, q1.d0=0, q1.d2=0, q2.d0=1, q2.d1=0 -> 2/6.
    assert in_batch_negative_similarity([[0, 1, 2]], q, d) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        in_batch_negative_similarity([[0], [1]], q, d)
