"""cde_st.modules.batch_plan: the one plan encode_fast and the server cut batches by. It gives exactly the cuts of
the two planners it replaced (``encode_fast``'s ``token_budget_batches`` and the server's ``plan_forwards``, kept
below as they were), so no embedding of either path changes."""

from __future__ import annotations

import numpy as np
import pytest

from cde_st.modules.batch_plan import longest_first_order, plan_batches


def _former_token_budget_batches(lengths, batch_size, batch_tokens=None):
    lengths = [int(n) for n in lengths]
    batches, start = [], 0
    while start < len(lengths):
        rows = batch_size if batch_tokens is None else min(batch_size, max(1, batch_tokens // max(lengths[start], 1)))
        end = min(len(lengths), start + rows)
        batches.append((start, end))
        start = end
    return batches


def _former_plan_forwards(lengths, max_size, max_tokens=None, overhead_tokens=None):
    n = len(lengths)
    widths = np.maximum(np.asarray(lengths, dtype=np.int64), 1)

    def longest_from(start):
        size = min(max_size, n - start)
        if max_tokens is not None:
            size = min(size, max(1, max_tokens // int(widths[start])))
        return size

    step = np.array([longest_from(start) for start in range(n)], dtype=np.int64)
    if overhead_tokens is not None:
        best = np.zeros(n + 1)
        for start in range(n - 1, -1, -1):
            sizes = np.arange(1, step[start] + 1)
            costs = overhead_tokens + sizes * widths[start] + best[start + sizes]
            pick = len(costs) - 1 - int(np.argmin(costs[::-1]))
            best[start], step[start] = costs[pick], sizes[pick]
    cuts, start = [], 0
    while start < n:
        cuts.append((start, start + int(step[start])))
        start += int(step[start])
    return cuts


def test_the_cuts_are_those_of_both_former_planners():
    rng = np.random.default_rng(0)
    for case in range(2000):
        lengths = np.sort(rng.integers(0, 300, int(rng.integers(0, 40))))[::-1]
        size = int(rng.integers(1, 40))
        tokens = [None, int(rng.integers(1, 2000))][case % 2]
        overhead = [None, 0.0, float(rng.uniform(0, 500)), 1e6][case % 4]
        assert plan_batches(lengths, size, tokens, overhead) == _former_plan_forwards(lengths, size, tokens, overhead)
        assert plan_batches(lengths, size, tokens) == _former_token_budget_batches(lengths, size, tokens)


def test_cuts_at_the_budget():
    assert plan_batches([4, 4, 4, 4], 8, 8) == [(0, 2), (2, 4)]  # exactly at it
    assert plan_batches([5, 4, 4, 4], 8, 9) == [(0, 1), (1, 3), (3, 4)]
    assert plan_batches([30, 2, 2], 8, 10) == [(0, 1), (1, 3)]  # over it: alone
    assert plan_batches([3] * 5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert plan_batches([0, 0], 4, 1) == [(0, 1), (1, 2)]  # a row counts 1 at least
    assert plan_batches([], 1) == []
    for bad in (dict(max_size=0), dict(max_size=2, max_tokens=0)):
        with pytest.raises(ValueError):
            plan_batches([1], **bad)
    with pytest.raises(ValueError, match="longest first"):
        plan_batches([1, 2], 2)


def test_longest_first_keeps_ties_in_input_order():
    assert longest_first_order([2, 5, 2, 5, 1]).tolist() == [1, 3, 0, 2, 4]
    assert longest_first_order(np.array([], dtype=np.int64)).tolist() == []
