from cde_st.modules.backbone import BackboneAdapter, BertAdapter, get_adapter
from cde_st.modules.contextual_transformer import ContextualTransformer

__all__ = ["BackboneAdapter", "BertAdapter", "ContextualTransformer", "get_adapter"]
