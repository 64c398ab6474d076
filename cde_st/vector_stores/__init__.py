"""Vector stores that keep a contextual model's corpus context: LanceDB tables and Chroma collections whose vectors
carry the fingerprints of the model and context that made them, whose queries are embedded with that context, and
which refuse another model or context when opened. See docs/integrations.md, "Vector stores that keep the context".

LanceDB and Chroma are extras (``pip install "cde_st[lancedb]"``, ``"cde_st[chroma]"``); this package imports them
only when a store is made or opened.
"""

from cde_st.vector_stores.embedded_folder import EmbeddedFolder
from cde_st.vector_stores.lancedb_table import ContextualLanceTable
from cde_st.vector_stores.store_embedder import StoreEmbedder
from cde_st.vector_stores.store_record import ForeignStoreError, StoreRecord

__all__ = ["ContextualLanceTable", "EmbeddedFolder", "ForeignStoreError", "StoreEmbedder", "StoreRecord"]
