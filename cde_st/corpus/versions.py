"""Versions of an embedding folder: an update or a new context writes a whole new version beside the live one, and
the manifest, rewritten last and atomically, switches readers from one to the other.

Version (generation) ``g`` names its files with ``.v{g}`` before the suffix (``shard-000003.v2.parquet``,
``context.v2.safetensors``, ``index.v2.faiss``); the first run, generation 0, has the plain names. A version keeps
the files of the one before it that it shares (a shard whose rows did not change), so the manifest, not the file
names, says which files are live. While a new version is being written its progress is kept in
:data:`PENDING_FILE`, so a killed update resumes where it stopped; once the manifest has switched, the files neither
version lists are removed (:func:`remove_superseded`), by the switching run or, when that one was killed, by the next.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cde_st.corpus.corpus_context import CONTEXT_FILE
from cde_st.corpus.shards import write_atomically

__all__ = [
    "PENDING_FILE",
    "VERSION_FILE",
    "live_files",
    "read_pending",
    "remove_superseded",
    "versioned_name",
    "write_pending",
]

#: The progress of a version being written (removed once the manifest has switched to it).
PENDING_FILE = "update-pending.json"
#: The names of a job's versioned files (shards, context, drift reference, index and its ids), any generation.
VERSION_FILE = re.compile(
    r"(?:shard-\d{6,}|context|drift_reference|index|index_ids)(?:\.v\d+)?\.(?:parquet|safetensors|faiss)"
)


def versioned_name(name: str, generation: int) -> str:
    """``name`` as generation ``generation`` writes it (unchanged for generation 0)."""
    if generation == 0:
        return name
    stem, suffix = name.split(".", 1)
    return f"{stem}.v{generation}.{suffix}"


def live_files(manifest: dict[str, Any] | None) -> set[str]:
    """The files a manifest (or a pending version's record) refers to."""
    if not manifest:
        return set()
    names = {entry["file"] for entry in manifest.get("shards", [])}
    if manifest.get("context"):
        names.add(manifest.get("context_file", CONTEXT_FILE))
    reference = (manifest.get("drift") or {}).get("reference_file")
    if reference:
        names.add(reference)
    index = manifest.get("index") or {}
    names.update(index[key] for key in ("file", "ids_file") if index.get(key))
    return names


def read_pending(folder: str | Path) -> dict[str, Any] | None:
    """The record of a version being written in ``folder`` (None when there is none or it cannot be read: the
    version is then written from the start)."""
    path = Path(folder) / PENDING_FILE
    try:
        pending = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return pending if isinstance(pending, dict) else None


def write_pending(folder: str | Path, pending: dict[str, Any]) -> None:
    """Record the progress of the version being written, atomically."""
    write_atomically(Path(folder) / PENDING_FILE, json.dumps(pending, indent=1, sort_keys=True).encode("utf-8"))


def remove_superseded(folder: str | Path, keep: set[str]) -> list[str]:
    """Remove the versioned files of ``folder`` that are not in ``keep`` (the live version's files and those of a
    version being written); return their names. Only names a job writes (:data:`VERSION_FILE`) are touched."""
    removed = []
    for entry in Path(folder).iterdir():
        if VERSION_FILE.fullmatch(entry.name) and entry.name not in keep and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return sorted(removed)
