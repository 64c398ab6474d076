"""A LanceDB table that keeps its corpus context: vectors made by a contextual model with one context, the model's
and the context's fingerprints stored with them, queries embedded with that same context.

LanceDB (embedded: a folder, no server) stores the table; this class adds what a contextual model needs:

- The :class:`~cde_st.vector_stores.store_record.StoreRecord` is in the vector field's metadata
  (``cde_st:store_record``), so it travels with the table's schema, through every later version, and is read with
  the schema on open. LanceDB's embedding-function registry was the other place: it persists a function's
  parameters with the table too, but rebuilds the function from those JSON parameters when the table is read (the
  model reloaded from a path, not the one the caller holds) and checks nothing; here the caller's model is checked
  against the record instead.
- The context vectors are in a table of their own in the same database, ``NAME__cde_context`` (one row per
  context vector); the record's context fingerprint must match them.
- :meth:`ContextualLanceTable.open` refuses a model or a context other than the record's, naming both fingerprints
  (:class:`~cde_st.vector_stores.store_record.ForeignStoreError`).
- :meth:`ContextualLanceTable.update_from_folder` brings the table level with an embedded folder after
  ``cde-st-embed --update``: rows merged by id (``merge_insert``: added or replaced) and deleted (``delete``).

Search is exact (no vector index: LanceDB scans every row) and scores are cosine similarities. Build an ANN index
on ``table.table`` with LanceDB's ``create_index`` for large tables; the record is unaffected.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cde_st.vector_stores.embedded_folder import EmbeddedFolder
from cde_st.vector_stores.folder_changes import FolderChanges, StoreRows
from cde_st.vector_stores.store_embedder import StoreEmbedder, model_context
from cde_st.vector_stores.store_record import ForeignStoreError, StoreRecord

__all__ = ["CONTEXT_TABLE_SUFFIX", "RECORD_KEY", "VECTOR_COLUMN", "ContextualLanceTable"]

#: The metadata key of the vector field that holds the store record.
RECORD_KEY = "cde_st:store_record"
#: LanceDB's default vector column name, so ``table.table.search(vector)`` finds it without being told.
VECTOR_COLUMN = "vector"
#: The context table of table NAME is NAME + this.
CONTEXT_TABLE_SUFFIX = "__cde_context"
#: Ids per ``delete`` or lookup filter (a long ``IN`` list is one SQL expression).
_FILTER_CHUNK = 1000


def _connect(db: Any):
    try:
        import lancedb
    except ImportError:
        raise ImportError('ContextualLanceTable needs LanceDB: pip install "cde_st[lancedb]"') from None
    return lancedb.connect(str(db)) if isinstance(db, str | Path) else db


def _schema(record: StoreRecord, with_texts: bool):
    import pyarrow as pa

    vector = pa.field(VECTOR_COLUMN, pa.list_(pa.float32(), record.dimension), metadata={RECORD_KEY: record.to_json()})
    columns = [pa.field("id", pa.string(), nullable=False)]
    if with_texts:
        columns.append(pa.field("text", pa.string()))
    return pa.schema([*columns, vector])


def _rows(schema, ids: Sequence[str], vectors: np.ndarray, texts: Sequence[str] | None):
    import pyarrow as pa

    dimension = schema.field(VECTOR_COLUMN).type.list_size
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), pa.float32())
    columns = {"id": pa.array(list(ids), pa.string())}
    if "text" in schema.names:
        columns["text"] = pa.array(list(texts) if texts is not None else [None] * len(ids), pa.string())
    columns[VECTOR_COLUMN] = pa.FixedSizeListArray.from_arrays(flat, dimension)
    return pa.table(columns, schema=schema)


def _quoted(ids: Iterable[str]) -> str:
    return ", ".join("'" + i.replace("'", "''") + "'" for i in ids)


class ContextualLanceTable:
    """A LanceDB table of a contextual model's vectors, with the model's and the context's fingerprints.

    Make one from an embedded folder (:meth:`from_folder`) or from texts (:meth:`create`); open it again with
    :meth:`open`, which refuses another model or context. ``table`` is the LanceDB table itself.

    Example::

        store = ContextualLanceTable.from_folder("lancedb", "notes", "corpus-emb", model)
        store = ContextualLanceTable.open("lancedb", "notes", model)    # later, in another process
        hits = store.search("where does lava come from?", k=3)         # [{"id", "score", "text"}, ...]
    """

    def __init__(self, table: Any, record: StoreRecord, model: Any, context: np.ndarray | None, batch_size: int = 32):
        self.table, self.record, self.model, self.context = table, record, model, context
        self.embedder = StoreEmbedder(model, context, record.normalized, batch_size)

    # ------------------------------------------------------------------ making and opening
    @classmethod
    def from_folder(
        cls,
        db: Any,
        name: str,
        folder: str | Path,
        model: Any,
        *,
        model_name: str | None = None,
        with_texts: bool | None = None,
        batch_size: int = 32,
    ) -> ContextualLanceTable:
        """A new table ``name`` in ``db`` (a folder path or a LanceDB connection) holding the vectors of the embedded
        folder ``folder`` (``cde-st-embed`` output), with texts when its corpus is there unchanged (``with_texts``:
        see :meth:`EmbeddedFolder.rows`). ``model`` must be the one that embedded the folder. Interrupted, the table
        holds the shards added so far: :meth:`open` it and :meth:`update_from_folder` adds the others."""
        source = EmbeddedFolder(folder)
        record, context = source.record(model, model_name), source.context_vectors()
        batches = source.rows(with_texts)
        first = next(batches, None)
        has_texts = first is not None and first.texts is not None
        store = cls._new(db, name, record, model, context, has_texts, batch_size)
        for rows in itertools.chain([first] if first is not None else [], batches):  # a shard at a time
            if rows.ids:
                store.table.add(_rows(store.table.schema, rows.ids, rows.vectors, rows.texts))
        return store

    @classmethod
    def create(
        cls,
        db: Any,
        name: str,
        model: Any,
        ids: Sequence[str],
        texts: Sequence[str],
        *,
        model_name: str,
        context: Any = None,
        normalized: bool = False,
        batch_size: int = 32,
    ) -> ContextualLanceTable:
        """A new table ``name`` of ``texts`` (with their ``ids``) embedded as documents by ``model`` with ``context``
        ((J, d) vectors; None: the model's active context, e.g. after ``model.set_context(corpus)``).
        ``model_name``: how to load the model again (a folder or hub id), kept in the record."""
        vectors = model_context(model) if context is None else np.asarray(context, dtype=np.float32)
        record = StoreRecord.of_model(model, vectors, model_name, normalized)
        store = cls._new(db, name, record, model, vectors, True, batch_size)
        store.add(ids, texts)
        return store

    @classmethod
    def _new(cls, db, name, record, model, context, with_texts: bool, batch_size: int) -> ContextualLanceTable:
        """The empty table and its context table. The context is written first, so a table whose making was
        interrupted opens (and :meth:`update_from_folder` fills it); a leftover context table without its table is
        overwritten."""
        connection = _connect(db)
        try:
            connection.open_table(name)
        except ValueError:  # LanceDB's "Table ... was not found": the name is free
            pass
        else:
            raise ValueError(f"LanceDB table {name!r} already exists; open it, or choose another name.")
        if context is not None:
            import pyarrow as pa

            flat = pa.array(np.ascontiguousarray(context, dtype=np.float32).reshape(-1), pa.float32())
            vectors = pa.FixedSizeListArray.from_arrays(flat, context.shape[1])
            data = pa.table({"position": pa.array(range(len(context)), pa.int32()), "vector": vectors})
            connection.create_table(name + CONTEXT_TABLE_SUFFIX, data=data, mode="overwrite")
        table = connection.create_table(name, schema=_schema(record, with_texts))
        return cls(table, record, model, context, batch_size)

    @classmethod
    def open(cls, db: Any, name: str, model: Any, *, context: Any = None, batch_size: int = 32) -> ContextualLanceTable:
        """The table ``name`` of ``db``, for ``model``. Refused (:class:`ForeignStoreError`, both fingerprints
        named): a table without a cde_st record, a model other than the record's, a context table whose vectors are
        not the record's, and ``context`` (optional (J, d) vectors) other than the table's."""
        connection = _connect(db)
        table = connection.open_table(name)
        where = f"LanceDB table {name!r}"
        metadata = table.schema.field(VECTOR_COLUMN).metadata if VECTOR_COLUMN in table.schema.names else None
        if not metadata or RECORD_KEY.encode() not in metadata:
            raise ForeignStoreError(f"{where} has no cde_st store record (not made by ContextualLanceTable).")
        try:
            data = json.loads(metadata[RECORD_KEY.encode()])
        except ValueError as err:
            raise ForeignStoreError(f"{where}: its cde_st store record is not JSON ({err}).") from None
        record = StoreRecord.from_dict(data, where)
        stored = cls._stored_context(connection, name, record, where)
        record.check_context(stored, where, f"its context table {name + CONTEXT_TABLE_SUFFIX!r}")
        if context is not None:
            record.check_context(np.asarray(context, dtype=np.float32), where, "the context given")
        given = StoreRecord.of_model(model, stored, record.model_name, record.normalized, record.source)
        record.check(given, where)
        return cls(table, record, model, stored, batch_size)

    @staticmethod
    def _stored_context(connection, name: str, record: StoreRecord, where: str) -> np.ndarray | None:
        if record.context_fingerprint is None:
            return None
        try:
            table = connection.open_table(name + CONTEXT_TABLE_SUFFIX).to_arrow().sort_by("position")
        except (ValueError, FileNotFoundError, OSError) as err:
            raise ForeignStoreError(
                f"{where}: its context table {name + CONTEXT_TABLE_SUFFIX!r} cannot be read ({err}); the table's "
                f"vectors were made with context fingerprint {record.context_fingerprint}."
            ) from None
        column = table.column("vector").combine_chunks()
        return column.flatten().to_numpy(zero_copy_only=False).reshape(len(table), -1).astype(np.float32)

    # ------------------------------------------------------------------ reading and writing
    def search(self, query: str, k: int = 10) -> list[dict[str, Any]]:
        """The ``k`` rows nearest ``query`` (embedded with the query prompt and the table's context), best first:
        ``[{"id", "score" (cosine), "text" (if stored)}, ...]``."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}.")
        vector = self.embedder.queries([query])[0]
        columns = [c for c in ("id", "text") if c in self.table.schema.names]
        found = self.table.search(vector, vector_column_name=VECTOR_COLUMN).distance_type("cosine")
        hits = found.select(columns).limit(k).to_list()
        return [{**{c: hit[c] for c in columns}, "score": 1.0 - float(hit["_distance"])} for hit in hits]

    def add(self, ids: Sequence[str], texts: Sequence[str]) -> None:
        """Embed ``texts`` as documents (the table's prompt and context) and add them, replacing rows of the same
        id."""
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts.")
        if len(set(ids)) != len(ids):
            raise ValueError("ids repeat: one row per id.")
        if ids:
            self._upsert(_rows(self.table.schema, ids, self.embedder.documents(texts), texts))

    def delete(self, ids: Iterable[str]) -> None:
        """Delete the rows of ``ids`` (absent ids are passed over)."""
        ids = list(ids)
        for start in range(0, len(ids), _FILTER_CHUNK):
            self.table.delete(f"id IN ({_quoted(ids[start : start + _FILTER_CHUNK])})")

    def _upsert(self, rows) -> None:
        self.table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(rows)

    def _held(self, ids: Sequence[str]) -> StoreRows:
        """The table's rows of ``ids`` (those it has)."""
        import pyarrow as pa

        columns = ["id", VECTOR_COLUMN] + (["text"] if "text" in self.table.schema.names else [])
        if not ids:  # a shard without a valid record
            return StoreRows({}, np.zeros((0, self.record.dimension), np.float32), [] if "text" in columns else None)
        parts = [
            self.table.search().where(f"id IN ({_quoted(ids[start : start + _FILTER_CHUNK])})")
            for start in range(0, len(ids), _FILTER_CHUNK)
        ]
        data = pa.concat_tables([part.select(columns).limit(None).to_arrow() for part in parts])
        vectors = data.column(VECTOR_COLUMN).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        found = data.column("id").to_pylist()
        texts = data.column("text").to_pylist() if "text" in columns else None
        return StoreRows({i: n for n, i in enumerate(found)}, vectors.reshape(len(found), self.record.dimension), texts)

    def ids(self) -> list[str]:
        """Every id of the table."""
        return self.table.search().select(["id"]).limit(None).to_arrow().column("id").to_pylist()

    def update_from_folder(self, folder: str | Path) -> dict[str, int]:
        """Bring the table level with the embedded folder ``folder`` (after ``cde-st-embed --update``): rows of new
        ids added, rows whose vector (or text) changed replaced, rows whose id the folder no longer has deleted.
        The folder must hold the table's model and context (:class:`ForeignStoreError` otherwise). Returns the
        counts ``added``, ``changed``, ``deleted``, ``unchanged``.

        Each step is a LanceDB commit (a merge per shard with changes, then the deletes): interrupted, the table is
        part way; the same call again finishes it."""
        source = EmbeddedFolder(folder)
        self.record.check(
            source.record(self.model, self.record.model_name), f"LanceDB table {self.table.name!r}", f"folder {folder}"
        )
        with_texts = "text" in self.table.schema.names
        changes = FolderChanges()
        for rows in source.rows(with_texts=with_texts):
            picked = changes.to_write(rows, self._held(rows.ids))
            if picked:
                texts = [rows.texts[n] for n in picked] if with_texts else None
                self._upsert(_rows(self.table.schema, [rows.ids[n] for n in picked], rows.vectors[picked], texts))
        self.delete(changes.deleted_ids(self.ids()))
        return changes.counts

    def __len__(self) -> int:
        return self.table.count_rows()
