"""Writing a model folder so that concurrent processes (the ranks of one torchrun launch) never see half of it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_folder_atomically(folder: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(staging)`` on a fresh folder beside ``folder``, then rename it into place. When another process
    got there first (same content by construction), its folder is kept and ours dropped."""
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
