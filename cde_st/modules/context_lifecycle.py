"""The steps of a :class:`~cde_st.modules.contextual_transformer.ContextualTransformer`'s context lifecycle: making a
context active (:func:`activate_context`, the one place it changes), setting one from corpus texts or vectors
(:func:`set_module_context`), re-embedding it when the first stage changed (:func:`refresh_module_context`) and
choosing the context one forward reads (:func:`context_of_call`).

The module's methods (``set_context``, ``restore_context``, ``clear_context``, ``refresh_context``, ``forward``)
keep the documented API and call these. Like ``persistence.py``, they work through the module's public attributes
and methods (``active_context``, ``context_cache``, ``weights_check``, ``sample_corpus``, ``embed_context_texts``,
...): the state stays in the objects the module owns, and no base class shares it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import numpy as np
import torch
from torch import nn

from cde_st.context import ContextInfo, check_seed, context_input, vectors_context_info
from cde_st.modules.freshness import first_stage_fingerprint

__all__ = ["activate_context", "context_of_call", "refresh_module_context", "set_module_context"]

logger = logging.getLogger(__name__)


def activate_context(
    module: nn.Module,
    vectors: torch.Tensor | None,
    info: ContextInfo | None,
    texts: list[str] | None,
    weights: torch.Tensor | None = None,
) -> None:
    """The one place the active context of ``module`` changes (None: no context). ``texts``: the prompted documents
    the vectors were embedded from, kept to re-embed them if the first stage changes. ``weights``: the first-stage
    fingerprint the vectors belong to (None: the current weights, i.e. the vectors were just computed)."""
    token_ids = torch.unique(module.preprocess_context(texts)["input_ids"]).to(module.device) if texts else None
    if vectors is not None and weights is None:
        weights = first_stage_fingerprint(module.first_stage, module.context_head, token_ids)
    module.active_context.replace(vectors, info, texts, token_ids, weights, module.device)
    module.context_cache.drop()  # the keys/values of the previous context


def set_module_context(
    module: nn.Module,
    context: Sequence[str] | torch.Tensor | np.ndarray,
    seed: int,
    prompt: str | None,
    batch_size: int,
    show_progress_bar: bool | None,
) -> ContextInfo:
    """Make ``context`` (corpus texts, or first-stage vectors) the active context of ``module`` (the steps of its
    ``set_context``, which documents the arguments); the :class:`ContextInfo`."""
    context = context_input(context, module.hidden_size)
    if isinstance(context, (torch.Tensor, np.ndarray)):
        vectors, texts = module.validate_context_vectors(context).detach(), None
        info = vectors_context_info(vectors.cpu().numpy())
    else:
        texts, info = module.sample_corpus(context, check_seed(seed), prompt)
        vectors = module.embed_context_texts(texts, batch_size=batch_size, show_progress_bar=show_progress_bar)
    activate_context(module, vectors, info, texts)
    return info


def refresh_module_context(module: nn.Module) -> bool:
    """Re-embed the active context of ``module`` if its first stage changed since the context was set (the steps of
    its ``refresh_context``, which says when); whether it was recomputed."""
    context = module.active_context
    if not context.is_stale(partial(first_stage_fingerprint, module.first_stage, module.context_head)):
        return False
    if context.texts is None:
        context.warn_stale_once()
        return False
    logger.info("The first stage changed since set_context: re-embedding the %d context documents.", len(context.texts))
    activate_context(module, module.embed_context_texts(context.texts), context.info, context.texts)
    return True


def context_of_call(module: nn.Module, given: torch.Tensor | np.ndarray | None) -> tuple[torch.Tensor, bool]:
    """The (J', d2) context vectors one forward of ``module`` reads: ``given`` (checked), else the active context
    (made current first at inference, where its ``weights_check`` says it is due), else none (J' = 0; at inference
    with a warning); and whether the weights were compared just now."""
    if given is not None:
        # Checked whether or not they require grad: NaN or too many rows must fail in training as well.
        return module.validate_context_vectors(given).to(device=module.device), False
    module.active_context.check_pool_copy()
    # Where due, compare the weights with the context's (the forward then checks the cached keys/values too).
    checked = not module.training and module.weights_check.is_due()
    if checked:
        if module.runtime is not None:
            module.runtime.check_weights(module)
        module.refresh_context()
        module.weights_check.done(list(module.parameters()))
    vectors = module.context_vectors
    if vectors is not None:
        if vectors.is_inference() and not torch.is_inference_mode_enabled():
            vectors = vectors.clone()  # embedded under inference mode; autograd may need to save them
        return vectors, checked
    if not module.training:
        module.warn_null_context()
    return module.null_vector.new_zeros(0, module.hidden_size), checked
