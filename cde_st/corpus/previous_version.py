"""The live version of an embedding folder as an update sees it: each document's content hash, shard and row, by
id, and the stored embeddings of unchanged documents, copied into the new version instead of being embedded again.

The ids go into a SQLite table in the folder (keyed by id, as :class:`~cde_st.corpus.duplicate_ids.DuplicateIds`
keeps the ids of a scan), so memory stays bounded whatever the corpus size; only the ``id`` and ``content_hash``
columns of the shards are read to fill it. Embeddings are read a shard at a time, the last few kept, which suits
the usual update: rows keep their order, so new shard ``k`` copies from live shards ``k`` and ``k + 1``.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from cde_st.corpus.shards import read_shard, read_shard_keys

__all__ = ["PREVIOUS_TABLE", "PreviousVersion"]

#: The table of the live version's ids (in the folder while an update runs, removed after).
PREVIOUS_TABLE = ".previous.sqlite"
#: Live shards whose embeddings are kept in memory at once.
_CACHED_SHARDS = 3
#: SQLite's limit on the parameters of one statement is 999 in older builds.
_LOOKUP_CHUNK = 900


class PreviousVersion:
    """``with PreviousVersion(folder, manifest) as previous:`` the rows of the version ``manifest`` describes."""

    def __init__(self, folder: str | Path, manifest: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.shards = {entry["index"]: entry for entry in manifest["shards"]}
        self.path = self.folder / PREVIOUS_TABLE
        self.path.unlink(missing_ok=True)
        self._db = sqlite3.connect(self.path)
        # Scratch space for one update: no journal and no fsync (a crash just builds it again).
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE rows (id TEXT PRIMARY KEY, hash BLOB, shard INTEGER, row INTEGER) WITHOUT ROWID")
        self.rows = 0
        for entry in manifest["shards"]:
            if entry["rows"]:
                ids, hashes = read_shard_keys(self.folder / entry["file"])
                with self._db:
                    self._db.executemany(
                        "INSERT INTO rows VALUES (?, ?, ?, ?)",
                        ((i, h, entry["index"], r) for r, (i, h) in enumerate(zip(ids, hashes))),
                    )
                self.rows += len(ids)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def lookup(self, ids: list[str]) -> list[tuple[bytes | None, int, int] | None]:
        """For each id: (content hash, live shard index, row in it), or None when the live version lacks it."""
        found: dict[str, tuple] = {}
        for start in range(0, len(ids), _LOOKUP_CHUNK):
            chunk = ids[start : start + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            for doc_id, digest, shard, row in self._db.execute(
                f"SELECT id, hash, shard, row FROM rows WHERE id IN ({marks})", chunk
            ):
                found[doc_id] = (digest, shard, row)
        return [found.get(doc_id) for doc_id in ids]

    def whole_shard(self, index: int, found: list[tuple | None]) -> dict | None:
        """The live entry of shard ``index`` when ``found`` (a lookup of a new shard's ids) is exactly its rows, in
        order: that shard can be kept as it is."""
        entry = self.shards.get(index)
        if entry is None or entry["rows"] != len(found):
            return None
        if all(f is not None and f[1] == index and f[2] == row for row, f in enumerate(found)):
            return dict(entry)
        return None

    def embeddings(self, index: int, rows: list[int]) -> np.ndarray:
        """The stored embeddings (float32; int8 rescaled) of ``rows`` of live shard ``index``."""
        if index not in self._cache:
            entry = self.shards[index]
            _, vectors = read_shard(self.folder / entry["file"], entry["sha256"])
            self._cache[index] = vectors
            while len(self._cache) > _CACHED_SHARDS:
                self._cache.popitem(last=False)
        self._cache.move_to_end(index)
        return self._cache[index][rows]

    def close(self) -> None:
        """Close and delete the table."""
        self._db.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> PreviousVersion:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
