"""The one forward loop of ``encode_fast`` and the server: each planned batch's features to the model's device, one
forward, its sentence embeddings out with the input positions of its rows. What each caller does with them (move them
to the host, truncate, normalise, write them in place) is its own; the forward itself is written once, so the two
cannot drift apart (:mod:`cde_st.modules.batch_plan` cuts the batches for both).

Example:
    >>> for positions, embeddings in forward_batches(model, batches):  # doctest: +SKIP
    ...     out[positions] = embeddings.float().cpu().numpy()
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from sentence_transformers.util import batch_to_device

__all__ = ["forward_batches"]


def forward_batches(
    model: torch.nn.Module, batches: Iterable[tuple[Any, dict]], **kwargs: Any
) -> Iterator[tuple[Any, torch.Tensor]]:
    """For each ``(positions, features)`` of ``batches``: ``(positions, model(features)["sentence_embedding"])``,
    the features moved to ``model.device`` first (a no-op for those already there). ``kwargs`` go to every forward
    (a contextual model's ``context_vectors``, ``task``). Call it under ``torch.inference_mode()``."""
    device = model.device
    for positions, features in batches:
        yield positions, model(batch_to_device(features, device), **kwargs)["sentence_embedding"]
