"""Writing files and folders atomically: a reader, a concurrent writer or a process killed at any point sees the old
version or the new one, never half of one.

The new version is written beside its place (a temporary name in the same folder, so the rename stays on one file
system) and renamed over it with ``os.replace``. With ``fsync`` the file is flushed to disk before the rename and
the folder after it, so the rename also survives a power loss; without, it survives a crash of the process only
(enough for files a run rewrites or recomputes). Temporary names start with :data:`TEMP_PREFIX`, so a folder's owner
can recognise what a killed writer left. What a write leaves gets the mode a plain ``open()`` would give it (``0o666``,
folders ``0o777``, less the umask), so a model saved by one user can be read by the others it is shared with
(``tempfile`` makes ``0o600`` files and ``0o700`` folders, and safetensors writes through it).

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

__all__ = ["TEMP_PREFIX", "fsync_dir", "umask", "write_atomically", "write_folder_atomically", "write_path_atomically"]

#: How the temporary files of :func:`write_atomically` begin.
TEMP_PREFIX = ".tmp-"


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it (setting and restoring it would race with
    other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
    return _replace(path, lambda temp: _write_file(temp, data, fsync), fsync, before_replace)


def write_path_atomically(
    path: str | os.PathLike,
    write: Callable[[str], None],
    *,
    fsync: bool = True,
    before_replace: Callable[[], None] | None = None,
) -> Path:
    """:func:`write_atomically` for a writer that opens the file itself: ``write(temporary_path)`` (safetensors'
    ``save_file``). The file then gets the umask's mode whatever mode the writer gave it. Returns ``path``."""

    def written(temp: Path) -> None:
        write(str(temp))
        os.chmod(temp, 0o666 & ~umask())
        if fsync:
            with open(temp, "rb") as f:
                os.fsync(f.fileno())

    return _replace(path, written, fsync, before_replace)


def _write_file(temp: Path, data: bytes | str | Callable[[BinaryIO], None], fsync: bool) -> None:
    with open(temp, "xb") as f:  # 0o666 less the umask
        if callable(data):
            data(f)
        else:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def _replace(
    path: str | os.PathLike, write: Callable[[Path], None], fsync: bool, before_replace: Callable[[], None] | None
) -> Path:
    path = Path(path)
    # Unique per process, thread and call: concurrent writers of one path (ranks, replicas) never share a temp file.
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}")
    try:
        write(temp)
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
        _give_umask_modes(staging)
        try:
            os.replace(staging, folder)
        except OSError:
            if not (folder / "config.json").exists():  # not a concurrent writer that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _give_umask_modes(folder: Path) -> None:
    """The modes a plain ``open()`` / ``mkdir()`` would have given: mkdtemp's 0o700 would keep every other user out
    of the folder, and writers through ``tempfile`` (safetensors) leave 0o600 files."""
    mask = umask()
    os.chmod(folder, 0o777 & ~mask)
    for root, folders, files in os.walk(folder):
        for names, mode in ((folders, 0o777), (files, 0o666)):
            for path in (os.path.join(root, name) for name in names):
                if not os.path.islink(path):
                    os.chmod(path, mode & ~mask)
