"""The model fingerprint an embedded corpus records: which weights made the embeddings, whatever context is active.

:func:`cde_st.serving.identity.model_identity` hashes the module configs, and a contextual module's config records
its active context; the context of an embedded corpus is recorded by its own fingerprint, so the model's is taken
with no context active (the active one is put back after).
"""

from __future__ import annotations

from typing import Any

from cde_st.model import contextual_module, is_contextual
from cde_st.serving.identity import model_identity

__all__ = ["model_fingerprint"]


def model_fingerprint(model: Any) -> str:
    """:func:`~cde_st.serving.identity.model_identity` of ``model`` with no context active (16 hex digits)."""
    if not is_contextual(model):
        return model_identity(model)
    module = contextual_module(model)
    snapshot = module.context_snapshot()
    try:
        module.clear_context()
        return model_identity(model)
    finally:
        module.restore_context(snapshot)
