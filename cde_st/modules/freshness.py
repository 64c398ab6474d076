"""Whether what a contextual module computed earlier still fits its weights: fingerprints of the weights' values
(:func:`values_fingerprint`; :func:`first_stage_fingerprint`, what context vectors are computed from), when an
inference forward must compare them with those the active context came from (:class:`WeightsCheck`), and the key of
everything its embeddings depend on (:func:`embedding_fingerprint`).

The comparison itself costs a few milliseconds for MiniLM; :class:`WeightsCheck` decides when it is due, so an encode call of many batches
pays for it once. The module owns one and asks it before each inference forward; the check never calls the module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["WeightsCheck", "embedding_fingerprint", "first_stage_fingerprint", "values_fingerprint"]


@torch.no_grad()
def values_fingerprint(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """A fingerprint of the *values* of ``tensors``: the sum of every row (last dimension), concatenated, float32.

    One read of the values, so it sees every way a weight can change (optimizer steps, fused ones included, which
    do not bump version counters; ``param.data = ...``; in-place edits through ``.data``; ``load_state_dict``):
    any change of an element larger than the rounding of its row's sum, and any move of values between rows.
    Kept on the CPU, so fingerprints taken before and after ``model.to(device)`` compare. Compare with
    ``torch.equal``."""
    rows = [t.detach().flatten(0, -2) if t.ndim > 1 else t.detach().reshape(1, -1) for t in tensors]
    sums = [r.sum(-1, dtype=torch.float32) for r in rows]
    return torch.cat(sums).cpu() if sums else torch.zeros(0)


@torch.no_grad()
def first_stage_fingerprint(
    first_stage: nn.Module, context_head: nn.Module, token_ids: torch.Tensor | None
) -> torch.Tensor:
    """:func:`values_fingerprint` of what context vectors are computed from: the first stage and the context head,
    of the input-embedding table only the rows of ``token_ids`` (the context's tokens; None: all rows, for vectors
    given directly). One read of those weights (MiniLM, 64 documents: ~12M values)."""
    table = first_stage.get_input_embeddings().weight
    tensors = [p for p in first_stage.parameters() if p is not table]
    tensors += list(context_head.parameters())
    tensors.append(table if token_ids is None else table[token_ids.to(table.device)])
    return values_fingerprint(tensors)


class WeightsCheck:
    """When the weights must be compared before an inference forward uses the active context.

    Inside :meth:`one_per_call` (one encode call), only the first forward compares, and a later one again only if a
    parameter's storage or version counter moved (nothing else can change the weights between the batches of one
    call). Outside such a block every inference forward compares, because a change no version counter records (a
    fused optimizer step, an edit through ``param.data``) may have happened between two direct forward calls.

    Usage by the module: ``if check.is_due(): <compare and re-embed>; check.done(list(parameters))``;
    ``check.mark_due()`` whenever the module goes to eval mode (encode() does, once per call).
    """

    def __init__(self) -> None:
        self._due = True
        self._params: list[torch.Tensor] | None = None  # the parameters at the last comparison
        self._key: tuple | None = None  # their (storage, version) at the last comparison
        self._depth = 0  # nesting of one_per_call() blocks

    def mark_due(self) -> None:
        """The next forward compares the weights (the module went to eval mode)."""
        self._due = True

    @contextmanager
    def one_per_call(self) -> Iterator[None]:
        """Within the block, the weights are compared at the first forward only (see the class)."""
        self._depth += 1
        self._due = True
        try:
            yield
        finally:
            self._depth -= 1

    @property
    def open_blocks(self) -> int:
        """How many :meth:`one_per_call` blocks are open (0: every forward compares)."""
        return self._depth

    def is_due(self) -> bool:
        """Whether this forward must compare the weights."""
        if self._depth > 0 and not self._due and self._key is not None:
            return self._key != _storage_versions(self._params)
        return True

    def done(self, params: Sequence[torch.Tensor]) -> None:
        """Record that the weights were compared (and the context made current) with these parameters. Listed once
        per comparison by the caller: walking the module tree per batch costs about 1 ms."""
        self._params = list(params)
        self._key = _storage_versions(self._params)
        self._due = False


def _storage_versions(params: Sequence[torch.Tensor]) -> tuple:
    return tuple((p.data_ptr(), p._version) for p in params)


def embedding_fingerprint(
    context_vectors: torch.Tensor | None, parameters: Sequence[torch.Tensor], config: dict[str, Any]
) -> str:
    """A short hash of everything a module's embeddings depend on besides the input: the context vectors (None: no
    context), the values of every weight and the config dict. Anything that caches embeddings of a contextual model
    keys them by it, so that a cache made with another context (or other weights) is never read back."""
    digest = hashlib.sha256()
    if context_vectors is None:
        digest.update(b"no context")
    else:
        vectors = context_vectors.detach().float().cpu().contiguous()
        digest.update(str(tuple(vectors.shape)).encode() + vectors.numpy().tobytes())
    digest.update(values_fingerprint(list(parameters)).numpy().tobytes())
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]
