"""The first stage over many texts: batches of the longest texts first (little padding in each), and the vectors
put back in the order of the texts."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

__all__ = ["in_input_order", "longest_first"]


def longest_first(texts: Sequence[str], batch_size: int) -> Iterator[tuple[np.ndarray, list[str]]]:
    """Yields (positions in ``texts``, those texts) batch by batch, longest texts first (a stable order)."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    for start in range(0, len(texts), batch_size):
        positions = order[start : start + batch_size]
        yield positions, [texts[i] for i in positions]


def in_input_order(done: list[tuple[np.ndarray, torch.Tensor]], width: int, device: torch.device) -> torch.Tensor:
    """The (n, width) vectors of ``done`` batches ((positions, vectors) pairs) in the texts' order; (0, width)
    when there were none."""
    if not done:
        return torch.zeros(0, width, device=device)
    vectors = torch.cat([chunk for _, chunk in done])
    order = np.concatenate([positions for positions, _ in done])
    return vectors[torch.as_tensor(np.argsort(order), device=vectors.device)]
