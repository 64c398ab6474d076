"""The model's context during an evaluation: which context sizes a model takes, and setting J documents as its
context, with fewer than J leaving the other slots null.

Every evaluation route (the mteb wrapper, the beir search, the in-training evaluators) sets a context through
:func:`set_model_context`, so "J documents" means the same thing everywhere: J equal to the model's context slots
goes through the model's own ``set_context`` (which records the documents and re-embeds them if the weights change);
fewer are embedded by the first stage and set as vectors.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cde_st.context import ContextInfo
from cde_st.model import contextual_module, is_contextual, set_context

logger = logging.getLogger(__name__)


def is_contextual_model(model: Any) -> bool:
    """Whether ``model`` is a CDE contextual model (a plain bi-encoder is evaluated without any context)."""
    return bool(is_contextual(model))


def context_sizes(model: Any, contextual: bool, context: str, context_size: int | Sequence[int] | None) -> list[int]:
    """The context sizes J to evaluate ``model`` with: ``context_size`` (one or several, duplicates dropped; default
    the model's context slots); ``[0]`` for a plain model (with a warning if context settings were given) or
    ``context="none"``. Negative sizes or sizes above the model's slots raise ``ValueError``."""
    requested = [context_size] if isinstance(context_size, int) else list(context_size or [])
    if any(j < 0 for j in requested):
        raise ValueError(f"Context sizes must be >= 0, got {requested}.")
    if not contextual:
        if any(j > 0 for j in requested) or context != "corpus":
            logger.warning("Plain (non-contextual) model: context settings are ignored.")
        return [0]
    if context == "none":
        return [0]
    slots = contextual_module(model).context_size
    sizes = list(dict.fromkeys(requested)) or [slots]
    too_big = [j for j in sizes if j > slots]
    if too_big:
        raise ValueError(f"Context size(s) {too_big} exceed the model's {slots} context slots.")
    return sizes


def set_model_context(model: Any, texts: Sequence[str], seed: int, prompt: str, batch_size: int = 32) -> ContextInfo:
    """Make the already-chosen ``texts`` (at most J of them) the model's active context, prefixed with ``prompt``.

    With J equal to the model's context slots, ``cde_st.set_context`` samples all of them back (same documents);
    with fewer, their first-stage vectors are set and the remaining slots hold the null vector (the returned
    :class:`~cde_st.context.ContextInfo` then records ``seed`` and ``prompt`` too).
    """
    module = contextual_module(model)
    if len(texts) > module.context_size:
        raise ValueError(
            f"Context size {len(texts)} exceeds the model's {module.context_size} context slots; "
            f"choose J <= {module.context_size}."
        )
    if len(texts) == module.context_size:
        return set_context(model, list(texts), seed=seed, prompt=prompt, batch_size=batch_size)
    vectors = module.embed_context_texts([prompt + t for t in texts], batch_size=batch_size)
    info = set_context(model, vectors)
    info.seed, info.prompt = seed, prompt
    return info


def clear_model_context(model: Any) -> None:
    """Remove the model's active context (it then encodes with the null context)."""
    contextual_module(model).clear_context()


def model_context_info(model: Any) -> ContextInfo | None:
    """The :class:`~cde_st.context.ContextInfo` of the model's active context (``None`` without one)."""
    return contextual_module(model).context_info
