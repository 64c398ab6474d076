"""Hard-negative mining with a contextual model: sentence-transformers' ``mine_hard_negatives``, whose embedding
cache is keyed by the model's context.

``sentence_transformers.util.mine_hard_negatives(..., cache_folder=...)`` names its cached ``.npy`` files after the
model's base-model name, the prompts and the texts: nothing of a contextual model's context or weights. The same
texts mined again after ``set_context`` with another corpus (or after training) would read back the embeddings of
the old context. :func:`mine_hard_negatives` here keeps the cache of a contextual model in a subfolder named after
its :meth:`~cde_st.modules.ContextualTransformer.embedding_fingerprint` (context vectors, weights, config), so each
state of the model has its own cache; for any other model it is sentence-transformers' function unchanged.

``import cde_st`` leaves sentence-transformers' own function in place. Called with a contextual model and a
``cache_folder``, that function warns (:class:`ContextCacheKeyWarning`) and names this one: the model notices when
sentence-transformers reads its base-model name as a cache key (see :func:`warn_if_read_as_cache_key`).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import sys
import warnings
from typing import Any

from sentence_transformers.util import hard_negatives as st_hard_negatives

from cde_st.modules.warning_location import caller_stacklevel

__all__ = ["ContextCacheKeyWarning", "mine_hard_negatives", "warn_if_read_as_cache_key"]

_SIGNATURE = inspect.signature(st_hard_negatives.mine_hard_negatives)
# True while mine_hard_negatives below calls sentence-transformers' function with a cache folder of the model's state.
_KEYED = contextvars.ContextVar("cde_st_keyed_mining", default=False)


class ContextCacheKeyWarning(UserWarning):
    """sentence-transformers' ``mine_hard_negatives`` caches a contextual model's embeddings under a key that does
    not hold its context: a later call with another context would read these embeddings back."""


@functools.wraps(st_hard_negatives.mine_hard_negatives)
def mine_hard_negatives(*args: Any, **kwargs: Any):
    from cde_st.model import contextual_module, is_contextual

    bound = _SIGNATURE.bind(*args, **kwargs)
    cache_folder, model = bound.arguments.get("cache_folder"), bound.arguments.get("model")
    if cache_folder and model is not None and is_contextual(model):
        key = contextual_module(model).embedding_fingerprint()
        bound.arguments["cache_folder"] = os.path.join(cache_folder, f"cde_st-state-{key}")
    token = _KEYED.set(True)
    try:
        return st_hard_negatives.mine_hard_negatives(*bound.args, **bound.kwargs)
    finally:
        _KEYED.reset(token)


def warn_if_read_as_cache_key() -> None:
    """Warn when the code reading a contextual model's ``model_card_data.base_model`` is sentence-transformers'
    ``mine_hard_negatives`` called directly: it reads that name only to key its embedding cache, which then ignores
    the context. Called by :class:`~cde_st.model_card.ContextualModelCardData` on each read of ``base_model``."""
    reader = sys._getframe(2)  # this function <- the card's attribute read <- the reader
    if _KEYED.get() or reader.f_globals.get("__name__") != st_hard_negatives.__name__:
        return
    warnings.warn(
        "sentence_transformers.util.mine_hard_negatives(cache_folder=...) keys its cached embeddings by the model's "
        "name, prompts and texts, not by a contextual model's context or weights: mined again after set_context with "
        "another corpus, it would read back this context's embeddings. Call cde_st.mine_hard_negatives (same "
        "arguments), which keeps a cache folder per context and weights.",
        ContextCacheKeyWarning,
        stacklevel=caller_stacklevel(),
    )
