"""The contextual encoder module and its parts (see :mod:`cde_st.modules.contextual_transformer`)."""

from cde_st.modules.backbone import BackboneAdapter, BertAdapter, get_adapter
from cde_st.modules.contextual_config import ContextualConfig
from cde_st.modules.contextual_transformer import ContextualTransformer

__all__ = ["BackboneAdapter", "BertAdapter", "ContextualConfig", "ContextualTransformer", "get_adapter"]
