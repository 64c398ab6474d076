"""Where to cut texts sorted longest first into batches (forwards): the one plan ``encode_fast`` and the server
follow, so the two cannot drift apart.

A batch holds at most ``max_size`` texts and, with ``max_tokens``, at most that many padded tokens (texts times its
first, longest text; one text at least, however long). Without a forward's cost each batch is as full as the limits
allow. With ``overhead_tokens`` (what one more forward costs, in padded tokens) the cuts minimise the padded tokens
of all batches plus ``overhead_tokens`` per batch: on a CPU a forward of a few short texts costs about as much as a
few dozen more tokens (the weights are read once per forward), so a long text and many short ones run faster as
two forwards than padded to the long one; where a forward's own cost is large (a GPU) the plan keeps batches full.

Example:
    >>> plan_batches([10, 8, 8, 3, 2, 1], max_size=4, max_tokens=20)
    [(0, 2), (2, 4), (4, 6)]
    >>> plan_batches([60] + [10] * 15, max_size=32, overhead_tokens=40)
    [(0, 1), (1, 16)]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["longest_first_order", "plan_batches"]


def longest_first_order(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """The positions of ``lengths`` sorted longest first; equal lengths keep their order (a stable sort)."""
    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")


def plan_batches(
    lengths: Sequence[int] | np.ndarray,
    max_size: int,
    max_tokens: int | None = None,
    overhead_tokens: float | None = None,
) -> list[tuple[int, int]]:
    """``(start, stop)`` ranges cutting texts of ``lengths`` tokens (sorted longest first) into batches: see the
    module docstring. A text counts as one token at least."""
    if max_size <= 0:
        raise ValueError(f"the batch size must be a positive integer, got {max_size}.")
    if max_tokens is not None and max_tokens <= 0:
        raise ValueError(f"the batch's tokens must be a positive integer or None, got {max_tokens}.")
    widths = np.maximum(np.asarray(lengths, dtype=np.int64).reshape(-1), 1)
    n = len(widths)
    if (np.diff(widths) > 0).any():
        raise ValueError("the texts' lengths must be sorted longest first.")
    # step[i]: the size of the batch starting at text i (sorted: the range's first text is its longest).
    step = np.minimum(max_size, n - np.arange(n))
    if max_tokens is not None:
        step = np.minimum(step, np.maximum(1, max_tokens // widths))
    if overhead_tokens is not None:
        # best[i]: the least cost of the texts from i to the end, a range from i costing overhead + size x widths[i].
        best = np.zeros(n + 1)
        for start in range(n - 1, -1, -1):
            sizes = np.arange(1, step[start] + 1)
            costs = overhead_tokens + sizes * widths[start] + best[start + sizes]
            pick = len(costs) - 1 - int(np.argmin(costs[::-1]))  # on a tie, the fuller batch
            best[start], step[start] = costs[pick], sizes[pick]
    cuts, start = [], 0
    while start < n:
        cuts.append((start, start + int(step[start])))
        start += int(step[start])
    return cuts
