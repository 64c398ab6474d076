"""The one context a whole corpus is embedded with: sampled from the corpus, or given (the model's saved context, a
context file, or a named context ``cde-st-serve`` exported), always carried as first-stage vectors.

Vectors, not texts, travel to the workers: every worker then reads the same context bit for bit, and no worker
samples or embeds its own. A context is named by :func:`~cde_st.context.fingerprint_array` of its vectors, which the
job's manifest records and every later search checks.

Context files: a ``.npy`` array (J, d), or a ``.safetensors`` file with a ``vectors`` tensor. A named context of
``cde-st-serve`` is such a file (``STATE_DIR/contexts/NAME.safetensors``); it is read by the server's own reader
(:func:`cde_st.context_files.read`: checksum, shape, finite values), and its metadata says which model made
it: a damaged context, or one made by another model, is refused, a damaged one with the server's message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cde_st import context_files
from cde_st.context import fingerprint_array, fingerprint_texts
from cde_st.context_errors import ContextDamaged
from cde_st.corpus.shards import write_atomically
from cde_st.model import contextual_module, is_contextual

__all__ = [
    "CORPUS_METADATA_KEY",
    "CONTEXT_FILE",
    "CorpusContext",
    "context_path",
    "embed_sampled_context",
    "given_context",
    "read_context_file",
]

#: The file the job keeps its context in, beside the manifest.
CONTEXT_FILE = "context.safetensors"
#: The metadata key of the context file a job keeps (:meth:`CorpusContext.save`).
CORPUS_METADATA_KEY = "cde_st_corpus"


def context_path(folder: str | Path, manifest: dict[str, Any]) -> Path:
    """The context file of the version ``manifest`` describes (``context.safetensors``, or ``context.v{g}.safetensors``
    after a new context was sampled: :mod:`cde_st.corpus.versions`)."""
    return Path(folder) / manifest.get("context_file", CONTEXT_FILE)


@dataclass
class CorpusContext:
    """J first-stage vectors and where they came from.

    Attributes:
        vectors: (J, d) float32.
        source: ``"sample"`` (from the corpus), ``"model"`` (the model's saved context) or ``"file"``.
        request: what was asked for (source; for a sample its size, seed and, for a model that reads the order of
            its context rows, ``order: "corpus"``; the path for a file): a rerun asking the same reuses the vectors
            kept in the job's folder instead of computing them again.
        texts_fingerprint: of the sampled, prompted texts (:func:`~cde_st.context.fingerprint_texts`), when sampled.
    """

    vectors: np.ndarray
    source: str
    request: dict[str, Any]
    texts_fingerprint: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """:func:`~cde_st.context.fingerprint_array` of the vectors."""
        return fingerprint_array(self.vectors)

    def describe(self) -> dict[str, Any]:
        """The manifest's record of this context."""
        return {
            "fingerprint": self.fingerprint,
            "size": int(len(self.vectors)),
            "dimension": int(self.vectors.shape[1]),
            "source": self.source,
            "request": self.request,
            "texts_fingerprint": self.texts_fingerprint,
            "details": self.details,
        }

    def save(self, path: str | Path) -> None:
        """Write the vectors and :meth:`describe` as a safetensors file (read back by :func:`read_context_file`),
        atomically: a crash leaves the previous file or the new one."""
        from safetensors.numpy import save

        data = save({"vectors": np.ascontiguousarray(self.vectors)}, {CORPUS_METADATA_KEY: json.dumps(self.describe())})
        write_atomically(path, data)


def read_context_file(path: str | Path, model_identities: set[str] | None = None) -> CorpusContext:
    """A context from a ``.npy`` or ``.safetensors`` file (see the module docstring). ``model_identities``: the
    model's identities; a ``cde-st-serve`` context made by a model of another identity is refused, naming both."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Context file {path} does not exist.")
    details: dict[str, Any] = {}
    if path.suffix == ".npy":
        vectors = np.load(path, allow_pickle=False)
    else:
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            keys, metadata = list(f.keys()), f.metadata() or {}
            vectors = f.get_tensor("vectors") if "vectors" in keys else None
        if context_files.holds_context(metadata):
            served = _served_context(path, model_identities)
            vectors = served.vectors.numpy()
            details = {"served_name": served.name, "served_fingerprint": served.fingerprint}
        elif vectors is None:
            raise ValueError(f"{path}: no 'vectors' tensor (found: {keys}).")
        saved = json.loads(metadata.get(CORPUS_METADATA_KEY, "null"))
        if isinstance(saved, dict):  # a context this module saved: keep what it came from
            vectors = np.asarray(vectors, dtype=np.float32)
            return CorpusContext(
                vectors, saved["source"], saved["request"], saved.get("texts_fingerprint"), saved["details"]
            )
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or not len(vectors):
        raise ValueError(f"{path}: context vectors must have shape (J, d) with J >= 1, got {vectors.shape}.")
    return CorpusContext(vectors, "file", {"source": "file", "path": str(path.resolve())}, details=details)


def _served_context(path: Path, model_identities: set[str] | None) -> context_files.StoredContext:
    """A ``cde-st-serve`` context file read by the server's reader (checksum included), refused as the server refuses
    it, or when another model made it."""
    try:
        served = context_files.read(path)  # the name it records: a copy may be renamed
    except ContextDamaged as err:
        raise ValueError(f"{err} cde-st-serve refuses this file too; give an intact context file.") from None
    if model_identities and served.model_identity not in model_identities:
        raise ValueError(
            f"{path}: context {served.name!r} was made by another model (identity {served.model_identity}; this "
            f"model is {' / '.join(sorted(model_identities))}); its vectors mean nothing to this model."
        )
    return served


def given_context(model: Any, spec: str, model_identities: set[str] | None = None) -> CorpusContext:
    """The context ``spec`` names: ``"model"`` (the model's active / saved context) or a context file path."""
    if spec == "model":
        module = contextual_module(model)
        module.refresh_context()
        if module.context_vectors is None:
            raise ValueError("context='model': the model has no saved context; sample one from the corpus instead.")
        info = module.context_info
        return CorpusContext(
            module.context_vectors.detach().float().cpu().numpy(),
            "model",
            {"source": "model"},
            texts_fingerprint=info.fingerprint if info is not None and info.source == "texts" else None,
        )
    return read_context_file(spec, model_identities)


def embed_sampled_context(
    model: Any, texts: list[str], prompt: str, size: int, seed: int, batch_size: int, order: str | None = None
) -> CorpusContext:
    """The first-stage vectors of ``texts`` (a corpus sample, unprompted), prompted with ``prompt``; ``order``:
    ``"corpus"`` when the sample's rows are in corpus order (recorded in the request), None for hash order."""
    if not is_contextual(model):
        raise TypeError("a context is for a contextual model only.")
    prompted = [prompt + t for t in texts]
    with torch.inference_mode():
        vectors = contextual_module(model).embed_context_texts(prompted, batch_size=batch_size)
    return CorpusContext(
        vectors.float().cpu().numpy(),
        "sample",
        {"source": "sample", "size": size, "seed": seed, **({"order": order} if order else {})},
        texts_fingerprint=fingerprint_texts(prompted),
    )
