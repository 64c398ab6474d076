"""What a store must change to be level with an embedded folder: the rows of new ids, the rows whose vector or text
changed, and the ids the folder no longer has. Compared by id and value, a shard at a time (the store's rows of that
shard's ids, then all the store's ids), so memory holds one shard, not the store; a store already level with the
folder changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cde_st.vector_stores.embedded_folder import FolderRows

__all__ = ["FolderChanges", "StoreRows"]


@dataclass
class StoreRows:
    """What a store holds of some ids: ``index`` (id -> row), ``vectors`` (n, d) and ``texts`` (None: the store
    keeps none)."""

    index: Mapping[str, int]
    vectors: np.ndarray
    texts: Sequence[str | None] | None = None


@dataclass
class FolderChanges:
    """Counts of ``added``, ``changed``, ``deleted`` and ``unchanged`` rows, gathered shard by shard
    (:meth:`to_write`), then :meth:`deleted_ids`.

    ``tolerance``: 0 compares vectors bit for bit; Chroma's cosine space hands back a vector changed by float32
    rounding (2.4e-7 at most, measured on unit-variance values), so it compares to within ``tolerance`` times the
    vector's norm."""

    tolerance: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: {"added": 0, "changed": 0, "deleted": 0, "unchanged": 0})
    seen: set[str] = field(default_factory=set)

    def to_write(self, rows: FolderRows, store: StoreRows) -> list[int]:
        """Positions in ``rows`` (one shard of the folder) of the rows the store lacks or holds otherwise."""
        picked = []
        for n, doc_id in enumerate(rows.ids):
            self.seen.add(doc_id)
            row = store.index.get(doc_id)
            if row is None:
                self.counts["added"] += 1
                picked.append(n)
            elif not self._same(store.vectors[row], rows.vectors[n]) or (
                store.texts is not None and rows.texts is not None and store.texts[row] != rows.texts[n]
            ):
                self.counts["changed"] += 1
                picked.append(n)
            else:
                self.counts["unchanged"] += 1
        return picked

    def _same(self, held: np.ndarray, vector: np.ndarray) -> bool:
        if not self.tolerance:
            return np.array_equal(held, vector)
        return float(np.abs(held - vector).max()) <= self.tolerance * max(float(np.linalg.norm(vector)), 1e-12)

    def deleted_ids(self, ids: Iterable[str]) -> list[str]:
        """Of the store's ``ids`` (all of them), those the folder does not have (call after every shard went through
        :meth:`to_write`)."""
        gone = [doc_id for doc_id in ids if doc_id not in self.seen]
        self.counts["deleted"] = len(gone)
        return gone
