"""cde_st: Contextual Document Embeddings for sentence-transformers.

The public names below load on first use (PEP 562), so ``import cde_st`` alone, and the commands that only need
one part of the package (the ``--workers`` parent of ``cde-st-serve``, ``--help``), do not pay for importing
torch and sentence-transformers (seconds of CPU) before they need them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: Where each public name lives.
_HOMES = {
    "ClusteredBatchSampler": "cde_st.batching",
    "ContextInfo": "cde_st.context",
    "ContextualConfig": "cde_st.modules",
    "ContextualSentenceTransformer": "cde_st.model",
    "ContextualTransformer": "cde_st.modules",
    "FilteredInfoNCELoss": "cde_st.losses",
    "contextual_module": "cde_st.model",
    "encode_fast": "cde_st.fast_encode",
    "is_contextual": "cde_st.model",
    "mine_hard_negatives": "cde_st.hard_negatives",
    "sample_context": "cde_st.context",
    "set_context": "cde_st.model",
}

__all__ = [
    "ClusteredBatchSampler",
    "ContextInfo",
    "ContextualConfig",
    "ContextualSentenceTransformer",
    "ContextualTransformer",
    "FilteredInfoNCELoss",
    "contextual_module",
    "encode_fast",
    "is_contextual",
    "mine_hard_negatives",
    "sample_context",
    "set_context",
]

if TYPE_CHECKING:
    from cde_st.batching import ClusteredBatchSampler
    from cde_st.context import ContextInfo, sample_context
    from cde_st.fast_encode import encode_fast
    from cde_st.hard_negatives import mine_hard_negatives
    from cde_st.losses import FilteredInfoNCELoss
    from cde_st.model import ContextualSentenceTransformer, contextual_module, is_contextual, set_context
    from cde_st.modules import ContextualConfig, ContextualTransformer


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cde_st' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups find it directly
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
