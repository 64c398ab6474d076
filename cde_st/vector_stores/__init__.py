"""Vector stores that keep a contextual model's corpus context: LanceDB tables and Chroma collections whose vectors
carry the fingerprints of the model and context that made them, whose queries are embedded with that context, and
which refuse another model or context when opened. See docs/integrations.md, "Vector stores that keep the context".

LanceDB and Chroma are extras (``pip install "cde_st[lancedb]"``, ``"cde_st[chroma]"``). LanceDB is imported when
a table is made or opened; the Chroma names are imported from :mod:`cde_st.vector_stores.chroma_collection` on first
use (it registers its embedding function with Chroma when imported).
"""

from typing import Any

from cde_st.vector_stores.embedded_folder import EmbeddedFolder
from cde_st.vector_stores.lancedb_table import ContextualLanceTable
from cde_st.vector_stores.store_embedder import StoreEmbedder
from cde_st.vector_stores.store_record import ForeignStoreError, StoreRecord

__all__ = [
    "ContextualEmbeddingFunction",
    "ContextualLanceTable",
    "EmbeddedFolder",
    "ForeignStoreError",
    "StoreEmbedder",
    "StoreRecord",
    "collection_from_folder",
    "create_collection",
    "open_collection",
    "update_collection_from_folder",
]

#: Defined in chroma_collection, which needs chromadb: imported when first asked for.
_CHROMA_NAMES = {
    "ContextualEmbeddingFunction",
    "collection_from_folder",
    "create_collection",
    "open_collection",
    "update_collection_from_folder",
}


def __getattr__(name: str) -> Any:
    if name in _CHROMA_NAMES:
        from cde_st.vector_stores import chroma_collection

        return getattr(chroma_collection, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
