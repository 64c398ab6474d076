"""cde_st: Contextual Document Embeddings for sentence-transformers."""

from cde_st.batching import ClusteredBatchSampler
from cde_st.context import ContextInfo, sample_context
from cde_st.fast_encode import encode_fast
from cde_st.hard_negatives import mine_hard_negatives
from cde_st.losses import FilteredInfoNCELoss
from cde_st.model import ContextualSentenceTransformer, contextual_module, is_contextual, set_context
from cde_st.modules import ContextualConfig, ContextualTransformer

__version__ = "0.1.0"

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
