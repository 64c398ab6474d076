"""An embedded folder (``cde-st-embed MODEL CORPUS --out DIR``) read as rows for a vector store: ids, vectors and,
when the corpus is still the one the folder was made from, the texts.

The folder's manifest says what the vectors are (model and context fingerprints, prompt, dimension); its shards
hold them, each checked against the SHA-256 the manifest records; ``DIR/context.safetensors`` holds the context,
checked against the manifest's fingerprint. The texts are not in the folder: they are read from the corpus the
manifest names, and only when its content (SHA-256) is the one recorded, so a store never pairs a vector with a
later version of its document.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cde_st.context import fingerprint_array
from cde_st.corpus import CorpusReader, context_path, read_context_file, read_manifest, read_shard
from cde_st.data import DataError
from cde_st.vector_stores.store_record import ForeignStoreError, StoreRecord

__all__ = ["EmbeddedFolder", "FolderRows"]

#: Records read from the corpus at a time, to pair texts with a shard's ids.
_READ_BATCH = 4096


@dataclass
class FolderRows:
    """One shard's rows: ids, (n, d) float32 vectors, and the texts (None when the folder's corpus is gone or
    changed)."""

    ids: list[str]
    vectors: np.ndarray
    texts: list[str] | None


class EmbeddedFolder:
    """A finished ``cde-st-embed`` folder, read for a vector store.

    Example::

        folder = EmbeddedFolder("corpus-emb")
        record = folder.record(model)          # refuses a model other than the one that embedded the folder
        for rows in folder.rows():             # shard by shard
            ...
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        manifest = read_manifest(self.path)
        if manifest is None:
            raise FileNotFoundError(f"{self.path}: no manifest.json (not a folder cde-st-embed wrote).")
        if not manifest.get("complete"):
            raise ValueError(f"{self.path}: the embedding job is not finished (rerun cde-st-embed to finish it).")
        self.manifest = manifest

    @property
    def context_fingerprint(self) -> str | None:
        """The context fingerprint the manifest records (None: a plain model)."""
        return (self.manifest.get("context") or {}).get("fingerprint")

    def context_vectors(self) -> np.ndarray | None:
        """The folder's context vectors (None for a plain model), checked against the manifest's fingerprint."""
        if self.context_fingerprint is None:
            return None
        path = context_path(self.path, self.manifest)  # a version with a new context names its own file
        vectors = read_context_file(path).vectors
        if fingerprint_array(vectors) != self.context_fingerprint:
            raise ForeignStoreError(
                f"{path} holds context fingerprint {fingerprint_array(vectors)}; the folder's manifest records "
                f"{self.context_fingerprint}. The folder is damaged: rerun cde-st-embed."
            )
        return vectors

    def record(self, model: Any, model_name: str | None = None) -> StoreRecord:
        """The store record of the folder's vectors, for ``model`` (which must be the model that embedded them:
        :class:`ForeignStoreError`, naming both fingerprints, otherwise). ``model_name``: how to load the model
        again (default: the name the manifest records)."""
        recorded = self.manifest["model"]
        record = StoreRecord.of_model(
            model,
            self.context_vectors(),
            model_name or recorded["name"],
            normalized=bool(self.manifest.get("normalized")),
            source=str(self.path.resolve()),
        )
        if record.model_fingerprint != recorded["identity"]:
            raise ForeignStoreError(
                f"{self.path} was embedded by model {recorded['name']} (fingerprint {recorded['identity']}); the "
                f"model given has fingerprint {record.model_fingerprint}. Give the model that embedded it."
            )
        if record.document_prompt != self.manifest.get("prompt"):
            raise ForeignStoreError(
                f"{self.path} was embedded with document prompt {self.manifest.get('prompt')!r}; the model given "
                f"has {record.document_prompt!r}."
            )
        return record

    def corpus_reader(self) -> CorpusReader | None:
        """A reader of the corpus the folder was made from, if it is still there with the recorded content."""
        corpus = self.manifest["corpus"]
        path = Path(corpus["path"])
        if not path.exists():
            return None
        try:
            reader = CorpusReader(path, skip_invalid=bool(self.manifest.get("skip_invalid")), **self.manifest["reader"])
        except (DataError, TypeError, KeyError):  # moved, replaced by another kind, or a manifest without fields
            return None
        recorded = corpus.get("sha256")
        return reader if recorded is not None and reader.content_digest() == recorded else None

    def rows(self, with_texts: bool | None = None) -> Iterator[FolderRows]:
        """The folder's rows, shard by shard, in the manifest's order. ``with_texts``: True (the corpus must be
        there, unchanged), False (no texts), None (texts when the corpus is there, unchanged)."""
        reader = self.corpus_reader() if with_texts is not False else None
        if with_texts and reader is None:
            raise ValueError(
                f"{self.path}: the corpus {self.manifest['corpus']['path']} is gone or changed since the folder was "
                "written, so its texts cannot be paired with the vectors; pass with_texts=False, or embed again."
            )
        texts = _texts_in_order(reader) if reader is not None else None
        for entry in self.manifest["shards"]:
            ids, vectors = read_shard(self.path / entry["file"], entry["sha256"])
            yield FolderRows(ids, vectors, None if texts is None else [_next_text(texts, i, self.path) for i in ids])


def _texts_in_order(reader: CorpusReader) -> Iterator[tuple[str, str]]:
    for batch in reader.batches(_READ_BATCH):
        yield from zip(batch.ids, batch.texts)


def _next_text(texts: Iterator[tuple[str, str]], doc_id: str, folder: Path) -> str:
    """The text of ``doc_id``: shards hold the corpus's valid records in corpus order, first occurrence of an id
    first, so the corpus is read forward to it (records left out of the shards are passed over)."""
    for found, text in texts:
        if found == doc_id:
            return text
    raise ValueError(
        f"{folder}: id {doc_id!r} of a shard is not where the corpus has it (the shards are not in corpus order); "
        "pass with_texts=False."
    )
