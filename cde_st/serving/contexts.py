"""The server's named contexts: validated names, one file per context in a state directory that several server
processes (replicas, on one host or on hosts sharing a volume) may use at once.

A context is J first-stage vectors plus what identifies them: its name, the fingerprint of the sampled (prompted)
documents (the same value ``model.set_context(documents, seed=seed).fingerprint`` gives in-process, so a fingerprint
names the content), J, the seed and the identity of the model that made it (:mod:`cde_st.fingerprints`). Each
is one file, ``STATE_DIR/contexts/NAME.safetensors``, written atomically and checked at load
(:mod:`cde_st.context_files`).

Replicas. Every write (create, replace, delete) holds an exclusive ``fcntl`` lock on ``STATE_DIR/.write-lock``
(POSIX record locks: NFS carries them). Each store looks at the folder at most every ``refresh_seconds`` when a context is looked up: the identity (inode, size, mtime) of every
file, one ``stat`` each, reading again only the files that changed. So a context written through any replica is
served by every replica at most ``refresh_seconds`` after its write returned (plus the attribute caching of a
network file system), and a file changed or removed by anything else (a disk fault, a hand edit, a copy) is noticed
as soon, by every replica alike: none keeps serving from memory what its file no longer holds. Two creates of one name through two replicas: the second to take the lock finds the file
and gets :class:`~cde_st.context_errors.ContextExists`. Leftover temporary files of a killed writer are
removed under the lock (no write is then in flight).

Locks never held across file I/O by the event loop: the in-memory maps have their own short lock; a re-read of the
folder from a lookup skips its turn when a local write holds the writer lock.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from cde_st import context_files
from cde_st.atomic_files import TEMP_PREFIX, fsync_dir
from cde_st.context_errors import (
    ContextBusy,
    ContextDamaged,
    ContextExists,
    ContextModelMismatch,
    ContextNotFound,
    ContextReserved,
    InvalidContextName,
    StateDirError,
)
from cde_st.context_files import PAUSE_ENV, SUFFIX, StoredContext
from cde_st.serving import defaults

__all__ = [
    "WRITE_LOCK_FILE",
    "DEFAULT_NAME",
    "NAME_PATTERN",
    "PAUSE_ENV",
    "ContextStore",
    "StoredContext",
    "check_name",
]

logger = logging.getLogger(__name__)

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: The name under which a model folder's own saved context is served; no stored context may take it.
DEFAULT_NAME = "default"
WRITE_LOCK_FILE = ".write-lock"


def check_name(name: str, param: str = "name") -> str:
    """``name`` if it can name a context (and a file): 1 to 64 of ``A-Z a-z 0-9 . _ -``, starting with a letter or
    digit, without ``..``; else :class:`InvalidContextName`."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise InvalidContextName(
            f"Invalid context name {name!r}: use 1 to 64 characters from A-Z, a-z, 0-9, '.', '_' and '-', starting "
            "with a letter or digit, without '..'.",
            param=param,
        )
    return name


def _stat_key(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class ContextStore:
    """Named contexts of one model, kept in memory and (with a state directory) on disk, shared with any other
    server using the same directory.

    A create is two steps, so the slow first-stage forward runs outside any lock: :meth:`reserve` claims the name
    in this process, :meth:`commit` writes the file and publishes the context, :meth:`release` gives a failed
    reservation back. Every method is thread-safe; :meth:`commit` and :meth:`delete` block on file I/O (call them
    off the event loop)."""

    def __init__(
        self,
        state_dir: str | os.PathLike | None,
        model_identity: str,
        refresh_seconds: float = defaults.CONTEXT_REFRESH_S,
    ) -> None:
        self.model_identity = model_identity
        self.refresh_seconds = refresh_seconds
        self.state_dir = None if state_dir is None else Path(state_dir).resolve()
        self.folder = None if self.state_dir is None else self.state_dir / "contexts"
        self._contexts: dict[str, StoredContext] = {}
        self._foreign: dict[str, str] = {}  # name -> identity of the other model it was made with
        self._damaged: dict[str, str] = {}  # name -> what is wrong with its file
        self._files: dict[str, tuple] = {}  # name -> stat key of the file last read
        self._pending: dict[str, bool] = {}  # name -> replace, for creates in flight in this process
        self._lock = threading.Lock()  # the maps above; never held across file I/O
        self._writer = threading.Lock()  # this process's writers (POSIX locks do not exclude threads)
        self._lock_fd: int | None = None
        self._checked = 0.0
        if self.folder is not None:
            self._open_state_dir()
            with self._write_lock():
                self._remove_leftovers()
                self._scan()

    # ------------------------------------------------------------------ the state directory
    def _open_state_dir(self) -> None:
        """Create the folders and the lock file; a directory this process cannot write is named in the error."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.state_dir / WRITE_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            probe = self.folder / f"{TEMP_PREFIX}probe-{os.getpid()}-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StateDirError(
                f"The state directory {self.state_dir} cannot be used: {exc.strerror or exc} "
                f"({exc.filename or self.state_dir}). The server stores its contexts there: give a directory it can "
                "create and write, or fix the permissions."
            ) from None

    def close(self) -> None:
        """Let go of the lock file."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @contextmanager
    def _write_lock(self):
        """This process's writers one at a time, and across processes by an fcntl lock on the shared volume."""
        with self._writer:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.lockf(self._lock_fd, fcntl.LOCK_UN)

    def _remove_leftovers(self) -> None:
        # Under the write lock no write is in flight in any replica: a temporary file is a killed writer's.
        for path in self.folder.iterdir():
            if path.name.startswith(TEMP_PREFIX):
                logger.warning("Removing %s, left by an interrupted context write.", path.name)
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ reading the folder
    def refresh(self, force: bool = False) -> None:
        """Pick up what changed in the folder (other replicas' writes, a file damaged or removed by hand): at most
        every ``refresh_seconds`` (always with ``force``), a stat of each file and a re-read of those that changed.
        Every file, not only those a server wrote: a replica that started after a file was damaged must not answer
        otherwise than one that kept the context in memory."""
        if self.folder is None:
            return
        now = time.monotonic()
        if not force and now - self._checked < self.refresh_seconds:
            return
        self._checked = now
        if not self._writer.acquire(blocking=False):  # a local write is in flight; the next lookup re-reads
            return
        try:
            self._scan()
        finally:
            self._writer.release()

    def _scan(self) -> None:
        """Re-read the folder: read new and changed files, forget removed ones. Called holding ``_writer``."""
        seen: dict[str, tuple] = {}
        for path in self.folder.iterdir():
            name = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else None
            if name is None or path.name.startswith(TEMP_PREFIX):
                continue
            if not NAME_PATTERN.fullmatch(name) or ".." in name or name == DEFAULT_NAME:
                logger.warning("Ignoring %s: not a valid context name.", path.name)
                continue
            key = _stat_key(path)
            if key is not None:
                seen[name] = key
        for name, key in seen.items():
            if self._files.get(name) != key:
                self._load(name, key)
        with self._lock:
            for name in [n for n in self._files if n not in seen]:
                self._forget(name)

    def _load(self, name: str, key: tuple) -> None:
        path = self.folder / f"{name}{SUFFIX}"
        try:
            context = context_files.read(path, name)
        except ContextDamaged as exc:
            logger.error("%s It is not served; replace or delete it.", exc)
            self._publish(name, key, damaged=str(exc))
            return
        except OSError as exc:
            logger.error("Context file %s cannot be read and is not served: %s", path, exc)
            self._publish(name, key, damaged=f"Context {name!r}: {path} cannot be read ({exc.strerror or exc}).")
            return
        if context.model_identity != self.model_identity:
            logger.warning(
                "Context %r was made by another model (identity %s; this model is %s): it is not served. "
                "Delete or replace it, or serve the model it was made with.",
                name,
                context.model_identity,
                self.model_identity,
            )
            self._publish(name, key, foreign=context.model_identity)
            return
        self._publish(name, key, context=context)

    def _publish(
        self, name: str, key: tuple | None, context: StoredContext | None = None, foreign=None, damaged=None
    ) -> None:
        with self._lock:
            self._forget(name)
            if key is not None:
                self._files[name] = key
            if context is not None:
                self._contexts[name] = context
            if foreign is not None:
                self._foreign[name] = foreign
            if damaged is not None:
                self._damaged[name] = damaged

    def _forget(self, name: str) -> None:
        # called holding _lock
        for table in (self._contexts, self._foreign, self._damaged, self._files):
            table.pop(name, None)

    # ------------------------------------------------------------------ lookups
    def add_model_context(self, context: StoredContext) -> None:
        """Serve the model folder's saved context under :data:`DEFAULT_NAME` (memory only: it lives in the folder)."""
        with self._lock:
            self._contexts[DEFAULT_NAME] = context

    def get(self, name: str, param: str = "context") -> StoredContext:
        """The context ``name``: :class:`ContextNotFound` if there is none, :class:`ContextModelMismatch` if the one
        stored was made by another model, :class:`ContextDamaged` if its file is damaged."""
        check_name(name, param)
        self.refresh()
        with self._lock:
            context, foreign, damaged = self._contexts.get(name), self._foreign.get(name), self._damaged.get(name)
        if context is not None:
            return context
        if damaged is not None:
            raise ContextDamaged(f"{damaged} Replace it (replace=true) or delete it.", param=param)
        if foreign is not None:
            raise ContextModelMismatch(
                f"Context {name!r} was made by another model (identity {foreign}; this server's model is "
                f"{self.model_identity}): its vectors mean nothing to this model. Delete it or create it again "
                "with replace=true.",
                param=param,
            )
        raise ContextNotFound(f"No context named {name!r} (GET /v1/contexts lists them).", param=param)

    def default(self) -> StoredContext | None:
        """The model folder's own context, if it has one."""
        with self._lock:
            return self._contexts.get(DEFAULT_NAME)

    def list(self) -> list[StoredContext]:
        """The contexts that can be served, by name."""
        self.refresh()
        with self._lock:
            return [self._contexts[name] for name in sorted(self._contexts)]

    def damaged(self) -> dict[str, str]:
        """The stored contexts whose file is damaged: name -> what is wrong."""
        with self._lock:
            return dict(self._damaged)

    # ------------------------------------------------------------------ writing
    def reserve(self, name: str, replace: bool) -> None:
        """Claim ``name`` for a create in this process; :class:`ContextExists` when it is stored (without
        ``replace``) or another create of it is in flight here. Another replica's create of the same name is
        found by :meth:`commit`."""
        check_name(name)
        if name == DEFAULT_NAME:
            raise ContextReserved(
                f"{DEFAULT_NAME!r} is reserved for the context saved in the model folder; choose another name.",
                param="name",
            )
        self.refresh()
        with self._lock:
            if name in self._pending:
                raise ContextExists(f"Context {name!r} is being created by another request.", param="name")
            if not replace and (name in self._contexts or name in self._foreign or name in self._damaged):
                raise ContextExists(
                    f'Context {name!r} already exists; send "replace": true to replace it.', param="name"
                )
            self._pending[name] = replace

    def release(self, name: str) -> None:
        """Give back a reservation whose create failed."""
        with self._lock:
            self._pending.pop(name, None)

    def commit(self, context: StoredContext) -> None:
        """Write a reserved context's file (when there is a state directory), then publish it and release the
        name. :class:`ContextExists` when, without replace, another replica stored the name meanwhile."""
        try:
            with self._lock:
                replace = self._pending.get(context.name, False)
            if self.folder is None:
                self._publish(context.name, None, context=context)
                return
            with self._write_lock():
                final = self.folder / f"{context.name}{SUFFIX}"
                if not replace and final.exists():
                    raise ContextExists(
                        f'Context {context.name!r} was created meanwhile (by another replica); send "replace": true '
                        "to replace it.",
                        param="name",
                    )
                context_files.write(self.folder, context)
                self._publish(context.name, _stat_key(final), context=context)
        finally:
            self.release(context.name)

    def delete(self, name: str) -> None:
        """Remove a stored context, whichever replica made it (its file first, so no replica serves a context
        whose file is gone after its next refresh)."""
        check_name(name)
        if name == DEFAULT_NAME:
            raise ContextReserved(f"{DEFAULT_NAME!r} is the model folder's own context and cannot be deleted.", "name")
        with self._lock:
            if name in self._pending:
                raise ContextBusy(f"Context {name!r} is being created; delete it afterwards.", param="name")
            known = name in self._contexts or name in self._foreign or name in self._damaged
        if self.folder is None:
            if not known:
                raise ContextNotFound(f"No context named {name!r}.", param="name")
            with self._lock:
                self._forget(name)
            return
        with self._write_lock():
            path = self.folder / f"{name}{SUFFIX}"
            if not path.exists():
                with self._lock:
                    self._forget(name)
                raise ContextNotFound(f"No context named {name!r}.", param="name")
            path.unlink()
            fsync_dir(self.folder)
            with self._lock:
                self._forget(name)
