"""A Chroma collection that keeps its corpus context: a persisted embedding function whose configuration carries
the model, the context vectors and their fingerprints, so that a reopened collection embeds queries with the
context its documents were embedded with, and refuses another.

Chroma 1.x persists a collection's embedding function as ``{"name", "config"}`` (the function's :meth:`name` and
:meth:`get_config`) and, when a collection is used without one, rebuilds it with the registered class's
``build_from_config``. :class:`ContextualEmbeddingFunction` is registered under :data:`FUNCTION_NAME`; its
configuration holds the :class:`~cde_st.vector_stores.store_record.StoreRecord` (model name and fingerprint,
context and embedding fingerprints, prompts), the context vectors themselves (base64 float32: exact, about
1.4 x J x d x 4 bytes), and how to load the model again. Rebuilt from it, the function loads the model, checks
that the model and the context are the recorded ones, and refuses otherwise, naming both fingerprints.

What Chroma checks by itself, and what this module adds:

- ``client.get_collection(name, embedding_function=f)`` compares the function's *name* only; another context
  under the same name passes. :func:`open_collection` compares the fingerprints and refuses, naming both.
- ``collection.modify(configuration={"embedding_function": f})`` calls :meth:`validate_config_update`, which
  refuses a function of another model or context; but Chroma 1.5 persists the new configuration on the server
  *before* that check runs (``Collection.modify``: ``_client._modify`` first). The record is therefore also kept in
  the collection's metadata (:data:`METADATA_KEY`), and :func:`open_collection` refuses a collection whose two
  records differ.

Documents are embedded with the document prompt and the context (``cde-st-embed``'s encoder), queries with the
query prompt and the context (Chroma calls :meth:`embed_query` for ``query_texts``); the space is cosine.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

try:
    from chromadb.api.types import Documents, EmbeddingFunction, Embeddings
    from chromadb.utils.embedding_functions import register_embedding_function
except ImportError as err:  # the extra is missing: say which one
    raise ImportError('cde_st.vector_stores.chroma_collection needs Chroma: pip install "cde_st[chroma]"') from err

from cde_st.model_loading import load_model, load_options
from cde_st.vector_stores.embedded_folder import EmbeddedFolder
from cde_st.vector_stores.folder_changes import FolderChanges, StoreRows
from cde_st.vector_stores.store_embedder import StoreEmbedder, model_context
from cde_st.vector_stores.store_record import ForeignStoreError, StoreRecord, decode_vectors, encode_vectors

__all__ = [
    "FUNCTION_NAME",
    "METADATA_KEY",
    "ContextualEmbeddingFunction",
    "collection_from_folder",
    "create_collection",
    "open_collection",
    "update_collection_from_folder",
]

#: The name Chroma records the embedding function under (and finds its class by).
FUNCTION_NAME = "cde_st_contextual"
#: The collection metadata key of the second copy of the store record.
METADATA_KEY = "cde_st:store_record"
#: Functions built from a configuration, by configuration: Chroma rebuilds the function from the configuration at
#: every use of a collection opened without one, and the model is loaded once, not at every query.
_BUILT: OrderedDict[str, ContextualEmbeddingFunction] = OrderedDict()
_BUILT_MAX = 4
#: Rows per upsert / delete call (under Chroma's maximum batch size).
_BATCH = 1000


def _config_key(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode("utf-8")).hexdigest()


def _remember(function: ContextualEmbeddingFunction) -> None:
    _BUILT[_config_key(function.get_config())] = function
    _BUILT.move_to_end(_config_key(function.get_config()))
    while len(_BUILT) > _BUILT_MAX:
        _BUILT.popitem(last=False)


@register_embedding_function
class ContextualEmbeddingFunction(EmbeddingFunction[Documents]):
    """Chroma's embedding function for a contextual model with one corpus context.

    Args:
        model: a ``ContextualSentenceTransformer`` (or a plain ``SentenceTransformer``: no context).
        context: (J, d) context vectors; None: the model's active context (after ``model.set_context(corpus)``).
        model_name: how Chroma loads the model again when it rebuilds the function (a folder or hub id).
        normalized: L2-normalise document vectors (as ``cde-st-embed --normalize`` stored them).
        batch_size: texts per forward pass.

    Example::

        function = ContextualEmbeddingFunction(model, model_name="runs/mini/final")  # model.set_context(...) first
        collection = create_collection(chromadb.PersistentClient("chroma"), "notes", function)
        collection.add(ids=ids, documents=texts)
        collection.query(query_texts=["where does lava come from?"], n_results=3)
    """

    def __init__(
        self,
        model: Any,
        context: Any = None,
        *,
        model_name: str,
        normalized: bool = False,
        batch_size: int = 32,
        source: str | None = None,
    ) -> None:
        vectors = model_context(model) if context is None else np.asarray(context, dtype=np.float32)
        self.model, self.context, self.batch_size = model, vectors, batch_size
        self.record = StoreRecord.of_model(model, vectors, model_name, normalized, source)
        self.embedder = StoreEmbedder(model, vectors, normalized, batch_size)
        _remember(self)

    @classmethod
    def from_folder(
        cls, folder: str | Path, model: Any, *, model_name: str | None = None, batch_size: int = 32
    ) -> ContextualEmbeddingFunction:
        """The function of an embedded folder (``cde-st-embed`` output): its context, ``model`` checked against it
        (:class:`ForeignStoreError` otherwise). ``model_name``: default the name the manifest records."""
        source = EmbeddedFolder(folder)
        record = source.record(model, model_name)
        return cls(
            model,
            source.context_vectors(),
            model_name=record.model_name,
            normalized=record.normalized,
            batch_size=batch_size,
            source=record.source,
        )

    def __call__(self, input: Documents) -> Embeddings:
        return list(self.embedder.documents(list(input)))

    def embed_query(self, input: Documents) -> Embeddings:
        return list(self.embedder.queries(list(input)))

    @staticmethod
    def name() -> str:
        return FUNCTION_NAME

    def default_space(self) -> str:
        return "cosine"

    def supported_spaces(self) -> list[str]:
        return ["cosine", "ip", "l2"]

    def get_config(self) -> dict[str, Any]:
        return {
            "record": self.record.to_dict(),
            "context": None if self.context is None else encode_vectors(self.context),
            "batch_size": self.batch_size,
            "load": {"max_seq_length": getattr(self.model, "max_seq_length", None), **load_options(self.model)},
        }

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        missing = [key for key in ("record", "context", "load") if key not in config]
        if missing:
            raise ValueError(f"{FUNCTION_NAME} configuration lacks {', '.join(missing)}.")

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> ContextualEmbeddingFunction:
        """The function a configuration describes: the model loaded (once per process) and checked, with the
        configuration's context. A model or context other than the recorded ones raises
        :class:`ForeignStoreError`, naming both fingerprints."""
        ContextualEmbeddingFunction.validate_config(config)
        built = _BUILT.get(_config_key(config))
        if built is not None:
            return built
        where = f"the {FUNCTION_NAME} embedding function's configuration"
        record = StoreRecord.from_dict(config["record"], where)
        context = None if config["context"] is None else decode_vectors(config["context"])
        record.check_context(context, where, "its context vectors")
        load = config["load"]
        try:
            model = load_model(record.model_name, backend=load.get("backend", "torch"), onnx_file=load.get("onnx_file"))
        except OSError as err:  # a folder moved or deleted, a hub id not cached offline
            raise FileNotFoundError(
                f"{where} names model {record.model_name!r}, which cannot be loaded ({err}). Open the collection "
                "with open_collection(client, name, ContextualEmbeddingFunction(model, model_name=...))."
            ) from None
        if load.get("max_seq_length"):
            model.max_seq_length = load["max_seq_length"]
        function = ContextualEmbeddingFunction(
            model,
            context,
            model_name=record.model_name,
            normalized=record.normalized,
            batch_size=config.get("batch_size", 32),
            source=record.source,
        )
        record.check(function.record, where, f"the model loaded from {record.model_name}")
        return function

    def validate_config_update(self, old_config: dict[str, Any], new_config: dict[str, Any]) -> None:
        """Refuse a function of another model or context for a collection (its vectors stay the old ones)."""
        where = "the collection"
        old = StoreRecord.from_dict(old_config.get("record"), where)
        old.check(StoreRecord.from_dict(new_config.get("record"), "the new configuration"), where, "the new function")


def create_collection(client: Any, name: str, function: ContextualEmbeddingFunction, **kwargs: Any) -> Any:
    """``client.create_collection`` with ``function`` persisted and its record also in the collection's metadata
    (cosine space). ``kwargs``: more of ``create_collection``'s arguments (``metadata`` is merged)."""
    metadata = {**(kwargs.pop("metadata", None) or {}), METADATA_KEY: function.record.to_json()}
    return client.create_collection(name, embedding_function=function, metadata=metadata, **kwargs)


def _add_rows(collection: Any, ids: list[str], vectors: np.ndarray, texts: list[str] | None) -> None:
    for start in range(0, len(ids), _BATCH):
        part = slice(start, start + _BATCH)
        documents = None if texts is None else texts[part]
        collection.upsert(ids=ids[part], embeddings=vectors[part], documents=documents)


def collection_from_folder(
    client: Any,
    name: str,
    folder: str | Path,
    model: Any,
    *,
    model_name: str | None = None,
    with_texts: bool | None = None,
    batch_size: int = 32,
) -> Any:
    """A new collection ``name`` holding the vectors of the embedded folder ``folder`` (and the texts, when its
    corpus is there unchanged: ``with_texts`` as :meth:`EmbeddedFolder.rows`), with the folder's context in its
    embedding function. ``model`` must be the one that embedded the folder. Interrupted, the collection holds the
    rows added so far: :func:`update_collection_from_folder` adds the others."""
    function = ContextualEmbeddingFunction.from_folder(folder, model, model_name=model_name, batch_size=batch_size)
    collection = create_collection(client, name, function)
    for rows in EmbeddedFolder(folder).rows(with_texts):
        _add_rows(collection, rows.ids, rows.vectors, rows.texts)
    return collection


def _persisted_record(collection: Any, where: str) -> tuple[StoreRecord, dict[str, Any]]:
    persisted = collection.configuration_json.get("embedding_function") or {}
    if persisted.get("name") != FUNCTION_NAME:
        raise ForeignStoreError(
            f"{where} has no {FUNCTION_NAME} embedding function (found {persisted.get('name')!r}): it keeps no context."
        )
    config = persisted.get("config") or {}
    record = StoreRecord.from_dict(config.get("record"), f"{where}'s embedding function configuration")
    try:
        kept = StoreRecord.from_dict(json.loads((collection.metadata or {})[METADATA_KEY]), f"{where}'s metadata")
    except (KeyError, ValueError):
        raise ForeignStoreError(f"{where}: its metadata lacks the cde_st store record ({METADATA_KEY}).") from None
    kept.check(record, where, "its embedding function's configuration")
    return record, config


def open_collection(client: Any, name: str, function: ContextualEmbeddingFunction | None = None) -> Any:
    """The collection ``name``, embedding with ``function`` (None: the function Chroma rebuilds from the
    collection's configuration, its model loaded from the recorded name). Refused, naming both fingerprints
    (:class:`ForeignStoreError`): a collection without this package's function, a configuration whose record
    differs from the metadata's or whose context vectors are not the recorded ones, and a function of another
    model or context."""
    where = f"Chroma collection {name!r}"
    collection = client.get_collection(name, **({} if function is None else {"embedding_function": function}))
    record, config = _persisted_record(collection, where)
    context = None if config.get("context") is None else decode_vectors(config["context"])
    record.check_context(context, where, "the context vectors of its configuration")
    if function is None:
        function = ContextualEmbeddingFunction.build_from_config(config)
        collection = client.get_collection(name, embedding_function=function)
    record.check(function.record, where)
    return collection


def _held(collection: Any, ids: list[str], dimension: int, with_texts: bool) -> StoreRows:
    """The collection's rows of ``ids`` (those it has)."""
    found: dict[str, list] = {"ids": [], "embeddings": [], "documents": []}
    for start in range(0, len(ids), _BATCH):
        part = collection.get(ids=ids[start : start + _BATCH], include=["embeddings", "documents"])
        for key in found:
            found[key].extend(part[key] if part[key] is not None else [])
    vectors = np.asarray(found["embeddings"], dtype=np.float32).reshape(len(found["ids"]), dimension)
    index = {doc_id: n for n, doc_id in enumerate(found["ids"])}
    return StoreRows(index, vectors, found["documents"] if with_texts else None)


def update_collection_from_folder(collection: Any, folder: str | Path, function: ContextualEmbeddingFunction) -> dict:
    """Bring ``collection`` (opened with ``function``) level with the embedded folder ``folder`` after
    ``cde-st-embed --update``: new and changed rows upserted, rows of ids the folder no longer has deleted. Returns
    the counts ``added``, ``changed``, ``deleted``, ``unchanged``. A folder of another model or context is refused
    before anything changes."""
    source = EmbeddedFolder(folder)
    record, _ = _persisted_record(collection, f"Chroma collection {collection.name!r}")
    record.check(function.record, f"Chroma collection {collection.name!r}", "the function given")
    record.check(
        source.record(function.model, record.model_name), f"Chroma collection {collection.name!r}", f"folder {folder}"
    )
    first = collection.get(limit=1, include=["documents"])["documents"]
    has_texts = bool(first) and first[0] is not None
    changes = FolderChanges(tolerance=1e-5)  # vectors come back from Chroma's cosine space rounded
    for rows in source.rows(with_texts=has_texts):
        picked = changes.to_write(rows, _held(collection, rows.ids, record.dimension, has_texts))
        texts = None if rows.texts is None else [rows.texts[n] for n in picked]
        _add_rows(collection, [rows.ids[n] for n in picked], rows.vectors[picked], texts)
    gone = changes.deleted_ids(collection.get(include=[])["ids"])
    for start in range(0, len(gone), _BATCH):
        collection.delete(ids=gone[start : start + _BATCH])
    return changes.counts
