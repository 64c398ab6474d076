"""The warning a contextual model gives when sentence-transformers' ``mine_hard_negatives`` reads its base-model
name as an embedding-cache key: that key holds nothing of the context, so a later call with another context would
read this context's embeddings back.

Its own module because both sides need it: the model card (:class:`~cde_st.model_card.ContextualModelCardData`)
warns on each read of ``base_model``, and :func:`cde_st.hard_negatives.mine_hard_negatives`, which keys the cache
by the model's state, silences it around its call. The card cannot import the miner: the miner imports the model,
which imports its card.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import warnings
from collections.abc import Iterator

from sentence_transformers.util import hard_negatives as st_hard_negatives

from cde_st.modules.warning_location import caller_stacklevel

__all__ = ["ContextCacheKeyWarning", "keyed_by_model_state", "warn_if_read_as_cache_key"]

# True while cde_st's mine_hard_negatives calls sentence-transformers' function with a cache folder of the model's
# state.
_KEYED = contextvars.ContextVar("cde_st_keyed_mining", default=False)


class ContextCacheKeyWarning(UserWarning):
    """sentence-transformers' ``mine_hard_negatives`` caches a contextual model's embeddings under a key that does
    not hold its context: a later call with another context would read these embeddings back."""


@contextlib.contextmanager
def keyed_by_model_state() -> Iterator[None]:
    """Within it, reads of the base-model name are not warned about: the caller has put the model's state in the
    cache folder (:func:`cde_st.hard_negatives.mine_hard_negatives`)."""
    token = _KEYED.set(True)
    try:
        yield
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
