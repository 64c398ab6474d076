"""A model with the one context a store's vectors were made with: embeds documents as ``cde-st-embed`` does and
queries as ``cde-st-search`` does, so rows a store adds later and the queries it answers share the folder's space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cde_st.corpus.encoders import DocumentEncoder
from cde_st.model import contextual_module, is_contextual

__all__ = ["StoreEmbedder", "model_context"]


class StoreEmbedder:
    """Embeds texts with ``model`` and ``context`` ((J, d) first-stage vectors; None for a plain model).

    Args:
        model: a ``ContextualSentenceTransformer`` or a plain ``SentenceTransformer``.
        context: the store's context vectors.
        normalized: L2-normalise document vectors (as the store's were: ``cde-st-embed --normalize``).
        batch_size: texts per forward pass.
    """

    def __init__(self, model: Any, context: np.ndarray | None, normalized: bool = False, batch_size: int = 32):
        if is_contextual(model) and context is None:
            raise ValueError("a contextual model needs the store's context vectors.")
        self.model, self.context, self.normalized, self.batch_size = model, context, normalized, batch_size

    def documents(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32: what ``cde-st-embed`` stores for these documents (its encoder, prompt and context)."""
        if not len(texts):
            return np.zeros((0, int(self.model.get_embedding_dimension())), np.float32)
        with DocumentEncoder(self.model, self.context, None, self.batch_size, self.normalized) as encoder:
            return encoder(list(texts))

    def _context_is_active(self) -> bool:
        """Whether the model's active context is the store's vectors, set as vectors (``model.set_context(vectors)``:
        never re-embedded, unlike a context set from texts after a weight change). Queries then read it as it is,
        its keys/values cached once; a context given with each call is processed again by each call."""
        module = contextual_module(self.model)
        info, active = module.context_info, module.context_vectors
        if info is None or info.source != "vectors" or active is None or tuple(active.shape) != self.context.shape:
            return False
        return torch.equal(active.detach().float().cpu(), torch.as_tensor(self.context))

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32, L2-normalised: the query prompt and the store's context, as ``cde-st-search``. Faster when
        the model's active context is the store's (``model.set_context(store_context)`` once)."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "convert_to_numpy": True, "show_progress_bar": False}
        if is_contextual(self.model) and not self._context_is_active():
            kwargs["context_vectors"] = torch.as_tensor(self.context, dtype=torch.float32)
        vectors = np.asarray(self.model.encode_query(list(texts), **kwargs), dtype=np.float32)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def model_context(model: Any) -> np.ndarray | None:
    """The model's active context as (J, d) float32 vectors (None for a plain model); a contextual model without
    one is an error that says how to set it."""
    if not is_contextual(model):
        return None
    module = contextual_module(model)
    module.refresh_context()
    if module.context_vectors is None:
        raise ValueError("the model has no active context: call model.set_context(corpus) first, or pass context=.")
    return module.context_vectors.detach().float().cpu().numpy()
