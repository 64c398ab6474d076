"""The server's named contexts: validated names, one file per context in the state directory, loaded at start-up.

A context is J first-stage vectors plus what identifies them: its name, the fingerprint of the sampled (prompted)
documents (the same value ``model.set_context(documents, seed=seed).fingerprint`` gives in-process, so a fingerprint
names the content: a replace with other documents or another seed changes it, a replace with the same ones keeps
it), J, the seed and the identity of the model that made it (:mod:`cde_st.serving.identity`).

Each context is one file, ``STATE_DIR/contexts/NAME.safetensors`` (the float32 vectors, the rest as JSON metadata),
so writing one is atomic: a temporary file in the same folder is written and fsynced, renamed over the old one
(``os.replace``), and the folder fsynced. A process killed at any point leaves either the old file or the new one,
never half of one; leftover temporary files are removed at the next start. Names cannot hold a path separator or
``..``, and only files of that one folder are ever read or written.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from cde_st.serving.errors import ApiError

logger = logging.getLogger(__name__)

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: The name under which a model folder's own saved context is served; no stored context may take it.
DEFAULT_NAME = "default"
SUFFIX = ".safetensors"
TEMP_PREFIX = ".tmp-"
METADATA_KEY = "cde_st_serving_context"
#: Test-only: seconds to sleep after the temporary file is written and fsynced and before it is renamed into
#: place, so a test can SIGKILL the server exactly inside a context write. Unset in any real deployment.
PAUSE_ENV = "CDE_ST_SERVE_TEST_PAUSE_BEFORE_RENAME"


@dataclass(eq=False)  # compared by identity: a replaced context is another object, even with equal fields
class StoredContext:
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


def check_name(name: str) -> str:
    """``name`` if it can name a context (and a file): 1 to 64 of ``A-Z a-z 0-9 . _ -``, starting with a letter or
    digit, without ``..``; else a 400."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise ApiError(
            400,
            f"Invalid context name {name!r}: use 1 to 64 characters from A-Z, a-z, 0-9, '.', '_' and '-', starting "
            "with a letter or digit, without '..'.",
            param="name",
            code="invalid_context_name",
        )
    return name


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ContextStore:
    """Named contexts of one model, kept in memory and (with a state directory) on disk.

    A create is two steps, so the slow first-stage forward runs outside any lock: :meth:`reserve` claims the name
    (409 if it exists and no replace is asked, or if another create of it is in flight), :meth:`commit` writes the
    file and publishes the context, :meth:`release` gives a failed reservation back. Every method is thread-safe."""

    def __init__(self, state_dir: str | os.PathLike | None, model_identity: str) -> None:
        self.model_identity = model_identity
        self.folder = None if state_dir is None else Path(state_dir).resolve() / "contexts"
        self._contexts: dict[str, StoredContext] = {}
        self._foreign: dict[str, str] = {}  # name -> identity of the other model it was made with
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._lock_file = None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._hold_state_dir()
            self._load_all()

    # ------------------------------------------------------------------ start-up
    def _hold_state_dir(self) -> None:
        """Two servers writing one state directory would overwrite each other's contexts: the first holds an
        exclusive lock on ``STATE_DIR/.lock`` for its lifetime, a second refuses to start."""
        self._lock_file = open(self.folder.parent / ".lock", "a+")  # noqa: SIM115 (held until the process ends)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise RuntimeError(
                f"Another cde-st-serve process is using the state directory {self.folder.parent}; give each server "
                "its own --state-dir."
            ) from None

    def _load_all(self) -> None:
        for path in sorted(self.folder.iterdir()):
            if path.name.startswith(TEMP_PREFIX):
                # A write interrupted before its rename: the previous file (if any) is intact, this one is not.
                logger.warning("Removing %s, left by an interrupted context write.", path.name)
                path.unlink(missing_ok=True)
                continue
            if not path.name.endswith(SUFFIX):
                continue
            name = path.name[: -len(SUFFIX)]
            if not NAME_PATTERN.fullmatch(name) or ".." in name:
                logger.warning("Ignoring %s: not a valid context name.", path.name)
                continue
            try:
                context = self._read(path, name)
            except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
                logger.error("Context file %s cannot be read and is not served: %s", path, exc)
                continue
            if context.model_identity != self.model_identity:
                logger.warning(
                    "Context %r was made by another model (identity %s; this model is %s): it is not served. "
                    "Delete or replace it, or serve the model it was made with.",
                    name,
                    context.model_identity,
                    self.model_identity,
                )
                self._foreign[name] = context.model_identity
                continue
            self._contexts[name] = context
        if self._contexts:
            logger.info("Loaded %d stored contexts: %s", len(self._contexts), ", ".join(sorted(self._contexts)))

    @staticmethod
    def _read(path: Path, name: str) -> StoredContext:
        with safe_open(path, framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in f.keys()}
            meta = json.loads((f.metadata() or {}).get(METADATA_KEY, "null"))
        if not isinstance(meta, dict) or "vectors" not in tensors:
            raise ValueError("not a cde-st-serve context file (no metadata or no vectors)")
        if meta.get("name") != name:
            raise ValueError(f"the file is named {name!r} but records the context {meta.get('name')!r}")
        vectors = tensors["vectors"].float()
        if vectors.ndim != 2 or len(vectors) != meta["size"]:
            raise ValueError(f"vectors of shape {tuple(vectors.shape)} do not match size={meta['size']}")
        return StoredContext(
            name=name,
            fingerprint=meta["fingerprint"],
            size=int(meta["size"]),
            seed=meta.get("seed"),
            vectors=vectors,
            model_identity=meta["model_identity"],
            corpus_size=meta.get("corpus_size"),
            created=int(meta.get("created", 0)),
        )

    # ------------------------------------------------------------------ reading
    def add_model_context(self, context: StoredContext) -> None:
        """Serve the model folder's saved context under :data:`DEFAULT_NAME` (memory only: it lives in the folder)."""
        with self._lock:
            self._contexts[DEFAULT_NAME] = context

    def get(self, name: str) -> StoredContext:
        """The context ``name``: 404 if there is none, 409 if the one stored was made by another model."""
        with self._lock:
            context = self._contexts.get(name)
            foreign = self._foreign.get(name)
        if context is not None:
            return context
        if foreign is not None:
            raise ApiError(
                409,
                f"Context {name!r} was made by another model (identity {foreign}; this server's model is "
                f"{self.model_identity}): its vectors mean nothing to this model. Delete it or create it again "
                "with replace=true.",
                param="context",
                code="context_model_mismatch",
            )
        raise ApiError(
            404, f"No context named {name!r} (GET /v1/contexts lists them).", param="context", code="context_not_found"
        )

    def default(self) -> StoredContext | None:
        with self._lock:
            return self._contexts.get(DEFAULT_NAME)

    def list(self) -> list[StoredContext]:
        with self._lock:
            return [self._contexts[name] for name in sorted(self._contexts)]

    # ------------------------------------------------------------------ writing
    def reserve(self, name: str, replace: bool) -> None:
        """Claim ``name`` for a create; 409 when it exists (without ``replace``) or another create holds it."""
        check_name(name)
        if name == DEFAULT_NAME:
            raise ApiError(
                409,
                f"{DEFAULT_NAME!r} is reserved for the context saved in the model folder; choose another name.",
                param="name",
                code="context_name_reserved",
            )
        with self._lock:
            if name in self._pending:
                raise ApiError(
                    409, f"Context {name!r} is being created by another request.", param="name", code="context_exists"
                )
            if not replace and (name in self._contexts or name in self._foreign):
                raise ApiError(
                    409,
                    f'Context {name!r} already exists; send "replace": true to replace it.',
                    param="name",
                    code="context_exists",
                )
            self._pending.add(name)

    def release(self, name: str) -> None:
        with self._lock:
            self._pending.discard(name)

    def commit(self, context: StoredContext) -> None:
        """Write a reserved context's file (when there is a state directory), then publish it and release the
        name. Blocking (fsync): call it from a worker thread."""
        try:
            if self.folder is not None:
                self._write(context)
            with self._lock:
                self._contexts[context.name] = context
                self._foreign.pop(context.name, None)
        finally:
            self.release(context.name)

    def _write(self, context: StoredContext) -> None:
        meta = {
            "name": context.name,
            "fingerprint": context.fingerprint,
            "size": context.size,
            "seed": context.seed,
            "model_identity": context.model_identity,
            "corpus_size": context.corpus_size,
            "created": context.created,
        }
        data = save({"vectors": context.vectors.float().contiguous()}, metadata={METADATA_KEY: json.dumps(meta)})
        final = self.folder / f"{context.name}{SUFFIX}"
        temp = self.folder / f"{TEMP_PREFIX}{context.name}-{os.getpid()}-{threading.get_ident()}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            pause = os.environ.get(PAUSE_ENV)
            if pause:
                time.sleep(float(pause))
            os.replace(temp, final)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.folder)

    def delete(self, name: str) -> None:
        """Remove a stored context (its file first, so a crash never serves a context whose file is gone)."""
        check_name(name)
        if name == DEFAULT_NAME:
            raise ApiError(
                409,
                f"{DEFAULT_NAME!r} is the model folder's own context and cannot be deleted.",
                param="name",
                code="context_name_reserved",
            )
        with self._lock:
            if name in self._pending:
                raise ApiError(
                    409, f"Context {name!r} is being created; delete it afterwards.", param="name", code="context_busy"
                )
            if name not in self._contexts and name not in self._foreign:
                raise ApiError(404, f"No context named {name!r}.", param="name", code="context_not_found")
            if self.folder is not None:
                (self.folder / f"{name}{SUFFIX}").unlink(missing_ok=True)
                _fsync_dir(self.folder)
            self._contexts.pop(name, None)
            self._foreign.pop(name, None)
