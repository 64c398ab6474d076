"""Hard-negative mining with a contextual model: sentence-transformers' ``mine_hard_negatives``, whose embedding
cache is keyed by the model's context.

``sentence_transformers.util.mine_hard_negatives(..., cache_folder=...)`` names its cached ``.npy`` files after the
model's base-model name, the prompts and the texts: nothing of a contextual model's context or weights. The same
texts mined again after ``set_context`` with another corpus (or after training) then read back the embeddings of
the old context without a word. :func:`mine_hard_negatives` here keeps the cache of a contextual model in a
subfolder named after its :meth:`~cde_st.modules.ContextualTransformer.embedding_fingerprint` (context vectors,
weights, config), so each state of the model has its own cache; for any other model it is sentence-transformers'
function unchanged.

``import cde_st`` puts it in place of ``sentence_transformers.util.mine_hard_negatives`` (and of the name in
``sentence_transformers.util.hard_negatives``), so code that imports that function after ``import cde_st`` gets it
too; a reference taken before ``import cde_st`` keeps the original (call ``cde_st.mine_hard_negatives`` then).
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

import sentence_transformers.util as st_util
from sentence_transformers.util import hard_negatives as st_hard_negatives

#: sentence-transformers' own function, as it was before ``import cde_st``.
_ORIGINAL = getattr(st_hard_negatives.mine_hard_negatives, "__cde_st_original__", st_hard_negatives.mine_hard_negatives)
_SIGNATURE = inspect.signature(_ORIGINAL)


@functools.wraps(_ORIGINAL)
def mine_hard_negatives(*args: Any, **kwargs: Any):
    from cde_st.model import contextual_module, is_contextual

    bound = _SIGNATURE.bind(*args, **kwargs)
    cache_folder, model = bound.arguments.get("cache_folder"), bound.arguments.get("model")
    if cache_folder and model is not None and is_contextual(model):
        key = contextual_module(model).embedding_fingerprint()
        bound.arguments["cache_folder"] = os.path.join(cache_folder, f"cde_st-state-{key}")
    return _ORIGINAL(*bound.args, **bound.kwargs)


mine_hard_negatives.__cde_st_original__ = _ORIGINAL  # type: ignore[attr-defined]


def install() -> None:
    """Make :func:`mine_hard_negatives` the function sentence-transformers exports (idempotent)."""
    st_util.mine_hard_negatives = mine_hard_negatives
    st_hard_negatives.mine_hard_negatives = mine_hard_negatives
