"""The output folder of an embedding job: created or checked, locked while the job writes it, and left with only
the job's own files.

A folder is taken when it is new, empty, or a ``cde-st-embed`` folder: one with a manifest, or (a job stopped
before its first manifest) one holding nothing but what a job writes before it (the lock, the id table, temporary
files, its context file). Any other folder is refused, naming what it holds: a job writes ``context.safetensors``,
``index.faiss`` and ``shard-*.parquet`` and removes its temporary files, which must never touch files it did not
write. For the same reason the leftovers removed are only the job's own temporary files (:func:`is_own_temporary`).

The lock (``.lock``, an exclusive ``flock``) keeps two jobs out of one folder; the job removes it when it ends,
finished or failed, and a folder the job created and left empty (a failed first run) is removed too.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from types import TracebackType

from cde_st.corpus.corpus_context import CONTEXT_FILE, CORPUS_METADATA_KEY
from cde_st.corpus.drift import REFERENCE_FILE, REFERENCE_METADATA_KEY
from cde_st.corpus.manifest import MANIFEST_FILE
from cde_st.corpus.previous_version import PREVIOUS_TABLE
from cde_st.corpus.scan import IDS_TABLE
from cde_st.corpus.shards import TEMP_PREFIX
from cde_st.corpus.versions import PENDING_FILE, VERSION_FILE

__all__ = ["LOCK_FILE", "FolderBusyError", "OutputFolder", "is_own_temporary"]

LOCK_FILE = ".lock"
_OWN_FILES = "|".join(re.escape(name) for name in (MANIFEST_FILE, PENDING_FILE))
# A temporary name of write_atomically: the prefix, the final name, then the writer's process id (and, since
# cde_st.atomic_files, its thread id and a random token).
_OWN_TEMPORARY = re.compile(
    rf"{re.escape(TEMP_PREFIX)}(?:{_OWN_FILES}|{VERSION_FILE.pattern})(?:\.\d+|-\d+-\d+-[0-9a-f]+)"
)
#: Files a job writes before its first manifest, recognised by the metadata key they carry.
_MARKED = {CONTEXT_FILE: CORPUS_METADATA_KEY, REFERENCE_FILE: REFERENCE_METADATA_KEY}
_SHOWN = 5


class FolderBusyError(RuntimeError):
    """Another job holds the output folder's lock."""


def is_own_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary file a job writes (and may remove when a crash left it)."""
    return _OWN_TEMPORARY.fullmatch(name) is not None


def _is_marked(path: Path) -> bool:
    """Whether ``path`` is a context or drift reference file a job wrote (its metadata says so)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return _MARKED[path.name] in (f.metadata() or {})
    except (OSError, SafetensorError, ValueError):
        return False


def _foreign_names(folder: Path) -> list[str]:
    """What ``folder`` holds that no job wrote (empty for a job's folder)."""
    if (folder / MANIFEST_FILE).is_file():
        return []
    own = {LOCK_FILE, IDS_TABLE, PREVIOUS_TABLE}
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if not (entry.name in own or is_own_temporary(entry.name) or (entry.name in _MARKED and _is_marked(entry)))
    )


def _writable(folder: Path, err: OSError) -> OSError:
    return type(err)(
        f"Cannot write in the output folder {folder} ({err.strerror or err}); give a folder you can write to."
    )


class OutputFolder:
    """``with OutputFolder(path) as folder:`` the checked, created and locked output folder of one job (see the
    module docstring); leaving the block removes the lock, and the folder itself if this job created it and
    failed before writing anything in it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.created = False
        self._lock = None

    def __enter__(self) -> OutputFolder:
        folder = self.path
        if folder.exists() and not folder.is_dir():
            raise FileExistsError(
                f"The output folder {folder} is a file; give a folder (new, empty, or one cde-st-embed wrote)."
            )
        self.created = not folder.exists()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except NotADirectoryError:
            raise NotADirectoryError(f"Cannot create the output folder {folder}: part of its path is a file.") from None
        except OSError as err:
            raise _writable(folder, err) from None
        foreign = _foreign_names(folder)
        if foreign:
            more = f" and {len(foreign) - _SHOWN} more" if len(foreign) > _SHOWN else ""
            raise FileExistsError(
                f"The output folder {folder} is not empty and is not a cde-st-embed folder (no {MANIFEST_FILE}): it "
                f"holds {', '.join(foreign[:_SHOWN])}{more}. Give a new or empty folder; cde-st-embed writes "
                "shards, an index and a context there and would overwrite files of those names."
            )
        try:
            self._lock = self._hold()
        except OSError:
            if self.created:
                folder.rmdir()
            raise
        return self

    def _hold(self):
        path = self.path / LOCK_FILE
        while True:
            try:
                handle = open(path, "a+")  # noqa: SIM115 (held for the job)
            except OSError as err:
                raise _writable(self.path, err) from None
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                raise FolderBusyError(
                    f"Another cde-st-embed job is writing {self.path}; wait for it or use another --out."
                ) from None
            try:  # the holder before us removes the file as it ends: a lock on a removed file guards nothing
                if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                    return handle
            except FileNotFoundError:
                pass
            handle.close()

    def remove_leftovers(self) -> None:
        """Remove the temporary files a crashed job left (the job's own names only)."""
        for entry in self.path.iterdir():
            if is_own_temporary(entry.name):
                entry.unlink(missing_ok=True)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        # Removed while still held: a job that opened it meanwhile finds another inode there and takes that one.
        (self.path / LOCK_FILE).unlink(missing_ok=True)
        self._lock.close()
        if exc_type is not None and self.created and not any(self.path.iterdir()):
            self.path.rmdir()
