"""The served model's forwards: a batch of tokenised requests in, one embedding per text out, with the context it
names. All a model process builds (:mod:`cde_st.serving.model_process`): no tokenizer copies, no threads; the
server's :class:`~cde_st.serving.engine.Engine` builds one too, for the forwards it runs itself.

Contexts are switched through the library's own context (``restore_context`` with the first-stage weights'
fingerprint taken once: the server never changes its weights, so a switch reads none of them), and the keys/values
of cached attention are kept per context under a byte budget (:class:`~cde_st.serving.context_cache.
ContextStateCache`), so alternating between contexts does not recompute them at each switch. The forwards are the
ones ``encode_fast`` runs (:mod:`cde_st.modules.forward_loop`), cut by the same plan.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Hashable
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import torch

from cde_st.context import ContextInfo
from cde_st.context_errors import NonFiniteEmbedding
from cde_st.model import is_contextual
from cde_st.modules.forward_loop import forward_batches
from cde_st.modules.freshness import first_stage_fingerprint
from cde_st.serving import defaults
from cde_st.serving.context_cache import CacheStats, ContextStateCache
from cde_st.serving.tokens import Tokens, forward_features

__all__ = ["Batch", "Forwards"]

_NULL = "null context"  # the cache key of the null context (a contextual model served without one)


@dataclass
class Batch:
    """A forward's output, one row per text: embeddings (n, d) float32, tokens read (n,), truncated flags (n,)."""

    embeddings: np.ndarray
    tokens: np.ndarray
    truncated: np.ndarray

    def rows(self, start: int, stop: int) -> Batch:
        return Batch(self.embeddings[start:stop], self.tokens[start:stop], self.truncated[start:stop])


class Forwards:
    """The forwards of ``model`` (built, in eval mode), at most ``max_batch_size`` texts and ``max_batch_tokens``
    padded tokens each, the keys/values of contexts kept within ``context_cache_bytes``. Call it from one thread at
    a time; :meth:`close` ends its weights-check scope."""

    def __init__(
        self,
        model,
        *,
        max_batch_size: int = defaults.MAX_BATCH_SIZE,
        max_batch_tokens: int | None = defaults.MAX_BATCH_TOKENS,
        context_cache_bytes: int = defaults.CONTEXT_CACHE_BYTES,
    ) -> None:
        self.model = model
        self.contextual = is_contextual(model)
        self.dimension = int(model.get_embedding_dimension())
        self.max_batch_size, self.max_batch_tokens = max_batch_size, max_batch_tokens
        #: What one more forward costs, in padded tokens; None: forwards are cut as full as the limits allow.
        self.forward_overhead_tokens: float | None = None
        self.forwards = 0  # forward passes run (a batch may be cut into several)
        self.states = ContextStateCache(context_cache_bytes)
        # Contexts' keys/values are kept under weak references: a context the store lets go (deleted, replaced, or
        # dropped when another replica's write is read) frees them at once rather than when the budget pushes them
        # out. Its reference lands here, from whichever thread let it go, and the model's thread drops the entry.
        self._released: deque[weakref.ref] = deque()
        self._active = None  # None: nothing activated yet; _NULL: the null context; else the context
        self._scopes = ExitStack()
        if self.contextual:
            module = model.contextual_module
            # A server never changes its weights: one weights check for the forwards' life (like one encode call),
            # so a batch does not re-read every weight to confirm the context is current (tens of ms with MiniLM,
            # as much as a one-text forward); later forwards only compare the parameters' version counters.
            self._scopes.enter_context(module.one_weights_check())
            # What every served context's vectors belong to, read once: a switch then reads no weight.
            self._weights = first_stage_fingerprint(module.first_stage, module.context_head, None)
            self._null_vectors = torch.zeros(0, module.hidden_size)

    def close(self) -> None:
        self._scopes.close()

    def embed_tokens(self, parts: list[Tokens], context) -> Batch:
        """The forwards of a batch of tokenised requests (``parts``, all with one prompt) with ``context`` (a
        stored context; None: the null context of a contextual model, nothing for a plain one); one row per text,
        requests in order. :class:`NonFiniteEmbedding` when the model gave NaN or infinite values."""
        if self.contextual:
            self._activate(context)
        embeddings = self._forward(parts)
        if self.contextual:
            self._keep_states()
        if not np.isfinite(embeddings).all():
            raise NonFiniteEmbedding("The model gave NaN or infinite values for this batch; nothing is answered.")
        lengths = np.concatenate([part.lengths for part in parts])
        return Batch(embeddings, lengths, np.concatenate([part.truncated for part in parts]))

    @torch.inference_mode()
    def _forward(self, parts: list[Tokens]) -> np.ndarray:
        """What ``model.encode(texts, prompt=prompt)`` computes (length-sorted chunks, the same features and
        forward), without its ``eval()`` call, which would start a new weights check per batch (see __init__)."""
        embeddings = np.empty((sum(len(part) for part in parts), self.dimension), dtype=np.float32)
        plan = forward_features(
            self.model, parts, self.max_batch_size, self.max_batch_tokens, self.forward_overhead_tokens
        )
        for positions, batch in forward_batches(self.model, plan):  # encode_fast's loop too
            self.forwards += 1
            embeddings[positions] = batch.float().cpu().numpy()
        return embeddings

    def _activate(self, context) -> None:
        """Make ``context`` (None: the null context) the module's active one, with its keys/values if they are
        kept, so they are computed once and reused by every batch (passing vectors per call would recompute them
        per batch). The null context is a context of no vectors: every slot is the null vector, as without a
        context, and no warning is given per batch."""
        key = _NULL if context is None else context
        if key is self._active:
            return
        while self._released:
            self.states.discard(self._released.popleft())
        module = self.model.contextual_module
        vectors = self._null_vectors if context is None else context.vectors
        fingerprint = "null" if context is None else context.fingerprint
        info = ContextInfo(size=len(vectors), seed=None, fingerprint=fingerprint, source="vectors")
        module.restore_context((vectors, info, None, self._weights))  # drops the previous keys/values
        entry = self.states.get(self._state_key(key))
        if entry is not None:
            module.context_cache.entry = entry
        self._active = key

    def _state_key(self, active) -> Hashable:
        """The cache key of a context's keys/values: a weak reference to it (equal to any other reference to the
        same live object, never to a later context), the null context's name for the null context."""
        return active if isinstance(active, str) else weakref.ref(active, self._released.append)

    def _keep_states(self) -> None:
        """After a forward: keep the active context's keys/values (if cached attention made any)."""
        entry = self.model.contextual_module.context_cache.entry
        key = self._state_key(self._active)
        if entry is not None and self.states.get(key) is not entry:
            self.states.put(key, entry, self.model.contextual_module.context_cache_bytes())

    def cache_stats(self) -> CacheStats:
        """The contexts whose keys/values are kept, their bytes, and the evictions so far."""
        return self.states.stats()
