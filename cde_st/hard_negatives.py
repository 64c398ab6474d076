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
sentence-transformers reads its base-model name as a cache key (:mod:`cde_st.cache_key_warning`).
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

from sentence_transformers.util import hard_negatives as st_hard_negatives

from cde_st.cache_key_warning import ContextCacheKeyWarning, keyed_by_model_state
from cde_st.model import contextual_module, is_contextual

__all__ = ["ContextCacheKeyWarning", "mine_hard_negatives"]

_SIGNATURE = inspect.signature(st_hard_negatives.mine_hard_negatives)


@functools.wraps(st_hard_negatives.mine_hard_negatives)
def mine_hard_negatives(*args: Any, **kwargs: Any):
    bound = _SIGNATURE.bind(*args, **kwargs)
    cache_folder, model = bound.arguments.get("cache_folder"), bound.arguments.get("model")
    if cache_folder and model is not None and is_contextual(model):
        key = contextual_module(model).embedding_fingerprint()
        bound.arguments["cache_folder"] = os.path.join(cache_folder, f"cde_st-state-{key}")
    with keyed_by_model_state():
        return st_hard_negatives.mine_hard_negatives(*bound.args, **bound.kwargs)
