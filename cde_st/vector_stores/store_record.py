"""What a vector store's embeddings depend on, kept with the store: the model, its context, the prompts.

A contextual model's vectors mean something only next to the context they were made with: a query embedded with
another context, or by another model, lands elsewhere in the space, and nothing in a plain vector store says so (the
results just get worse). So every store this package writes keeps a :class:`StoreRecord` beside its vectors (a
LanceDB table in its vector field's metadata, a Chroma collection in its embedding function's configuration) and
checks it when the store is opened: a model whose fingerprint differs, or a context whose vectors differ, is
refused (:class:`ForeignStoreError`), naming both fingerprints.

The fingerprints are those ``cde-st-embed`` records in its manifest (``model.identity``, ``context.fingerprint``),
so a store made from an embedded folder carries the folder's, plus the contextual module's
:meth:`~cde_st.modules.contextual_transformer.ContextualTransformer.embedding_fingerprint` with that context (every
weight value, the config and the context in one hash: what a cache of embeddings is keyed by).
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch

from cde_st.context import fingerprint_array
from cde_st.corpus.encoders import document_prompt
from cde_st.fingerprints import model_fingerprint
from cde_st.model import contextual_module, is_contextual

__all__ = [
    "RECORD_FORMAT",
    "ForeignStoreError",
    "StoreRecord",
    "decode_vectors",
    "encode_vectors",
    "query_prompt",
]

RECORD_FORMAT = "cde_st.vector_store/1"


class ForeignStoreError(ValueError):
    """A store's vectors were made by another model or with another context than the one given (both named)."""


def query_prompt(model: Any) -> str:
    """The prompt ``encode_query`` applies: the model's ``query`` prompt, else none (``""``)."""
    return (getattr(model, "prompts", None) or {}).get("query", "")


def encode_vectors(vectors: np.ndarray) -> dict[str, Any]:
    """(J, d) float32 vectors as JSON: shape and base64 of the bytes (exact, so the fingerprint survives)."""
    array = np.ascontiguousarray(vectors, dtype=np.float32)
    return {"shape": list(array.shape), "float32_base64": base64.b64encode(array.tobytes()).decode("ascii")}


def decode_vectors(data: dict[str, Any]) -> np.ndarray:
    """The vectors :func:`encode_vectors` wrote."""
    array = np.frombuffer(base64.b64decode(data["float32_base64"]), dtype=np.float32)
    return array.reshape(data["shape"]).copy()


def _embedding_fingerprint(model: Any, context: np.ndarray) -> str:
    """The contextual module's embedding fingerprint with ``context`` active (the model's own context put back)."""
    module = contextual_module(model)
    snapshot = module.context_snapshot()
    try:
        model.set_context(torch.as_tensor(context, dtype=torch.float32))
        return module.embedding_fingerprint()
    finally:
        module.restore_context(snapshot)


@dataclass(frozen=True)
class StoreRecord:
    """The model and context a store's vectors were made with.

    Attributes:
        model_name: how to load the model again (a folder or hub id; the name ``cde-st-embed`` recorded).
        model_fingerprint: :func:`cde_st.fingerprints.model_fingerprint` without the context (the manifest's
            ``model.identity``).
        context_fingerprint: :func:`cde_st.context.fingerprint_array` of the context vectors (None: a plain model).
        embedding_fingerprint: the contextual module's embedding fingerprint with that context (None: plain model).
        dimension: the vectors' width.
        document_prompt, query_prompt: the prompts documents and queries are embedded with.
        normalized: whether the stored document vectors are L2-normalised.
        source: the embedded folder the vectors came from (None: embedded by the store itself).
    """

    model_name: str
    model_fingerprint: str
    context_fingerprint: str | None
    embedding_fingerprint: str | None
    dimension: int
    document_prompt: str
    query_prompt: str
    normalized: bool = False
    source: str | None = None

    @classmethod
    def of_model(
        cls,
        model: Any,
        context: np.ndarray | None,
        model_name: str,
        normalized: bool = False,
        source: str | None = None,
    ) -> StoreRecord:
        """The record of vectors ``model`` makes with ``context`` ((J, d) first-stage vectors; None for a plain
        model)."""
        if is_contextual(model) and context is None:
            raise ValueError("a contextual model needs its context: give the (J, d) context vectors.")
        if not is_contextual(model) and context is not None:
            raise ValueError(f"{type(model).__name__} is not a contextual model; it takes no context.")
        return cls(
            model_name=str(model_name),
            model_fingerprint=model_fingerprint(model, with_context=False),
            context_fingerprint=None if context is None else fingerprint_array(context),
            embedding_fingerprint=None if context is None else _embedding_fingerprint(model, context),
            dimension=int(model.get_embedding_dimension()),
            document_prompt=document_prompt(model),
            query_prompt=query_prompt(model),
            normalized=bool(normalized),
            source=source,
        )

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-able dict (with ``format``)."""
        return {"format": RECORD_FORMAT, **asdict(self)}

    def to_json(self) -> str:
        """The record as one JSON text."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> StoreRecord:
        """The record :meth:`to_dict` wrote; ``where`` names the store in the error a foreign dict raises."""
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ForeignStoreError(f"{where} holds no cde_st store record (format {found!r}, want {RECORD_FORMAT!r}).")
        names = {f.name for f in fields(cls)}
        missing = sorted(n for n in names if n not in data and n not in ("normalized", "source"))
        if missing:
            raise ForeignStoreError(f"{where}: the cde_st store record lacks {', '.join(missing)}.")
        return cls(**{k: v for k, v in data.items() if k in names})

    def describe(self) -> str:
        """One line: the model and its fingerprints."""
        return (
            f"model {self.model_name} (fingerprint {self.model_fingerprint}), context fingerprint "
            f"{self.context_fingerprint or 'none'}"
        )

    def check(self, other: StoreRecord, where: str, given: str = "the model and context given") -> None:
        """Raise :class:`ForeignStoreError` unless ``other`` (the model and context given now; ``given`` says what
        it is) makes the vectors this record (the store's, at ``where``) describes; the message names both values."""
        for name, what in (
            ("model_fingerprint", "model fingerprint"),
            ("context_fingerprint", "context fingerprint"),
            ("embedding_fingerprint", "embedding fingerprint (weights, config and context)"),
            ("dimension", "dimension"),
            ("document_prompt", "document prompt"),
            ("query_prompt", "query prompt"),
        ):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise ForeignStoreError(
                    f"{where} holds vectors made with {what} {mine!r}; {given}: {what} {theirs!r}. The store has: "
                    f"{self.describe()}; {given}: {other.describe()}. Queries would not "
                    "land in the store's embedding space: open it with the model and context that made it."
                )

    def check_context(self, context: np.ndarray | None, where: str, what: str) -> None:
        """Raise :class:`ForeignStoreError` unless ``context`` (``what``: where those vectors come from) has this
        record's context fingerprint."""
        have = None if context is None else fingerprint_array(context)
        if have != self.context_fingerprint:
            raise ForeignStoreError(
                f"{where} records context fingerprint {self.context_fingerprint or 'none'}; {what} has context "
                f"fingerprint {have or 'none'}. Queries must read the context the store's vectors were made with."
            )
