"""Writing files and folders atomically: a reader, a concurrent writer or a process killed at any point sees the old
version or the new one, never half of one.

The new version is written beside its place (a temporary name in the same folder, so the rename stays on one file
system) and renamed over it with ``os.replace``. With ``fsync`` the file is flushed to disk before the rename and
the folder after it, so the rename also survives a power loss; without, it survives a crash of the process only
(enough for files a run rewrites or recomputes). Temporary names start with :data:`TEMP_PREFIX`, so a folder's owner
can recognise what a killed writer left.

>>> write_atomically(folder / "manifest.json", json.dumps(manifest))  # doctest: +SKIP
>>> write_atomically(path, lambda f: np.savez(f, labels=labels), fsync=False)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["TEMP_PREFIX", "fsync_dir", "write_atomically", "write_folder_atomically"]

#: How the temporary files of :func:`write_atomically` begin.
TEMP_PREFIX = ".tmp-"


def fsync_dir(folder: str | os.PathLike) -> None:
    """fsync a folder, so that a rename or unlink in it survives a power loss."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(
    path: str | os.PathLike,
    data: bytes | str | Callable[[BinaryIO], None],
    *,
    fsync: bool = True,
    before_replace: Callable[[], None] | None = None,
) -> Path:
    """Replace ``path`` by ``data`` at once: bytes, text (written as UTF-8) or a function that writes the file
    given the open binary file. ``fsync``: flush the file before the rename and its folder after it (durable over a
    power loss). ``before_replace`` runs once the temporary file is complete, just before the rename. On any error
    the temporary file is removed and ``path`` is left as it was. Returns ``path``."""
    path = Path(path)
    # Unique per process, thread and call: concurrent writers of one path (ranks, replicas) never share a temp file.
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}")
    try:
        with open(temp, "xb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(path.parent)
    return path


def write_folder_atomically(folder: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(staging)`` on a fresh folder beside ``folder``, then rename it into place, so concurrent
    processes (the ranks of one torchrun launch) never see half of it. When another process got there first (same
    content by construction), its folder is kept and ours dropped."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{folder.name}.tmp-"))
    try:
        write(staging)
        try:
            os.replace(staging, folder)
        except OSError:
            if not (folder / "config.json").exists():  # not a concurrent writer that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
