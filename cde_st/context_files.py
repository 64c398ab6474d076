"""One stored context as one file: ``NAME.safetensors`` holding the float32 vectors, the rest as JSON metadata,
with a checksum over both.

Writing is atomic (:func:`cde_st.atomic_files.write_atomically`): a temporary file in the same folder is written and
fsynced, renamed over the old one (``os.replace``), and the folder fsynced, so a process killed at any point leaves
the old file or the new one, never half of one. Reading checks what a rename cannot promise: the checksum (a disk or
copy fault, a hand edit), the format, the name, the shape and that every value is finite; a file failing any check
raises :class:`~cde_st.context_errors.ContextDamaged`. Files written before checksums existed are read with
every other check.

This is the one reader of the format: ``cde-st-serve`` loads its contexts with :func:`read`, and ``cde-st-embed
--context`` reads an exported context file through it too (:func:`holds_context` tells such a file from other
safetensors files), so a file one of them refuses the other refuses with the same message. It sits below both
commands (at the package's top, not in :mod:`cde_st.serving`) so that neither imports the other to read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from cde_st.atomic_files import write_atomically
from cde_st.context_errors import ContextDamaged
from cde_st.modules.integrity import check_readable

__all__ = ["METADATA_KEY", "PAUSE_ENV", "SUFFIX", "StoredContext", "holds_context", "read", "write"]

SUFFIX = ".safetensors"
METADATA_KEY = "cde_st_serving_context"
#: Test-only: seconds to sleep after the temporary file is written and fsynced and before it is renamed into
#: place, so a test can SIGKILL the server exactly inside a context write. Unset in any real deployment.
PAUSE_ENV = "CDE_ST_SERVE_TEST_PAUSE_BEFORE_RENAME"


@dataclass(eq=False)  # compared by identity: a replaced context is another object, even with equal fields
class StoredContext:
    """A named context: J first-stage vectors and what identifies them (see :mod:`cde_st.serving.contexts`)."""

    name: str
    fingerprint: str
    size: int
    seed: int | None
    vectors: torch.Tensor  # (size, d) float32, CPU
    model_identity: str
    corpus_size: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    origin: str = "request"  # "request": made through the API; "model": the model folder's saved context

    def describe(self) -> dict:
        """The context as the API answers it."""
        return {
            "object": "context",
            "name": self.name,
            "fingerprint": self.fingerprint,
            "size": self.size,
            "seed": self.seed,
            "corpus_size": self.corpus_size,
            "created": self.created,
            "origin": self.origin,
        }

    def metadata(self) -> dict:
        """What the file records beside the vectors."""
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "size": self.size,
            "seed": self.seed,
            "model_identity": self.model_identity,
            "corpus_size": self.corpus_size,
            "created": self.created,
        }


def _checksum(vectors: torch.Tensor, meta: dict) -> str:
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode("utf-8"))
    digest.update(str(tuple(vectors.shape)).encode("ascii"))
    digest.update(vectors.float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def write(folder: Path, context: StoredContext) -> Path:
    """Write ``context`` to ``folder/NAME.safetensors`` atomically (temporary file, fsync, rename, folder fsync);
    returns the path. Blocking: call it off the event loop."""
    meta = context.metadata()
    vectors = context.vectors.float().contiguous()
    meta["checksum"] = _checksum(vectors, meta)
    data = save({"vectors": vectors}, metadata={METADATA_KEY: json.dumps(meta)})
    return write_atomically(folder / f"{context.name}{SUFFIX}", data, before_replace=_test_pause)


def _test_pause() -> None:
    pause = os.environ.get(PAUSE_ENV)
    if pause:
        time.sleep(float(pause))


def holds_context(metadata: dict[str, str] | None) -> bool:
    """Whether a safetensors file with this header ``metadata`` was written as a stored context (read it with
    :func:`read`, which checks it)."""
    return METADATA_KEY in (metadata or {})


def read(path: Path, name: str | None = None) -> StoredContext:
    """The context stored at ``path`` (named ``name``; None: whatever name the file records, as a copied file may
    have been renamed); :class:`ContextDamaged` naming the fault when the file fails a check. An unreadable file
    (permissions, I/O) raises its OSError."""
    path = Path(path)
    shown = name if name is not None else path.name.removesuffix(SUFFIX)  # the name an error message uses
    check_readable(str(path))  # safetensors would report a permission error as a missing file
    try:
        with safe_open(path, framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in f.keys()}
            meta = json.loads((f.metadata() or {}).get(METADATA_KEY, "null"))
    except (SafetensorError, ValueError, UnicodeDecodeError) as exc:
        raise ContextDamaged(f"Context {shown!r} is damaged: {path} is not a readable context file ({exc}).") from None
    try:
        return _checked(path, name, tensors, meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise ContextDamaged(f"Context {shown!r} is damaged: {path}: {exc}") from None


def _checked(path: Path, name: str | None, tensors: dict, meta) -> StoredContext:
    if not isinstance(meta, dict) or "vectors" not in tensors:
        raise ValueError("not a cde-st-serve context file (no metadata or no vectors)")
    vectors = tensors["vectors"].float()
    expected = meta.pop("checksum", None)
    if expected is not None and _checksum(vectors, meta) != expected:
        raise ValueError("its checksum does not match its contents (the file was altered after it was written)")
    if name is not None and meta.get("name") != name:
        raise ValueError(f"the file is named {name!r} but records the context {meta.get('name')!r}")
    if vectors.ndim != 2 or len(vectors) != meta["size"]:
        raise ValueError(f"vectors of shape {tuple(vectors.shape)} do not match size={meta['size']}")
    if not torch.isfinite(vectors).all():
        raise ValueError("its vectors hold NaN or infinite values")
    return StoredContext(
        name=name if name is not None else str(meta["name"]),
        fingerprint=str(meta["fingerprint"]),
        size=int(meta["size"]),
        seed=meta.get("seed"),
        vectors=vectors,
        model_identity=str(meta["model_identity"]),
        corpus_size=meta.get("corpus_size"),
        created=int(meta.get("created", 0)),
    )
