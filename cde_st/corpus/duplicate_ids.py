"""Finding repeated document ids in a corpus of any size, with bounded memory.

A set of ten million ids in Python takes gigabytes; the ids are kept instead in a SQLite table on disk (a B-tree
keyed by id, in the job's folder), so memory stays at SQLite's page cache (a few MiB) whatever the corpus size, and
each id is checked in one indexed insert. The table also keeps where each id was first seen, so an error names
both lines.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["DuplicateIds"]


class DuplicateIds:
    """The ids seen so far, in a SQLite file at ``path`` (created fresh; removed by :meth:`close`).

    Example:
        >>> seen = DuplicateIds(tmp_path / "ids.sqlite")  # doctest: +SKIP
        >>> seen.add_batch(["a", "b", "a"], ["f:1", "f:2", "f:3"])  # doctest: +SKIP
        [(2, 'f:1')]
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.unlink(missing_ok=True)
        self._db = sqlite3.connect(self.path)
        # The table is scratch space for one pass: no journal and no fsync (a crash just reruns the pass).
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE ids (id TEXT PRIMARY KEY, place TEXT NOT NULL) WITHOUT ROWID")

    def add_batch(self, ids: list[str], wheres: list[str]) -> list[tuple[int, str]]:
        """Record ``ids`` (``wheres[i]`` names where ``ids[i]`` is); return ``(i, where first seen)`` for each id
        already recorded (earlier, or earlier in this batch). Repeats are not recorded again."""
        try:
            with self._db:
                self._db.executemany("INSERT INTO ids VALUES (?, ?)", zip(ids, wheres))
            return []
        except sqlite3.IntegrityError:
            pass  # the transaction was rolled back: redo the batch one id at a time to find the repeats
        repeats = []
        with self._db:
            for i, (doc_id, where) in enumerate(zip(ids, wheres)):
                if self._db.execute("INSERT OR IGNORE INTO ids VALUES (?, ?)", (doc_id, where)).rowcount == 0:
                    first = self._db.execute("SELECT place FROM ids WHERE id = ?", (doc_id,)).fetchone()[0]
                    repeats.append((i, first))
        return repeats

    def close(self) -> None:
        """Close and delete the table."""
        self._db.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> DuplicateIds:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
